"""Import TVM once, fast.

The first MetaSchedule ``TuneContext`` imports ``tvm.s_tir.tensor_intrin``, which spends 10-20 s
registering CUDA/ROCm/Hexagon tensor intrinsics that CPU tuning never uses.  Unless
``ADAPTUNE_FULL_INTRIN=1`` is set, we register empty stand-ins for those three sub-modules before
TVM is imported; ``load_cuda_intrinsics`` swaps the real CUDA one in when a CUDA target is used
(MetaSchedule's default CUDA rules look up its tensor-core intrinsics by name).
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
    """Register TVM's CUDA tensor intrinsics (wmma, mma, ldmatrix; ~5-10 s once per process) if
    the stand-in is in their place; a no-op otherwise."""
    name = "tvm.s_tir.tensor_intrin.cuda"
    if not getattr(sys.modules.get(name), _STUB, False):
        return
    del sys.modules[name]
    import tvm.s_tir.tensor_intrin as parent  # the package itself is cheap once its stubs are in place
    parent.cuda = importlib.import_module(name)


__all__ = ["tvm", "s_tir", "ms", "load_cuda_intrinsics"]
