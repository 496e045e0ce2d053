"""adaptune: an autotuner for deep-learning compilers on Apache TVM.

Heavy modules load on first use, so builder workers that unpickle ``adaptune.measure.build`` stay fast.
"""
import os
from importlib import import_module

# A compiled model runs its generated kernels and its PyTorch (oneDNN) calls on PyTorch's OpenMP
# threads (``model/openmp.py``).  PASSIVE (sleep at once) makes every kernel wake them; a bounded
# spin of 100k iterations measured best when TVM's pool still shared the cores with them, and keeps
# them spinning across the microseconds between two kernels (docs/decisions.md).  Must be set
# before torch loads libgomp; a user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT wins.
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "100000")
# TVM's own pool, unless TVM_NUM_THREADS says otherwise, takes half the logical CPUs on x86 (it
# assumes two hardware threads per core): on a 2-vCPU machine whose vCPUs are two cores, every
# generated kernel ran on one thread.  So TVM gets the physical cores (the host target's num-cores),
# and its idle workers sleep at once (TVM_THREAD_POOL_SPIN_COUNT=0): TVM's pool measures kernels while
# tuning and runs libraries loaded without adaptune, where spinning workers took the cores from
# oneDNN's OpenMP threads (ResNet-18 with the library choice: 16 -> 26 ms; docs/decisions.md).  Set
# before TVM starts its pool; measuring workers inherit both.
if "TVM_NUM_THREADS" not in os.environ:
    import psutil
    os.environ["TVM_NUM_THREADS"] = str(psutil.cpu_count(logical=False) or os.cpu_count() or 1)
TVM_SPIN_CHOSEN = "TVM_THREAD_POOL_SPIN_COUNT" in os.environ   # by the user; LoopTune leaves it then
os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")

__version__ = "0.1.0"

_LAZY = {
    "tune_tir": "tuner", "TuneResult": "tuner", "TuneState": "search.state",
    "KnobSpace": "search.space", "CostModel": "search.cost_model", "Measurer": "measure.run",
    "MetaScheduleStrategy": "ms_adapter", "Strategy": "search.strategies", "STRATEGIES": "search.strategies",
    "register": "search.strategies", "get_workload": "model.workloads", "host_target": "measure.target",
}


def __getattr__(name):
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'adaptune' has no attribute {name!r}")


__all__ = sorted(_LAZY)
