"""``adaptune tune-op`` and ``adaptune workloads``: one operator, tuned and checked against numpy."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from .common import UsageError, fail, make_measurer, progress_bar, run_guarded


def check_numerics(workload, sch, target) -> tuple[bool, float]:
    """Run the tuned kernel on random inputs and compare with the numpy reference:
    (passes, ``verify.relative_error``)."""
    from .._tvm import tvm
    from ..measure.pipeline import compile_module
    from ..measure.target import device
    from ..measure.verify import TOLERANCE, relative_error

    inputs = workload.random_inputs()
    ref = workload.reference(inputs)
    dev = device(target)
    ex = compile_module(sch.mod, target)
    args = [tvm.runtime.tensor(x, dev) for x in inputs] + [tvm.runtime.empty(ref.shape, "float32", dev)]
    ex["main"](*args)
    err = relative_error(args[-1].numpy(), ref)
    return err <= TOLERANCE, err


def cmd_tune_op(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from ..measure.workdir import WorkDir, WorkDirError
    from ..measure.target import TargetError, check_runnable, parse_target
    from ..tuner import tune_tir
    from ..model.workloads import DEFAULT_WORKLOAD, WorkloadError, get_workload

    try:
        workload = get_workload(args.workload or DEFAULT_WORKLOAD)
        target = parse_target(args.target)
    except (WorkloadError, TargetError) as e:
        return fail(str(e))
    if target.kind.name not in ("llvm", "cuda"):
        return fail(f"tune-op tunes for a CPU (llvm) or an NVIDIA GPU (cuda); target kind {target.kind.name!r} "
                     "is not supported")
    try:
        check_runnable(target, remote=bool(args.rpc))
    except TargetError as e:
        return fail(f"{e}; measure on a remote one with --rpc HOST:PORT --device-key KEY")
    if args.json is not None and not Path(args.json).resolve().parent.is_dir():
        return fail(f"--json: folder {Path(args.json).parent} does not exist")
    work_dir = Path(args.work_dir or f"runs/{workload.label.replace(':', '_')}-{args.strategy}-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        WorkDir(work_dir).check_operator(args.resume)
        measurer = make_measurer(args, target)
    except (WorkDirError, UsageError) as e:
        return fail(str(e))

    console = Console(stderr=False)
    console.print(f"[bold]adaptune[/] tune-op {workload.label}  ({workload.flops / 1e6:.1f} MFLOP)  "
                  f"strategy={args.strategy}  trials={args.trials}  target={target}")
    with progress_bar() as progress:
        task = progress.add_task("tuning", total=args.trials, best="best: -")

        def on_progress(done, total, best):
            gf = f"best {best * 1e3:.3f} ms ({workload.flops / best / 1e9:.1f} GFLOPS)" if best else "best: -"
            progress.update(task, completed=done, best=gf)

        result, code = run_guarded(console, work_dir, f"adaptune tune-op {workload.label} --work-dir {work_dir} --resume",
                                   lambda: tune_tir(workload.mod(), target, strategy=args.strategy, trials=args.trials,
                                                    work_dir=work_dir, resume=args.resume, seed=args.seed,
                                                    batch_size=args.batch_size, measurer=measurer,
                                                    on_progress=on_progress, label=workload.label,
                                                    spaces=args.spaces))
        if result is None:
            return code
    table = Table(title=f"{workload.label} with {args.strategy}", show_header=False)
    table.add_row("work dir", str(work_dir))
    table.add_row("trials measured", f"{result.trials} ({result.new_trials} in this run)")
    table.add_row("invalid configs skipped", str(result.invalid))
    table.add_row("failed candidates", ", ".join(f"{k}: {v}" for k, v in sorted(result.failures.items())) or "0")
    table.add_row("wall time", f"{result.wall_time:.1f} s (search overhead {result.overhead:.1f} s)")
    if result.best_latency is None:
        console.print(table)
        counts = ", ".join(f"{k} {v}" for k, v in sorted(result.failures.items())) or "none measured"
        print(f"adaptune: error: no candidate could be measured ({counts}); last error: {result.last_error}",
              file=sys.stderr)
        return 1
    ok, err = check_numerics(workload, result.best_schedule, target)
    table.add_row("best latency", f"{result.best_latency * 1e3:.4f} ms")
    table.add_row("best GFLOPS", f"{workload.flops / result.best_latency / 1e9:.1f}")
    table.add_row("numerical check vs numpy", f"{'PASS' if ok else 'FAIL'} (max rel. error {err:.2e})")
    onednn = onednn_latency(workload, target)
    if onednn is not None:
        table.add_row("oneDNN, same shape", f"{onednn * 1e3:.4f} ms ({workload.flops / onednn / 1e9:.1f} GFLOPS; "
                      f"tuned kernel {onednn / result.best_latency:.2f}x its speed)")
    console.print(table)
    if args.json:
        from ..measure.workdir import write_json
        write_json(args.json, {"workload": workload.label, "best_latency_ms": result.best_latency * 1e3,
                               "gflops": workload.flops / result.best_latency / 1e9,
                               "onednn_latency_ms": None if onednn is None else onednn * 1e3,
                               "trials": result.trials, "numerics_ok": ok})
    return 0 if ok else 1


def onednn_latency(workload, target) -> float | None:
    """Seconds per call of oneDNN's fused call on the workload's shape (pre-packed weights, NHWC),
    its output checked against numpy first; None for a GPU target, a kernel oneDNN has no call for,
    or a wrong result."""
    from ..measure.verify import TOLERANCE
    from ..model.library import workload_call
    from ..model.timing import time_callable

    if target.kind.name != "llvm" or workload.kind == "matmul":
        return None
    call, err = workload_call(workload)
    return time_callable(call, repeat=5, min_repeat_ms=100) if err <= TOLERANCE else None


def cmd_workloads(_args) -> int:
    from ..model.workloads import NAMED, PAPER_LAYERS

    for name, wl in NAMED.items():
        src = PAPER_LAYERS.get(name, (None, ""))[1]
        print(f"{name:12s} {wl.kind}:{','.join(map(str, wl.shape)):32s} {wl.flops / 1e6:9.1f} MFLOP  {src}")
    return 0
