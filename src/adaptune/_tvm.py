"""Import TVM once, fast.

The first MetaSchedule ``TuneContext`` imports ``tvm.s_tir.tensor_intrin``, which spends 10-20 s
registering CUDA/ROCm/Hexagon tensor intrinsics that CPU tuning never uses.  Unless
``ADAPTUNE_FULL_INTRIN=1`` is set (needed to tensorize for those GPUs), we register empty
stand-ins for those three sub-modules before TVM is imported.
"""
import os
import sys
import types

if os.environ.get("ADAPTUNE_FULL_INTRIN") != "1" and "tvm.s_tir.tensor_intrin" not in sys.modules:
    for _sub in ("cuda", "rocm", "hexagon"):
        sys.modules.setdefault(f"tvm.s_tir.tensor_intrin.{_sub}", types.ModuleType(f"tvm.s_tir.tensor_intrin.{_sub}"))

import tvm  # noqa: E402
from tvm import s_tir  # noqa: E402
from tvm.s_tir import meta_schedule as ms  # noqa: E402

__all__ = ["tvm", "s_tir", "ms"]
