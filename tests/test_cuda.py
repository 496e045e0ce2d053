"""The CUDA target: what runs without a GPU (targets, design spaces, decoding, building with TVM's
CUDA codegen, the CLI's refusal) and, where a GPU is visible, a tuned kernel checked against numpy."""
import shutil
import time
import zlib

import numpy as np
import pytest

from adaptune.measure.target import TargetError, device_type, gpu_visible, parse_target

GPU = gpu_visible()
needs_gpu = pytest.mark.skipif(not GPU, reason="no CUDA GPU visible to TVM (tvm.cuda(0).exist is False)")


@pytest.fixture(scope="module")
def cuda():
    return parse_target("cuda")


@pytest.fixture(scope="module")
def dense_space(cuda):
    from adaptune.search.space import KnobSpace
    from adaptune.model.workloads import get_workload
    return KnobSpace(get_workload("tiny-dense").mod(), cuda, seed=1)


def test_cuda_targets_carry_what_metaschedule_gpu_rules_need(cuda):
    assert cuda.kind.name == "cuda" and device_type(cuda) == "cuda"
    for key in ("max_threads_per_block", "max_shared_memory_per_block", "thread_warp_size"):
        assert int(cuda.attrs[key]) > 0, key
    assert str(cuda.attrs["arch"]).startswith("sm_")
    if not GPU:
        assert str(cuda.attrs["arch"]) == "sm_90"
    a100 = parse_target({"kind": "cuda", "arch": "sm_80"})
    assert str(a100.attrs["arch"]) == "sm_80" and int(a100.attrs["max_threads_per_block"]) == 1024
    same = parse_target('{"kind": "cuda", "arch": "sm_80", "max_shared_memory_per_block": 32768}')
    assert int(same.attrs["max_shared_memory_per_block"]) == 32768
    for arch in (80, "sm_xx", "ampere"):
        with pytest.raises(TargetError, match="arch"):
            parse_target({"kind": "cuda", "arch": arch})
    assert str(parse_target({"kind": "cuda", "arch": "sm_90a"}).attrs["arch"]) == "sm_90a"


def test_gpu_design_spaces_decode_pass_gpu_postprocs_and_build(dense_space, cuda):
    from adaptune._tvm import ms
    from adaptune.measure.run import WarmBuilder
    names = {type(p).__name__ for p in dense_space.postprocs}
    assert {"VerifyGPUCode", "RewriteCooperativeFetch", "RewriteUnboundBlock"} <= names
    decoded = dense_space.decode_many(dense_space.random(200, np.random.default_rng(0)))
    valid = [(sch, canon) for sch, reason, canon in decoded if sch is not None]
    assert 3 <= len(valid) < len(decoded)           # VerifyGPUCode rejects some, not all
    for sch, canon in valid[:3]:
        script = sch.mod.script()
        assert "threadIdx.x" in script and "blockIdx.x" in script and 'scope="shared"' in script
        assert (dense_space.encode(sch.trace) == canon).all()
    builder = WarmBuilder(max_workers=2, linked=True)
    try:
        built = builder.build([ms.builder.BuilderInput(sch.mod, cuda) for sch, _ in valid[:3]])
    finally:
        builder.close()
    assert [b.error_msg for b in built] == [None] * 3


def test_generated_cuda_code_compiles_with_nvcc(dense_space, cuda):
    """Without a GPU, TVM's wheel keeps the CUDA module as source (it compiles it with NVRTC when
    its CUDA runtime loads, i.e. where a driver is); nvcc checks that source here."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    from adaptune._tvm import tvm
    from tvm.support import nvcc
    decoded = dense_space.decode_many(dense_space.random(200, np.random.default_rng(0)))
    for sch in [sch for sch, _, _ in decoded if sch is not None][:2]:
        kernel = tvm.tirx.build(sch.mod, target=cuda).imports[0]
        assert kernel.kind == "cuda" and "__global__" in kernel.inspect_source()
        with cuda:
            fatbin = nvcc.compile_cuda(kernel.inspect_source(), target_format="fatbin", compiler="nvcc")
        assert len(fatbin) > 1000


@pytest.fixture(scope="module")
def l8_space(cuda):
    from adaptune.search.space import KnobSpace
    from adaptune.model.workloads import get_workload
    return KnobSpace(get_workload("L8").mod(), cuda, seed=1)


def test_thread_limits_read_off_the_trace_filter_random_configs(l8_space):
    # every design space of L8 binds the fused third tile level of its 4 spatial loops to threadIdx.x
    for bounds in l8_space._bounds:
        assert [(lo, hi, [level for _, level in parts]) for lo, hi, parts in bounds] == [(32, 1024, [2, 2, 2, 2])]
    rng = np.random.default_rng(0)
    uniform = l8_space.canonical((rng.random((300, l8_space.ndim)) * l8_space.sizes).astype(np.int64))
    ok = np.array([sch is not None for sch, _, _ in l8_space.decode_many(uniform)])
    assert not ok[~l8_space.plausible(uniform)].any()          # a necessary condition
    drawn = l8_space.random(150, rng)
    assert l8_space.plausible(drawn).all()
    valid = sum(sch is not None for sch, _, _ in l8_space.decode_many(drawn))
    assert valid >= 8 and valid / 150 > 2 * ok.mean()           # ~14% against ~2.7% uniform


def test_short_gpu_batches_are_topped_up_not_taken_for_exhaustion(l8_space):
    """A strategy whose proposals all fail VerifyGPUCode still gets a full batch of valid configs."""
    from adaptune.search.strategies.base import Strategy
    from adaptune.tuner import TuneState

    class Hopeless(Strategy):
        def propose(self, n):
            return np.zeros((n, self.state.space.ndim), dtype=np.int64)   # 1 thread per block

    state = TuneState(l8_space, seed=0)
    strategy = Hopeless()
    strategy.setup(state)
    batch = state.prepare(strategy, 8)
    assert len(batch) == 8 and all(sch is not None for _, sch in batch)


@pytest.mark.skipif(GPU, reason="a GPU is visible here: the no-GPU refusal cannot be seen")
@pytest.mark.parametrize("args", [["tune-op", "L8", "--target", '{"kind": "cuda", "arch": "sm_80"}'],
                                  ["bench", "demo-cnn", "--target", "cuda"],
                                  ["tune", "demo-cnn", "--target", "cuda", "--trials", "4"],
                                  ["compile", "demo-cnn", "--target", "cuda", "--db", "wd", "-o", "m.so"]])
def test_cli_without_a_gpu_says_so_in_one_line_exit_2(tmp_path, cli, args):
    code, _, err = cli(*args)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "needs an NVIDIA GPU" in lines[0], err
    assert list(tmp_path.iterdir()) == []


def test_cli_with_rpc_needs_no_local_gpu_and_an_unreachable_tracker_is_one_line(tmp_path, cli):
    """With --rpc the kernels run remotely: no local-GPU refusal; the tracker is asked, at once."""
    t0 = time.monotonic()
    code, _, err = cli("tune-op", "tiny-dense", "--target", "cuda", "--rpc", "127.0.0.1:9", "--device-key", "gpu")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "cannot reach the RPC tracker" in lines[0], err
    assert time.monotonic() - t0 < 30 and list(tmp_path.iterdir()) == []


@needs_gpu
@pytest.mark.parametrize("name", ["tiny-dense", "tiny-conv"])
def test_tuned_cuda_kernel_matches_numpy(tmp_path, cuda, name):
    from adaptune.cli.ops import check_numerics
    from adaptune.tuner import tune_tir
    from adaptune.model.workloads import get_workload
    wl = get_workload(name)
    res = tune_tir(wl.mod(), cuda, strategy="chameleon", trials=8, work_dir=tmp_path / "wd", label=name)
    assert res.best_latency is not None and res.best_latency > 0, res.last_error
    assert "wrong" not in res.failures
    ok, err = check_numerics(wl, res.best_schedule, cuda)
    print(f"{name}: {tvm_device_name()} best {res.best_latency * 1e6:.1f} us after {res.trials} trials, "
          f"max rel. error vs numpy {err:.2e}")
    assert ok, err


def tvm_device_name() -> str:
    from adaptune._tvm import tvm
    return str(tvm.cuda(0).device_name)


def test_only_tensor_core_workloads_pay_for_the_cuda_intrinsics(monkeypatch, cuda):
    from tvm import te, topi

    from adaptune import _tvm
    from adaptune._tvm import ms, needs_cuda_intrinsics, tvm
    from adaptune.search.knobs import space_generator
    from adaptune.model.workloads import get_workload
    dense = get_workload("tiny-dense").mod()
    assert not needs_cuda_intrinsics(cuda, space_generator(dense, cuda))
    a, b = te.placeholder((64, 64), "float16", name="A"), te.placeholder((64, 64), "float16", name="B")
    fp16 = tvm.IRModule({"main": te.create_prim_func([a, b, topi.nn.dense(a, b, out_dtype="float32")])})
    assert needs_cuda_intrinsics(cuda, space_generator(fp16, cuda))
    assert needs_cuda_intrinsics("cuda", None) and needs_cuda_intrinsics(cuda, "post-order-apply")
    assert not needs_cuda_intrinsics(parse_target("llvm"), None)
    # any TuneContext (stock MetaSchedule's too) loads them when it needs them, and only then
    loaded = []
    monkeypatch.setattr(_tvm, "load_cuda_intrinsics", lambda: loaded.append(1))
    ms.TuneContext(dense, target=cuda, space_generator=space_generator(dense, cuda), task_name="main")
    assert loaded == []
    try:
        ms.TuneContext(dense, target=cuda, space_generator=ms.space_generator.PostOrderApply(), task_name="main")
    except Exception:  # noqa: BLE001 - the stand-in above registered nothing
        pass
    assert loaded == [1]


@pytest.fixture(scope="module")
def demo_cuda_db(tmp_path_factory, cuda):
    """demo-cnn's tasks for CUDA, with a database holding each untuned kernel's default GPU schedule
    (as ``tune_model`` commits them) and, for the heaviest task, one random valid tuned schedule."""
    from adaptune._tvm import ms
    from adaptune.model.frontends import load_model
    from adaptune.model.graph import extract_tasks, optimise
    from adaptune.scheduler import _commit_untuned
    from adaptune.search.space import KnobSpace
    model = load_model("demo-cnn")
    tasks, _ = extract_tasks(optimise(model.mod), cuda)
    db = ms.database.JSONDatabase(work_dir=str(tmp_path_factory.mktemp("demo-cuda")))
    _commit_untuned(db, tasks, {t.name: 1.0 for t in tasks}, cuda)
    space = KnobSpace(tasks[0].mod, cuda, seed=0)
    sch = next(s for s, _, _ in space.decode_many(space.random(300, np.random.default_rng(0))) if s is not None)
    db.commit_tuning_record(ms.database.TuningRecord(sch.trace, db.commit_workload(tasks[0].mod), run_secs=[1e-6],
                                                     target=cuda, args_info=ms.arg_info.ArgInfo.from_prim_func(
                                                         tasks[0].mod["main"])))
    return model, tasks, db


def test_models_compile_for_cuda_every_kernel_bound_to_threads(demo_cuda_db, cuda):
    """Without a GPU: the model path builds CUDA code; kernels with no record get TVM's default GPU
    schedule (the untuned records replay it too), the tuned record is applied as it was found."""
    from adaptune._tvm import tvm
    from adaptune.model import compile as C
    model, tasks, db = demo_cuda_db
    mod = C.lower_tuned(model, db, cuda)
    kernels = {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    assert len(kernels) >= len(tasks)
    for name, f in kernels.items():
        assert "threadIdx" in f.script(), f"{name} is not bound to GPU threads"
    assert 'scope="shared"' in kernels[tasks[0].name].script()     # the tuned record, not dlight's fallback
    for ex in (tvm.compile(mod, target=cuda), C.build_untuned(model, cuda)):
        assert str(C.vm_device(ex)) == str(tvm.cuda(0))
    assert str(C.vm_device(C.build_untuned(model, parse_target("llvm")))) == str(tvm.cpu())


@needs_gpu
def test_tuned_model_on_the_gpu_matches_the_reference_and_is_timed_beside_pytorch(tmp_path, cuda):
    from adaptune.model import compile as C
    from adaptune.model.evaluate import evaluate
    from adaptune.model.frontends import load_model
    from adaptune.scheduler import tune_model
    model = load_model("demo-cnn")
    res = tune_model(model, cuda, trials=16, work_dir=tmp_path / "wd")
    assert res.trials == 16 and all(t.baseline is not None for t in res.tasks)   # default GPU schedules ran
    ev = evaluate(model, cuda, C.open_database(tmp_path / "wd"), rounds=2)
    rows = {r.runtime: r for r in ev.rows}
    print("\n".join(f"demo-cnn on {tvm_device_name()}: {r.runtime} {r.latency_ms:.3f} ms, max error {r.max_error:.1e}"
                    for r in ev.rows), ev.skipped)
    assert {"tvm-untuned", "adaptune-generated", "adaptune", "pytorch-eager"} <= set(rows)
    assert all(r.max_error <= 1e-3 for r in ev.rows) and "onnxruntime" in ev.skipped


def test_library_calls_compile_into_a_cuda_model(demo_cuda_db, cuda):
    """Without a GPU: every chain offloaded to the library, the glue left around the calls gets the
    default GPU schedule and the module builds for CUDA."""
    from adaptune._tvm import tvm
    from adaptune.model import compile as C
    from adaptune.model.graph import optimise
    from adaptune.model.library import find_ops
    model, _, db = demo_cuda_db
    ops = {op: "onednn" for op in find_ops(optimise(model.mod))}
    assert any(op.kind == "conv2d" for op in ops) and any(op.kind == "linear" for op in ops)
    mod = C.lower_tuned(model, db, cuda, ops)
    assert "adaptune.onednn.conv2d" in mod.script()
    for gv, f in mod.functions_items():
        if isinstance(f, tvm.tirx.PrimFunc):
            assert "threadIdx" in f.script(), f"{gv.name_hint} is not bound to GPU threads"
    tvm.compile(mod, target=cuda)


@pytest.mark.parametrize("post", ["none", "relu", "hardtanh:0:6", "gelu", "gelu_tanh", "sigmoid", "tanh", "swish"])
@pytest.mark.parametrize("residual", [False, True])
def test_gpu_forms_of_the_library_calls_compute_what_onednn_computes(post, residual):
    """The cuDNN/cuBLAS forms (``calls._cuda_conv`` / ``_cuda_linear``: PyTorch's generic ops, which
    run on CUDA tensors there) checked here on CPU tensors against the oneDNN calls."""
    import torch

    from adaptune._tvm import tvm
    from adaptune.measure.verify import relative_error
    from adaptune.model.library import calls
    if residual and post not in ("none", "relu"):
        pytest.skip("a residual chain takes ReLU or nothing after the add (as oneDNN's binary form)")
    rng = np.random.default_rng(0)
    t = lambda *s: tvm.runtime.tensor(rng.standard_normal(s).astype("float32"))      # noqa: E731
    x, w, b, other = t(1, 9, 9, 8), t(16, 4, 3, 3), t(16), t(1, 5, 5, 16)     # groups 2, stride 2, pad 1
    attrs = ((1, 1), (2, 2), (1, 1), 2)
    key = zlib.crc32(f"{post}{residual}".encode())       # the calls cache their arguments per key
    if residual:
        want = calls.onednn_conv2d_add(x, other, w, b, *attrs, post, key).numpy()
        got = calls._cuda_conv(calls._nchw(x), w, b, *attrs, post, key, other).numpy()
    else:
        want = calls.onednn_conv2d(x, w, b, *attrs, post, key).numpy()
        got = calls._cuda_conv(calls._nchw(x), w, b, *attrs, post, key).numpy()
    assert got.shape == want.shape == (1, 5, 5, 16) and relative_error(got, want) < 1e-5
    xl, wl, bl, ol = t(3, 7, 24), t(10, 24), t(10), t(3, 7, 10)
    if residual:
        if post != "none":
            return
        want = calls.onednn_linear_add(xl, ol, wl, bl, key).numpy()
        got = calls._cuda_linear(torch.from_dlpack(xl), wl, bl, "none", key, ol).numpy()
    else:
        want = calls.onednn_linear(xl, wl, bl, post, key).numpy()
        got = calls._cuda_linear(torch.from_dlpack(xl), wl, bl, post, key).numpy()
    assert got.shape == want.shape == (3, 7, 10) and relative_error(got, want) < 1e-5
