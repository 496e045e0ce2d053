"""The chains oneDNN can run as one call, found in the model's NHWC Relax graph as dataflow
patterns (longest first), and each chain's packed call (``calls``)."""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

from .calls import BMM, CONV, CONV_ADD, LAYER_NORM, LINEAR, LINEAR_ADD, SOFTMAX, SOFTMAX_MASK, digest
from .op import LibraryOp, shape_of


def _unary_posts():
    """Relax unary ops that oneDNN takes as a post-op: (pattern, spec of the matched call)."""
    return {"relax.nn.relu": lambda c: "relu", "relax.nn.gelu": lambda c: "gelu",
            "relax.nn.gelu_tanh": lambda c: "gelu_tanh",
            "relax.sigmoid": lambda c: "sigmoid", "relax.tanh": lambda c: "tanh",
            "relax.nn.silu": lambda c: "swish"}


UNARY = _unary_posts()


@dataclass
class Chain:
    """The matched pieces of one chain (the calls and constants ``offload`` rewrites)."""
    anchor: relax.Call                 # the conv2d / matmul
    bias: "tvm.ir.expr.Constant | None"
    residual: relax.Expr | None
    post: list[relax.Call]             # the epilogue's unary calls, in order (two for a clip)
    op: LibraryOp
    swapped: tuple[bool, bool] = (False, False)     # (bias, residual) came first in its add
    scaled: relax.Call | None = None                # softmax: the divide / multiply by the scale
    transposed: relax.Call | None = None            # conv2d: the NCHW -> NHWC transpose of its input
    #   (the model's input), which ``kernel_rewrites.fuse_input_transpose`` puts in the conv's kernel


def _per_channel(const, channels) -> np.ndarray | None:
    """A bias constant broadcast along the last axis only, as a (channels,) array, else None."""
    a = const.value.numpy()
    if a.size != channels or a.shape[-1] != channels or str(a.dtype) != "float32":
        return None
    return a.reshape(channels)


def _post_spec(post: list) -> str:
    """The oneDNN post-op of the epilogue's unary calls (``graph.decompose_clip``'s pair is a clip)."""
    if not post:
        return "none"
    if len(post) == 2:
        lo, hi = (float(c.args[1].value.numpy()) for c in post)
        return f"hardtanh:{lo:g}:{hi:g}"
    return UNARY[post[0].op.name](post[0])


def _signature(anchor, bias, residual, post) -> LibraryOp | None:
    """The chain's ``LibraryOp`` when oneDNN runs it (NHWC conv, 2-D+ matmul, float32), else None."""
    try:
        data, weight, out = shape_of(anchor.args[0]), shape_of(anchor.args[1]), shape_of(anchor)
    except (TypeError, AttributeError):                     # symbolic or unknown shapes
        return None
    if any(str(a.ty.dtype) != "float32" for a in anchor.args[:2]):
        return None
    spec = _post_spec(post)
    if residual is not None and spec not in ("none", "relu"):
        return None                                         # oneDNN: after a binary post-op, ReLU only
    if residual is not None and shape_of(residual) != out:
        return None
    if bias is not None and _per_channel(bias, out[-1]) is None:
        return None
    if anchor.op.name == "relax.nn.conv2d":
        a = anchor.attrs
        if (a.data_layout, a.kernel_layout, a.out_layout) != ("NHWC", "OHWI", "NHWC") or \
                (a.out_dtype is not None and str(a.out_dtype) not in ("float32", "")):   # None: the ONNX importer's
            return None
        top, left, bottom, right = (int(p) for p in a.padding)
        if (top, left) != (bottom, right):
            return None                                     # oneDNN pads symmetrically
        o, kh, kw, i = weight
        attrs = ((top, left), tuple(int(s) for s in a.strides), tuple(int(d) for d in a.dilation), int(a.groups))
        return LibraryOp("conv2d", data, (o, i, kh, kw), out, attrs, residual is not None, spec)
    if anchor.op.name != "relax.matmul":
        return None
    if isinstance(anchor.args[1], tvm.ir.expr.Constant):
        if len(weight) == 2 and len(data) >= 2 and (residual is None or spec == "none"):
            return LibraryOp("linear", data, (weight[1], weight[0]), out, (), residual is not None, spec)
        return None
    if residual is not None:
        return None
    if len(data) == len(weight) >= 3 and data[:-2] == weight[:-2] and bias is None and not post:
        return LibraryOp("bmm", data, weight, out)
    return None


def _patterns():
    """(pattern, parts) for every chain shape, longest first; ``parts`` names the sub-patterns."""
    out = []
    for anchor_op in ("relax.nn.conv2d", "relax.matmul"):
        for has_bias in (True, False):
            for res_side in (0, 1, None):       # residual: second or first operand of its add, or none
                for has_post in (True, False):
                    if not has_bias and res_side is None and not has_post:
                        continue
                    anchor, bias, res = is_op(anchor_op)(wildcard(), is_const()), is_const(), wildcard()
                    y = badd = is_op("relax.add")(anchor, bias) | is_op("relax.add")(bias, anchor) if has_bias else anchor
                    if res_side is not None:     # two patterns, not an Or: a match does not backtrack
                        y = radd = is_op("relax.add")(*((y, res) if res_side == 0 else (res, y)))
                    clip_max = is_op("relax.maximum")(y, is_const())
                    if has_post:
                        y = functools.reduce(lambda a, b: a | b, [is_op(name)(y) for name in UNARY] +
                                             [is_op("relax.minimum")(clip_max, is_const())])
                    out.append((y, dict(anchor=anchor, bias=bias if has_bias else None, bias_add=badd if has_bias else None,
                                        residual=res if res_side is not None else None,
                                        res_add=radd if res_side is not None else None,
                                        post=has_post, clip_max=clip_max)))
        out.append((is_op(anchor_op)(wildcard(), is_const()), None))
    out.append((is_op("relax.matmul")(wildcard(), wildcard()), None))       # two activations: bmm
    out = [(p, parts or dict(anchor=p, bias=None, bias_add=None, residual=None, res_add=None, post=False,
                             clip_max=None)) for p, parts in out]
    for has_scale, sides in ((True, (0, 1, None)), (False, (0, None))):   # softmax(x (* scale) (+ mask))
        for mask_side in sides:                     # (an ONNX export of SDPA scales q and k instead)
            x, c, mask = wildcard(), is_const(), wildcard()
            y = scaled = is_op("relax.divide")(x, c) | is_op("relax.multiply")(x, c) if has_scale else x
            if mask_side is not None:
                y = is_op("relax.add")(*((scaled, mask) if mask_side == 0 else (mask, scaled)))
            out.append((is_op("relax.nn.softmax")(y), dict(softmax=True, x=x, scale=c if has_scale else None,
                                                          scaled=scaled if has_scale else None,
                                                          mask=mask if mask_side is not None else None,
                                                          mask_add=y if mask_side is not None else None)))
    out.append((is_op("relax.nn.layer_norm")(wildcard(), is_const(), is_const()), dict(layer_norm=True)))
    return out


def _bindings(func) -> dict:
    """Each variable of ``func``'s blocks -> the value bound to it."""
    return {b.var: b.value for block in func.body.blocks for b in block.bindings}


def _single_use(func, bound: dict) -> set:
    """The calls of ``func`` whose bound value is used exactly once (a chain may absorb only those:
    an intermediate read elsewhere would be computed twice).  ``bound``: ``_bindings(func)``."""
    uses: dict = {}

    @relax.expr_functor.visitor
    class _Uses(relax.PyExprVisitor):
        def visit_var_(self, var):
            uses[var] = uses.get(var, 0) + 1

        def visit_dataflow_var_(self, var):
            uses[var] = uses.get(var, 0) + 1

    _Uses().visit_expr(func)
    return {value for var, value in bound.items() if uses.get(var, 0) == 1}


def _is_first(add, expr, bound: dict) -> bool:
    """Whether ``expr`` is ``add``'s first operand.  The matcher looks through bindings and tries a
    commutative op's operands both ways, so a match may be the operand or the value bound to it."""
    a = add.args[0]
    return a.same_as(expr) or (a in bound and bound[a].same_as(expr))


def _softmax_chain(matched, matches, parts, single, bound) -> Chain | None:
    """A softmax over the last axis of ``x (* scale) (+ mask)``, float32, scale a scalar constant,
    ``x`` of the output's shape (the mask may broadcast)."""
    scaled = matches[parts["scaled"]] if parts["scaled"] is not None else None
    mask = matches[parts["mask"]] if parts["mask"] is not None else None
    mask_add = matches[parts["mask_add"]] if mask is not None else None
    if any(c is not None and c not in single for c in (scaled, mask_add)):
        return None
    x = matches[parts["x"]]
    try:
        data, out = shape_of(x), shape_of(matched)
        mask_shape = shape_of(mask) if mask is not None else ()
    except (TypeError, AttributeError):                     # symbolic or unknown shapes
        return None
    c = matches[parts["scale"]].value.numpy() if scaled is not None else np.ones(1)
    value = float(c.reshape(())) if c.size == 1 else 0.0
    if int(matched.attrs.axis) not in (-1, len(out) - 1) or value == 0.0 or data != out or \
            any(str(e.ty.dtype) != "float32" for e in [x, matched] + ([mask] if mask is not None else [])):
        return None
    scale = 1.0 / value if scaled is not None and scaled.op.name == "relax.divide" else value
    op = LibraryOp("softmax", data, mask_shape, out, (scale,), mask is not None)
    return Chain(x, None, mask, [], op, (False, mask is not None and _is_first(mask_add, mask, bound)), scaled)


def _layer_norm_chain(matched) -> Chain | None:
    """A float32 layer norm over the last axis with a constant scale and shift of that axis' size."""
    a = matched.attrs
    try:
        data = shape_of(matched.args[0])
    except (TypeError, AttributeError):                     # symbolic or unknown shapes
        return None
    axes = [int(x) % len(data) for x in a.axes]
    if axes != [len(data) - 1] or not (a.center and a.scale) or str(matched.args[0].ty.dtype) != "float32" or \
            any(shape_of(p) != (data[-1],) or str(p.ty.dtype) != "float32" for p in matched.args[1:3]):
        return None
    return Chain(matched, None, None, [], LibraryOp("layer_norm", data, (data[-1],), data, (float(a.epsilon),)))


def _chain(matched, matches, parts, single, bound) -> Chain | None:
    if parts.get("softmax"):
        return _softmax_chain(matched, matches, parts, single, bound)
    if parts.get("layer_norm"):
        return _layer_norm_chain(matched)
    inner = [matches[parts[k]] for k in ("anchor", "bias_add", "res_add", "clip_max")
             if parts[k] is not None and parts[k] in matches]
    if any(not c.same_as(matched) and c not in single for c in inner):
        return None
    anchor = matches[parts["anchor"]]
    post = []
    if parts["post"]:
        post = [matches[parts["clip_max"]], matched] if matched.op.name == "relax.minimum" else [matched]
    bias = matches[parts["bias"]] if parts["bias"] is not None else None
    residual = matches[parts["residual"]] if parts["residual"] is not None else None
    op = _signature(anchor, bias, residual, post)
    if op is None:
        return None
    swapped = tuple(parts[k] is not None and _is_first(matches[parts[k]], matches[parts[p]], bound)
                    for k, p in (("bias_add", "bias"), ("res_add", "residual")))
    data = bound.get(anchor.args[0])
    transposed = data if op.kind == "conv2d" and isinstance(data, relax.Call) and \
        isinstance(data.op, tvm.ir.Op) and data.op.name == "relax.permute_dims" and \
        [int(a) for a in data.attrs.axes or []] == [0, 2, 3, 1] else None
    return Chain(anchor, bias, residual, post, op, swapped, transposed=transposed)


def rewrite(mod, on_chain) -> "tvm.IRModule":
    """Apply ``on_chain(chain, add_func) -> Expr | None`` to every chain of every Relax function
    (longest first); ``add_func(name, prim_func) -> GlobalVar`` adds a kernel the new call needs."""
    added: dict[str, tuple] = {}

    def add_func(name, prim_func):
        if name not in added:                 # a BlockBuilder gives the GlobalVar its function type
            added[name] = (relax.BlockBuilder().add_func(prim_func, name), prim_func)
        return added[name][0]
    for pattern, parts in _patterns():
        funcs = dict(mod.functions_items())
        for gv, func in funcs.items():
            if not isinstance(func, relax.Function):
                continue
            bound = _bindings(func)
            single = _single_use(func, bound)

            def rewriter(matched, matches, parts=parts, single=single, bound=bound):
                chain = _chain(matched, matches, parts, single, bound)
                new = on_chain(chain, add_func) if chain is not None else None
                return matched if new is None else new
            funcs[gv] = relax.analysis.remove_all_unused(rewrite_call(pattern, rewriter, func))
        funcs.update({gv: f for gv, f in added.values()})
        mod = tvm.IRModule(funcs, attrs=mod.attrs)
    return mod


def find_ops(optimised) -> dict[LibraryOp, int]:
    """The chains of an NHWC module that oneDNN can run as one call, and how often each occurs
    (counted as ``offload`` would rewrite them: a chain taken by a longer pattern is not seen again)."""
    found: dict[LibraryOp, int] = {}

    def count(chain, _add):
        found[chain.op] = found.get(chain.op, 0) + 1
        return packed_call(chain)
    rewrite(optimised, count)
    return found


def weight_bias(chain: Chain) -> tuple[np.ndarray, np.ndarray]:
    """The chain's weight as the vendor op takes it (OIHW | (out, in)) and its bias (zeros if none)."""
    op = chain.op
    w = chain.anchor.args[1].value.numpy()
    w = np.ascontiguousarray(w.transpose(0, 3, 1, 2) if op.kind == "conv2d" else w.T)  # OHWI -> OIHW; (in,out) -> (out,in)
    b = _per_channel(chain.bias, op.out[-1]) if chain.bias is not None else np.zeros(op.weight[0], "float32")
    return w, b


def packed_call(chain: Chain) -> relax.Call:
    op = chain.op
    if op.kind == "softmax":
        scale = relax.prim_value(tvm.tirx.FloatImm("float64", op.attrs[0]))
        if op.residual:
            return relax.call_pure_packed(SOFTMAX_MASK, chain.anchor, chain.residual, scale, ty_args=chain.anchor.ty)
        return relax.call_pure_packed(SOFTMAX, chain.anchor, scale, ty_args=chain.anchor.ty)
    if op.kind == "bmm":
        return relax.call_pure_packed(BMM, *chain.anchor.args, ty_args=chain.anchor.ty)
    if op.kind == "layer_norm":
        eps = relax.prim_value(tvm.tirx.FloatImm("float64", op.attrs[0]))
        return relax.call_pure_packed(LAYER_NORM, *chain.anchor.args, eps, ty_args=chain.anchor.ty)
    w, b = weight_bias(chain)
    consts = [relax.const(w), relax.const(np.ascontiguousarray(b))]
    tail = [relax.expr.String(op.post), relax.prim_value(digest(op, w, b))]
    if op.kind == "linear" and op.residual:                 # the binary form takes no post-op
        return relax.call_pure_packed(LINEAR_ADD, chain.anchor.args[0], chain.residual, *consts, tail[-1],
                                      ty_args=chain.anchor.ty)
    if op.kind == "linear":
        return relax.call_pure_packed(LINEAR, chain.anchor.args[0], *consts, *tail, ty_args=chain.anchor.ty)
    pad, strides, dilation, groups = op.attrs
    attrs = [relax.ShapeExpr(list(pad)), relax.ShapeExpr(list(strides)), relax.ShapeExpr(list(dilation)),
             relax.prim_value(groups)]
    if op.residual:
        return relax.call_pure_packed(CONV_ADD, chain.anchor.args[0], chain.residual, *consts, *attrs, *tail,
                                      ty_args=chain.anchor.ty)
    return relax.call_pure_packed(CONV, chain.anchor.args[0], *consts, *attrs, *tail, ty_args=chain.anchor.ty)
