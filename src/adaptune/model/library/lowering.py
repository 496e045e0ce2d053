"""Rewriting the chosen chains into their library implementation, and each chain as a module of
its own (the fused task its library call is compared with)."""
from __future__ import annotations

import tvm
from tvm import relax

from .op import LibraryOp
from .calls import digest
from .patterns import Chain, packed_call, rewrite, weight_bias


def _winograd_call(chain: Chain, add_func, impl: str) -> relax.Expr:
    from .. import winograd
    w, b = weight_bias(chain)
    return winograd.call(chain.op, chain.anchor.args[0], w, b, chain.residual, digest(chain.op, w, b), add_func,
                         "generated" in impl, winograd.tile(impl))


def offload(optimised, ops: dict) -> "tvm.IRModule":
    """Rewrite every chain whose signature is in ``ops`` into its library implementation:
    ``"onednn"``, one fused oneDNN call; ``"winograd"``, ``winograd.call`` (its GEMMs on oneDNN);
    ``"winograd-generated"``, the same with the tuned GEMM kernel (all generated code); each of the
    two with ``-f2`` runs F(2x2, 3x3) instead of F(4x4, 3x3)."""
    if not ops:
        return optimised

    def on_chain(chain, add_func):
        impl = ops.get(chain.op)
        if impl == "onednn":
            return packed_call(chain)
        if impl is not None and impl.startswith("winograd"):
            return _winograd_call(chain, add_func, impl)
        return None
    return rewrite(optimised, on_chain)


def chain_modules(optimised) -> dict[LibraryOp, "tvm.IRModule"]:
    """Each signature's chain as a module of its own (its fused kernel is the task to compare with)."""
    mods: dict[LibraryOp, tvm.IRModule] = {}

    def take(chain, _add):
        if chain.op in mods:
            return packed_call(chain)
        bb = relax.BlockBuilder()
        if chain.op.kind == "softmax":
            params = [relax.Var("x", chain.anchor.ty)] + ([relax.Var("m", chain.residual.ty)] if chain.op.residual else [])
            with bb.function("main", params):
                with bb.dataflow():
                    y = params[0] if chain.scaled is None else \
                        bb.emit(relax.Call(chain.scaled.op, [params[0], chain.scaled.args[1]], chain.scaled.attrs))
                    if chain.op.residual:
                        y = bb.emit(relax.op.add(*((params[1], y) if chain.swapped[1] else (y, params[1]))))
                    gv = bb.emit_output(relax.op.nn.softmax(y, axis=-1))
                bb.emit_func_output(gv)
            mods[chain.op] = bb.get()
            return packed_call(chain)
        if chain.op.kind == "layer_norm":
            x = relax.Var("x", chain.anchor.args[0].ty)
            with bb.function("main", [x]):
                with bb.dataflow():
                    gv = bb.emit_output(relax.Call(chain.anchor.op, [x, *chain.anchor.args[1:]], chain.anchor.attrs))
                bb.emit_func_output(gv)
            mods[chain.op] = bb.get()
            return packed_call(chain)
        params = [relax.Var("x", (chain.anchor.args[0] if chain.transposed is None else chain.transposed.args[0]).ty)]
        rhs = chain.anchor.args[1]
        if not isinstance(rhs, tvm.ir.expr.Constant):               # bmm: the second operand is an input too
            rhs = relax.Var("y", rhs.ty)
            params.append(rhs)
        res = relax.Var("r", chain.residual.ty) if chain.residual is not None else None
        with bb.function("main", params + ([res] if res is not None else [])):
            with bb.dataflow():
                x = params[0] if chain.transposed is None else \
                    bb.emit(relax.Call(chain.transposed.op, [params[0]], chain.transposed.attrs))
                y = bb.emit(relax.Call(chain.anchor.op, [x, rhs], chain.anchor.attrs, chain.anchor.ty_args))
                if chain.bias is not None:
                    y = bb.emit(relax.op.add(*((chain.bias, y) if chain.swapped[0] else (y, chain.bias))))
                if res is not None:
                    y = bb.emit(relax.op.add(*((res, y) if chain.swapped[1] else (y, res))))
                for call in chain.post:
                    y = bb.emit(relax.Call(call.op, [y, *call.args[1:]], call.attrs, call.ty_args))
                gv = bb.emit_output(y)
            bb.emit_func_output(gv)
        mods[chain.op] = bb.get()
        return packed_call(chain)
    rewrite(optimised, take)
    return mods
