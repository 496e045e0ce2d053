"""adaptune: an autotuner for deep-learning compilers on Apache TVM.

Heavy modules load on first use, so builder workers that unpickle ``adaptune._build`` stay fast.
"""
from importlib import import_module

__version__ = "0.1.0"

_LAZY = {
    "tune_tir": "tuner", "TuneResult": "tuner", "TuneState": "tuner",
    "KnobSpace": "space", "CostModel": "cost_model", "Measurer": "measure",
    "MetaScheduleStrategy": "ms_adapter", "Strategy": "strategies", "STRATEGIES": "strategies",
    "register": "strategies", "get_workload": "workloads", "host_target": "target",
}


def __getattr__(name):
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'adaptune' has no attribute {name!r}")


__all__ = sorted(_LAZY)
