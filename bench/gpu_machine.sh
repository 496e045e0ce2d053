#!/usr/bin/env bash
# Run adaptune's CUDA checks on a lent GPU machine (the device tool's nvidia-h100-x1 / nvidia-h200).
#
# That machine has Python 3.12 with torch, numpy, scikit-learn, pytest, cuda-bindings ... but no
# TVM, TVM-FFI or xgboost, and no package registry; a call carries at most 64 MiB and the TVM wheel
# is 100.5 MB.  So the wheels travel as cp312 files, the TVM one split in two parts carried by two
# calls in a row (the machine stays warm ~30 s after a call; files outside the repo survive), and
# are joined and installed with pip --no-index there.  Steps:
#
#   here:   bash bench/gpu_machine.sh prepare REPO   # REPO: the checkout the device tool sends
#                                                    # (fills REPO/.gpu, ignored via .git/info/exclude)
#   run 1:  carry [".gpu/w1", ".gpu/code"]  command: bash .gpu/code/bench/gpu_machine.sh stage1
#   run 2:  at once, carry [".gpu/w2", ".gpu/code"]
#           command: bash .gpu/code/bench/gpu_machine.sh stage2 [STEP ...]
#   run 3+: at once (within ~30 s: the install lives in /tmp), carry [".gpu/code"]
#           command: bash .gpu/code/bench/gpu_machine.sh run STEP ...
#
# stage2 installs the wheels into /tmp/site, prints the GPU and checks that TVM compiles CUDA there,
# then runs the STEPs (default: paper); `run` runs STEPs on that install.  STEPs run one after the
# other (PARALLEL=1: side by side; STEP@CPUS, e.g. paper@0-9 e2e@10-15, runs that step on those cores
# alone, TVM_NUM_THREADS to match, beside the other pinned steps); every kernel run and model timing holds one lock file
# (ADAPTUNE_DEVICE_LOCK), so GPU timings never overlap while builds and searches do:
#   tests   tests/test_cuda.py (its GPU tests run there instead of skipping)
#   tune-op adaptune tune-op L8 --target cuda --trials 16
#   paper   bench/paper.py --target cuda --layers L1 L2 L7 L8 --trials 128 --strategies rl+as --jobs 8
#           (PAPER_ARGS="--layers L1 L8 --trials 128 --strategies rl+as --jobs 4 --seed 1" replaces all but --target)
#   e2e     bench/e2e.py --target cuda --models resnet18 --trials E2E_TRIALS (default 160)
# Each step's log, the paper's plots and e2e.json go to $OUT; STEP_TIMEOUT (s, default 540) bounds each.
# paper resumes: a later `run paper` on the same warm machine tunes only the runs not yet finished.
# ResNet-18 end to end passed its target on 2026-11-27, the paper's seed-0 table ran in 391 s on
# 2026-11-28 (docs/cuda.md); what is left is more seeds: run 1, then
# `stage2 paper` with PAPER_ARGS="--layers L1 L2 L7 L8 --trials 128 --strategies rl+as --jobs 8 --seed 1".
set -euo pipefail
shopt -s extglob

TVM=apache-tvm==0.27.0.post1
WHEELS=(apache-tvm-ffi==0.1.14.post1 xgboost-cpu==3.2.0)   # the other needs are on the machine
STASH=/tmp/adaptune-whl

case "${1:-}" in
prepare)
    repo=$(cd "${2:?usage: gpu_machine.sh prepare REPO_THE_DEVICE_TOOL_SENDS}" && pwd)
    here=$(cd "$(dirname "$0")/.." && pwd)
    exclude=$(git -C "$repo" rev-parse --git-path info/exclude)
    [[ $exclude = /* ]] || exclude=$repo/$exclude
    grep -qxF /.gpu/ "$exclude" 2>/dev/null || echo /.gpu/ >>"$exclude"
    g=$repo/.gpu
    rm -rf "$g/w1" "$g/w2" "$g/code"
    mkdir -p "$g/dl" "$g/w1" "$g/w2" "$g/code"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$g/dl" "$TVM" "${WHEELS[@]}"
    tvm_whl=$(ls "$g"/dl/apache_tvm-*.whl)
    basename "$tvm_whl" >"$g/w1/tvm.name"
    (cd "$g/dl" && sha256sum "$(basename "$tvm_whl")") >"$g/w1/tvm.sha256"
    split -n 2 -d "$tvm_whl" "$g/w1/tvm.part"          # tvm.part00, tvm.part01
    mv "$g/w1/tvm.part01" "$g/w2/"
    for w in "${WHEELS[@]}"; do cp "$g"/dl/"$(echo "${w%%==*}" | tr - _)"-*.whl "$g/w1/"; done
    (cd "$here" && tar --exclude=__pycache__ --exclude='*.pyc' -cf - src tests bench pyproject.toml) | tar -xf - -C "$g/code"
    du -sh "$g/w1" "$g/w2" "$g/code"
    ;;
stage1)   # there, call 1: keep part 1 and the small wheels outside the repo
    mkdir -p "$STASH"
    cp .gpu/w1/* "$STASH/"
    nvidia-smi -L
    python3 --version
    lscpu | grep -E '^(CPU\(s\)|On-line|Thread|Core|Socket|Model name)'
    command -v taskset
    ls -la "$STASH"
    ;;
stage2|run)   # there: stage2 = call 2 (within ~30 s of call 1); run = any later call while warm
    mode=$1
    shift
    steps=${*:-paper}
    out=${OUT:-/tmp}
    if [[ $mode = stage2 ]]; then
        cp .gpu/w2/* "$STASH/"
        name=$(cat "$STASH/tvm.name")
        cat "$STASH"/tvm.part0* >"$STASH/$name"
        (cd "$STASH" && sha256sum -c tvm.sha256)
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            "$STASH"/*.whl
    fi
    export PYTHONPATH=/tmp/site:$PWD/.gpu/code/src PYTHONUNBUFFERED=1
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c "import tvm; d = tvm.cuda(0); print('TVM', tvm.__version__, 'sees', d.exist, d.device_name, 'sm', d.compute_version)"
    # TVM compiles CUDA with NVRTC through cuda-bindings; fall back to nvcc if that fails there
    probe='import tvm; from tvm import te; A = te.placeholder((64,), name="A"); B = te.compute((64,), lambda i: A[i] + 1, name="B"); s = tvm.s_tir.Schedule(te.create_prim_func([A, B])); b = s.get_sblock("B"); s.bind(s.get_loops(b)[0], "threadIdx.x"); tvm.compile(s.mod, target="cuda"); print("CUDA compile OK")'
    [[ $mode = run ]] || python3 -c "$probe" || { export TVM_CUDA_COMPILE_MODE=nvcc; echo "NVRTC failed: TVM_CUDA_COMPILE_MODE=nvcc"; python3 -c "$probe"; }
    cd .gpu/code
    export ADAPTUNE_DEVICE_LOCK=/tmp/adaptune-device.lock
    limit=${STEP_TIMEOUT:-540}
    set +e
    pids=()
    for spec in $steps; do
        step=${spec%%@*}
        cpus=${spec#"$step"}; cpus=${cpus#@}
        case $step in
        tests)   cmd=(python3 -m pytest -q -rs -s tests/test_cuda.py) ;;
        tune-op) cmd=(python3 -m adaptune.cli tune-op L8 --target cuda --trials 16 --work-dir /tmp/l8-cuda) ;;
        paper)   # PAPER_ARGS replaces the layers, trials, strategies, jobs (and adds e.g. --seed 1)
                 # shellcheck disable=SC2086
                 cmd=(python3 bench/paper.py --target cuda ${PAPER_ARGS:---layers L1 L2 L7 L8 --trials 128
                      --strategies rl+as --jobs 8} --out /tmp/paper --resume) ;;
        e2e)     cmd=(python3 bench/e2e.py --target cuda --models resnet18 --trials "${E2E_TRIALS:-160}"
                      --rounds 5 --out /tmp/e2e) ;;
        *)       echo "unknown step $step"; continue ;;
        esac
        if [[ $cpus ]]; then   # STEP@CPUS: on those cores only, beside the other pinned steps
            cmd=(env TVM_NUM_THREADS="$(taskset -c "$cpus" nproc)" taskset -c "$cpus" "${cmd[@]}")
        fi
        echo "$(date +%T) $step: ${cmd[*]}"
        if [[ ${PARALLEL:-0} = 1 || $cpus ]]; then
            (timeout "$limit" "${cmd[@]}" >"$out/$step.log" 2>&1; echo "$step exit: $?" >>"$out/$step.log") &
            pids+=($!)
        else
            timeout "$limit" "${cmd[@]}" >"$out/$step.log" 2>&1; echo "$step exit: $?" >>"$out/$step.log"
        fi
    done
    [[ ${#pids[@]} = 0 ]] || wait "${pids[@]}"
    for step in ${steps//@+([0-9,-])/}; do echo "=== $step"; grep -v "INFO\|DEBUG\|^ \|^--\|^Total\|^$" "$out/$step.log" | tail -n 70; done
    cp /tmp/paper/L*.png /tmp/e2e/e2e.json "$out/" 2>/dev/null || true   # whichever the steps made
    ;;
*)
    sed -n '2,/^set /{/^set /d;p}' "$0"
    exit 2
    ;;
esac
