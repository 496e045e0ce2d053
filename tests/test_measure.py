import numpy as np
import pytest

from adaptune.testing import faults as faulty
from adaptune.measure.run import CRASH, OK, TIMEOUT, Measurer


@pytest.mark.slow
def test_good_crashing_and_hanging_kernels_all_come_back(conv_space, target):
    good = [conv_space.decode(c)[0].mod for c in conv_space.random(2, np.random.default_rng(0))]
    seen = []
    results = Measurer(target, timeout=5).measure(
        [good[0], faulty.Segfault, faulty.Hang, good[1]], on_result=lambda i, r: seen.append(i))
    assert [r.error for r in results] == [OK, CRASH, TIMEOUT, OK]
    assert seen == [0, 1, 2, 3]                          # reported one by one, in order
    assert all(r.latency > 0 for r in results if r.ok)
    assert results[1].latency is None and results[2].message


def test_unloadable_kernel_is_a_record(target):
    from tvm.script import ir as I
    from tvm.script import tirx as T

    @I.ir_module
    class Unresolved:   # calls a C function that exists nowhere: fails to link or load
        @T.prim_func
        def main(A: T.Buffer((16,), "float32")):
            T.func_attr({"global_symbol": "main"})
            A[0] = T.call_extern("float32", "adaptune_no_such_function", A[1])

    res = Measurer(target, timeout=5).measure([Unresolved])
    assert len(res) == 1 and not res[0].ok and res[0].latency is None and res[0].message


def test_build_workers_outlive_a_batch_and_are_recycled(conv_space, target):
    from adaptune._tvm import ms
    from adaptune.measure.run import WarmBuilder

    good = conv_space.decode(conv_space.random(1, np.random.default_rng(0))[0])[0].mod
    builder = WarmBuilder(max_workers=1, timeout=30, recycle=3)

    def pids():
        return {w._proc.pid for w in builder._pool._worker_map.values() if w._proc is not None}

    first = builder.build([ms.builder.BuilderInput(m, target) for m in (good, faulty.BuildFails)])
    assert first[0].error_msg is None and first[0].artifact_path
    assert first[1].artifact_path is None and "build failed" in first[1].error_msg
    before = pids()
    assert builder.build([ms.builder.BuilderInput(good, target)])[0].error_msg is None
    assert pids() == before                  # a failed build does not cost the worker; the next batch reuses it
    assert builder.build([ms.builder.BuilderInput(good, target)])[0].error_msg is None
    assert pids() and pids() != before       # the fourth build went to a fresh worker (recycle=3)
    builder.close()


def test_tvm_runs_generated_kernels_on_every_core():
    """TVM's pool alone takes half the logical CPUs on x86; importing adaptune sets it to the
    physical cores (the host target's num-cores), its idle workers to sleep at once, and a user's
    own settings still win."""
    import os
    import subprocess
    import sys

    import psutil
    code = ("import os, adaptune._tvm, tvm; print(os.environ['TVM_THREAD_POOL_SPIN_COUNT'], "
            "tvm.get_global_func('runtime.NumThreads')())")
    env = {k: v for k, v in os.environ.items()
           if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS", "TVM_THREAD_POOL_SPIN_COUNT")}
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert got.stdout.split()[-2:] == ["0", str(psutil.cpu_count(logical=False) or os.cpu_count())]
    got = subprocess.run([sys.executable, "-c", code], env={**env, "TVM_NUM_THREADS": "1"}, capture_output=True,
                         text=True, check=True)
    assert int(got.stdout.split()[-1]) == 1
