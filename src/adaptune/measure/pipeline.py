"""adaptune's TIR lowering pipeline: TVM's s_tir pipeline, with a kernel's small buffers on the stack.

TVM lowers every CPU allocation of 1024 bytes or more (``runtime::kMaxStackAlloca``) to a
``TVMBackendAllocWorkspace`` call.  A kernel's accumulator tile is allocated inside its parallel
loop, so a 4 x 64 float tile (16 zmm registers, 1024 bytes) costs an allocation, a memset, a round
trip through memory and a free for every tile: on VGG's first layer (a 27-step reduction) more
than a third of the kernel's time (docs/decisions.md, session 58).  This pipeline marks each constant
allocation of at most ``STACK_BYTES`` with TVM's own ``disable_lower_builtin`` annotation, so that
LLVM allocates it on the stack and keeps the tile in registers.

The pipeline is TVM's own (``s_tir``) with the marking pass run on the host functions just before
``LowerTVMBuiltin``; the marking is a ``tvm_ffi.structural_map`` over the allocations.
"""
from __future__ import annotations

import math

import tvm_ffi

from .._tvm import tvm
from tvm import s_tir, tirx  # noqa: E402 - after .._tvm
from tvm.tirx import compilation_pipeline

NAME = "adaptune"
#: the largest allocation kept on the stack: a register tile is at most 32 zmm (2 KB)
STACK_BYTES = 8192
MARK = "disable_lower_builtin"      # TVM's own: LowerTVMBuiltin leaves such an allocation to LLVM


def _nbytes(buffer) -> int | None:
    if not all(isinstance(d, tirx.IntImm) for d in buffer.shape):
        return None
    dtype = tvm.DataType(str(buffer.dtype))
    return math.prod(int(d) for d in buffer.shape) * dtype.bits * dtype.lanes // 8


def _mark(alloc: "tirx.AllocBuffer") -> "tirx.AllocBuffer":
    size = _nbytes(alloc.buffer)
    if size is None or not 1024 <= size <= STACK_BYTES:
        return alloc
    return tirx.AllocBuffer(alloc.buffer, {**dict(alloc.annotations or {}), MARK: tirx.IntImm("bool", 1)})


@tirx.transform.prim_func_pass(opt_level=0, name="adaptune.SmallAllocationsOnStack")
def small_allocations_on_stack(func, _mod, _ctx):
    """Mark a host function's allocations of 1 KB to ``STACK_BYTES`` to stay on the stack."""
    target = func.attrs.get("target") if func.attrs else None
    if target is None or target.kind.name != "llvm":
        return func
    return tvm_ffi.structural_map(func, [(tirx.AllocBuffer, _mark)])


def _pipeline():
    lower, finalize_host, finalize_device = compilation_pipeline.get_tir_pipeline("s_tir")
    return lower, lambda: tvm.ir.transform.Sequential([small_allocations_on_stack, finalize_host()]), finalize_device


compilation_pipeline.register_tir_pipeline(NAME, _pipeline)


def compile_module(mod, target):
    """``tvm.compile`` (a TIR or Relax module) with adaptune's TIR pipeline."""
    return tvm.compile(mod, target=target, tir_pipeline=NAME)
