"""The OpenMP launcher a compiled model's parallel loops run on (``model.openmp``): every task runs
once, errors propagate, a thread that is done takes a slow thread's chunks, a model on it computes
what it computes on TVM's pool, and a library that uses TVM's barrier or a machine without a
compiler keeps TVM's pool."""
from __future__ import annotations

import ctypes
import threading
import time

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I, relax as R, tirx as T

from adaptune.model import compile as C
from adaptune.model import openmp


class Env(ctypes.Structure):
    _fields_ = [("sync_handle", ctypes.c_void_p), ("num_task", ctypes.c_int32)]


LAMBDA = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.POINTER(Env), ctypes.c_void_p)
LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, LAMBDA, ctypes.c_void_p, ctypes.c_int)


@pytest.mark.parametrize("num_task", [0, 1, 2, 7])
def test_the_launcher_runs_every_task_once_and_reports_errors(num_task):
    launch = LAUNCH(openmp.launcher())
    seen = []

    def task(i, env, _):
        seen.append((i, env.contents.num_task))
        return -1 if i == 1 else 0

    rc = launch(LAMBDA(task), None, num_task)
    n = num_task or len({i for i, _ in seen})
    assert sorted(i for i, _ in seen) == list(range(n)) and {k for _, k in seen} == {n}
    assert rc == (-1 if n > 1 else 0)


@pytest.fixture
def two_threads():
    """OpenMP's thread count at 2 for the test (other tests leave PyTorch's, the same libgomp's, at 1)."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_a_thread_that_is_done_takes_the_chunks_a_slow_one_has_left(two_threads):
    """Whichever thread runs a chunk first stalls in it until every other chunk ran (at most 5 s):
    the other thread must take the rest of the stalled thread's run.  (Not "chunk 0 stalls": on a
    busy machine the calling thread may enter the launch late, and by then the worker has rightly
    taken every chunk, chunk 0 included.)"""
    launch = LAUNCH(openmp.launcher())
    ran, stalled, lock = {}, [], threading.Lock()

    def task(i, env, _):
        ran[i] = threading.get_ident()
        with lock:
            first = not stalled
            if first:
                stalled.append(i)
        if first:
            end = time.monotonic() + 5
            while len(ran) < env.contents.num_task and time.monotonic() < end:
                time.sleep(0.01)
        return 0

    assert launch(LAMBDA(task), None, 0) == 0
    threads = len(ran) // openmp.CHUNKS_PER_THREAD
    assert sorted(ran) == list(range(threads * openmp.CHUNKS_PER_THREAD))
    assert threads == 2
    if len(set(ran.values())) < 2:
        pytest.skip("the second OpenMP thread ran no chunk within 5 s; nothing to take over")
    assert [i for i, t in ran.items() if t == ran[stalled[0]]] == stalled   # its other chunks ran elsewhere


@I.ir_module
class Parallel:
    @T.prim_func
    def scale(x: T.Buffer((64, 256), "float32"), y: T.Buffer((64, 256), "float32")):
        for i in T.parallel(64):
            for j in T.vectorized(256):
                y[i, j] = x[i, j] * T.float32(2) + T.Cast("float32", i)

    @R.function
    def main(x: R.Tensor((64, 256), "float32")) -> R.Tensor((64, 256), "float32"):
        cls = Parallel
        y = R.call_tir(cls.scale, (x,), out_ty=R.Tensor((64, 256), "float32"))
        return y


def test_a_compiled_model_runs_on_the_openmp_pool_with_the_same_result(tmp_path):
    ex = tvm.compile(Parallel, target="llvm")
    x = np.random.default_rng(0).standard_normal((64, 256)).astype("float32")
    want = x * 2 + np.arange(64, dtype="float32")[:, None]
    tvm_pool = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(tvm_pool, want, rtol=1e-6)
    np.testing.assert_allclose(C.run_vm(ex, [x])[0], want, rtol=1e-6)
    assert ex._adaptune_shared_pool is not ex                  # run_vm went through the OpenMP launcher
    path = C.export(ex, tmp_path / "m.so")
    lib = C.load(path)                                          # an exported model: patched on load
    slot = ctypes.c_void_p.in_dll(ctypes.CDLL(str(path)), openmp.LAUNCH)
    assert slot.value == openmp.launcher()
    np.testing.assert_allclose(C.run_vm(lib, [x])[0], want, rtol=1e-6)


def test_the_region_clock_times_each_launch_while_it_is_on():
    """While on, the clock keeps one wall time per launch, in order (a task that sleeps 20 ms makes its
    region last at least that); ``start`` empties it, and when off it counts nothing."""
    launch, clock = LAUNCH(openmp.launcher()), openmp.region_clock()
    quick = LAMBDA(lambda i, env, _: 0)
    slow = LAMBDA(lambda i, env, _: time.sleep(0.02) or 0)
    clock.start()
    for fn in (quick, slow, quick):
        assert launch(fn, None, 1) == 0
    assert clock.count() == 3
    assert clock.seconds(1, 2) >= 0.02 and clock.seconds(0, 3) >= clock.seconds(1, 2) > clock.seconds(0, 1)
    clock.start()
    assert clock.count() == 0
    clock.stop()
    launch(quick, None, 1)
    assert clock.count() == 0


def test_a_profile_times_kernels_on_the_launcher_by_its_clock():
    """``timing.profile`` gives a kernel whose parallel loop runs on the launcher the clock's time of
    its regions, and the VM's builtins (no region) the callbacks' time."""
    from adaptune.model.timing import profile
    ex = tvm.compile(Parallel, target="llvm")
    rows = {r["call"]: r for r in profile(ex, [np.ones((64, 256), "float32")], runs=3)}
    assert rows["scale"]["clock"] == "regions" and rows["scale"]["ms"] > 0 and rows["scale"]["hot_ms"] > 0
    assert all(r["clock"] == "callback" for k, r in rows.items() if k.startswith("vm."))


def _fake_library(tmp_path, name, symbols):
    from tvm.support import cc
    src = tmp_path / f"{name}.c"
    src.write_text("".join(f"void* {s} = 0;\n" for s in symbols))
    out = tmp_path / f"{name}.so"
    cc.create_shared(str(out), [str(src)], cc="gcc")
    return out


def test_a_library_using_tvms_barrier_keeps_tvms_pool(tmp_path):
    plain = _fake_library(tmp_path, "plain", [openmp.LAUNCH])
    assert openmp.share_pool(plain)
    assert ctypes.c_void_p.in_dll(ctypes.CDLL(str(plain)), openmp.LAUNCH).value == openmp.launcher()
    barrier = _fake_library(tmp_path, "barrier", [openmp.LAUNCH, openmp.BARRIER])
    assert not openmp.share_pool(barrier)
    assert not ctypes.c_void_p.in_dll(ctypes.CDLL(str(barrier)), openmp.LAUNCH).value
    assert not openmp.share_pool(_fake_library(tmp_path, "serial", ["unrelated"]))


def test_without_a_compiler_models_keep_tvms_pool_with_one_warning(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setattr(openmp, "_launcher", None)
    assert openmp.launcher() is None and openmp.launcher() is None
    assert capsys.readouterr().err.count("cannot build the OpenMP launcher") == 1
    ex = tvm.compile(Parallel, target="llvm")
    x = np.ones((64, 256), "float32")
    np.testing.assert_allclose(C.run_vm(ex, [x])[0], np.broadcast_to(2 + np.arange(64, dtype="float32")[:, None], x.shape))
    assert ex._adaptune_shared_pool is ex
