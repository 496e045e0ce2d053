"""Import TVM once, fast.

The first MetaSchedule ``TuneContext`` imports ``tvm.s_tir.tensor_intrin``, which spends 10-20 s
registering CUDA/ROCm/Hexagon tensor intrinsics that CPU tuning never uses.  Unless
``ADAPTUNE_FULL_INTRIN=1`` is set, we register empty stand-ins for those three sub-modules before
TVM is imported, and every ``TuneContext`` whose CUDA target takes MetaSchedule's default rules
(their tensor-core rules look the intrinsics up by name) swaps the real CUDA one in first, so
stock MetaSchedule tuning for CUDA works in a process that imported adaptune.
"""
import importlib
import os
import sys
import types

_STUB = "_adaptune_stub"

if os.environ.get("ADAPTUNE_FULL_INTRIN") != "1" and "tvm.s_tir.tensor_intrin" not in sys.modules:
    for _sub in ("cuda", "rocm", "hexagon"):
        _mod = types.ModuleType(f"tvm.s_tir.tensor_intrin.{_sub}")
        setattr(_mod, _STUB, True)
        sys.modules.setdefault(_mod.__name__, _mod)

import tvm  # noqa: E402
from tvm import s_tir  # noqa: E402
from tvm.s_tir import meta_schedule as ms  # noqa: E402


def load_cuda_intrinsics() -> None:
    """Register TVM's CUDA tensor intrinsics (wmma, mma, ldmatrix; 10-25 s once per process) if
    the stand-in is in their place; a no-op otherwise."""
    name = "tvm.s_tir.tensor_intrin.cuda"
    if not getattr(sys.modules.get(name), _STUB, False):
        return
    del sys.modules[name]
    import tvm.s_tir.tensor_intrin as parent  # the package itself is cheap once its stubs are in place
    parent.cuda = importlib.import_module(name)


def needs_cuda_intrinsics(target, space_generator) -> bool:
    """Whether a ``TuneContext`` for ``target`` with ``space_generator`` takes MetaSchedule's
    default CUDA rules (none given, a name, or rules "from-target"), which need the intrinsics."""
    if target is None:
        return False
    kind = (target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)).kind.name
    return kind == "cuda" and getattr(space_generator, "sch_rules", None) is None


if getattr(sys.modules.get("tvm.s_tir.tensor_intrin.cuda"), _STUB, False):
    _tune_context_init = ms.TuneContext.__init__

    def _init_with_cuda_intrinsics(self, mod=None, *, target=None, space_generator=None, **kwargs):
        if needs_cuda_intrinsics(target, space_generator):
            load_cuda_intrinsics()
        _tune_context_init(self, mod, target=target, space_generator=space_generator, **kwargs)

    ms.TuneContext.__init__ = _init_with_cuda_intrinsics


__all__ = ["tvm", "s_tir", "ms", "load_cuda_intrinsics", "needs_cuda_intrinsics"]
