"""Residual adds written in place: a kernel whose output is ``f(..) + residual`` (ResNet's last
convolution of a block, with its add and ReLU) writes its output over the residual when nothing
reads the residual afterwards.

Written out of place, each output line is first read from memory (the store's write-allocate) while
the residual's line, read for the add, sits in L1; in place the store hits that line.  The model's
memory shrinks by one activation per block as well.  Relax's ``call_tir_inplace`` and its memory
planner do the aliasing; what is ours is the proof that a tuned kernel may alias the two buffers
(``_elementwise_aligned``).
"""
from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax
from tvm.s_tir.stmt import SBlock


def _point(region) -> bool:
    """Whether a block's access region is one element."""
    return all(getattr(r.extent, "value", None) == 1 for r in region)


def _elementwise_aligned(func, residual, output) -> bool:
    """Whether ``output`` may be written over ``residual`` in ``func`` (both among its params): every
    block that reads the residual writes the output at the very same single element (so each element
    is read by the block instance that then overwrites it), every block writing the output reads the
    residual so, no block reads the output back, and none accumulates (a reduction's init would
    overwrite the residual before it is read)."""
    blocks = []
    tvm_ffi.structural_walk(func.body, (SBlock, blocks.append))
    pairs = 0
    for block in blocks:
        reads = [r for r in block.reads if r.source.same_as(residual)]
        writes = [w for w in block.writes if w.source.same_as(output)]
        if any(r.source.same_as(output) for r in block.reads) or any(w.source.same_as(residual) for w in block.writes):
            return False
        if not reads and not writes:
            continue
        if len(reads) != 1 or len(writes) != 1 or block.init is not None or not _point(writes[0].region) or \
                not tvm_ffi.structural_equal(reads[0].region, writes[0].region):
            return False
        pairs += 1
    return pairs > 0


def _overwriting(func, j):
    """``func`` without its output parameter, writing where it read its ``j``-th parameter."""
    output, residual = func.params[-1], func.params[j]
    body = tvm_ffi.structural_map(func.body, (tvm.ir.expr.Var, lambda v: residual if v.same_as(output) else v))
    return tvm.tirx.PrimFunc(list(func.params[:-1]), body, func.ret_type, func.attrs)


def _dead_after(block) -> dict:
    """Dataflow var -> index of the last binding of ``block`` that uses it."""
    last = {}
    for i, binding in enumerate(block.bindings):
        for v in relax.analysis.free_vars(binding.value):
            last[v] = i
    return last


def inplace_residuals(mod) -> "tvm.IRModule":
    """``mod`` (scheduled kernels called by ``call_tir``) with each call that may write its output
    over an input that dies with the call turned into ``call_tir_inplace`` on a copy of its kernel
    without the output parameter.  Only dataflow vars made by a kernel in the same block qualify
    (never the model's inputs, constants or a view of a live tensor)."""
    call_tir = tvm.ir.Op.get("relax.call_tir")
    call_tir_inplace = tvm.ir.Op.get("relax.call_tir_inplace")
    builder = relax.BlockBuilder(mod)
    made = {}                                                   # (kernel, input index) -> GlobalVar of the in-place copy

    def inplace_kernel(gv, j):
        if (gv, j) not in made:
            made[(gv, j)] = builder.add_func(_overwriting(mod[gv], j), f"{gv.name_hint}_inplace{j}")
        return made[(gv, j)]

    def kernel_call(value) -> bool:
        return isinstance(value, relax.Call) and (value.op.same_as(call_tir) or value.op.same_as(call_tir_inplace))

    def candidate(call, produced, last, i):
        if not (isinstance(call, relax.Call) and call.op.same_as(call_tir)) or len(call.args) != 2:
            return None
        gv, args = call.args[0], list(call.args[1].fields)
        func = mod[gv]
        if not isinstance(func, tvm.tirx.PrimFunc) or len(func.params) != len(args) + 1:
            return None
        output = func.params[-1]
        for j, a in enumerate(args):
            if not (isinstance(a, relax.DataflowVar) and a in produced and last.get(a) == i and args.count(a) == 1):
                continue
            buffer = func.params[j]
            if str(buffer.dtype) != str(output.dtype) or \
                    not tvm_ffi.structural_equal(buffer.shape, output.shape):
                continue
            if _elementwise_aligned(func, buffer, output):
                return gv, j
        return None

    for fgv, func in mod.functions_items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        blocks = []
        for block in func.body.blocks:
            if not isinstance(block, relax.DataflowBlock):
                blocks.append(block)
                continue
            last, produced, bindings = _dead_after(block), set(), []
            for i, binding in enumerate(block.bindings):
                value = binding.value
                found = candidate(value, produced, last, i) if isinstance(binding, relax.VarBinding) else None
                if found is not None:
                    gv, j = found
                    value = relax.op.call_tir_inplace(inplace_kernel(gv, j), value.args[1], [j], value.ty_args[0])
                    binding = relax.VarBinding(binding.var, value)
                if isinstance(binding, relax.VarBinding) and kernel_call(binding.value):
                    produced.add(binding.var)
                bindings.append(binding)
            blocks.append(relax.DataflowBlock(bindings))
        builder.update_func(fgv, relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty,
                                                func.is_pure, func.attrs))
    return relax.transform.DeadCodeElimination()(builder.get())
