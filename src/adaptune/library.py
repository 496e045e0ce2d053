"""Woodpecker-DL's system-level exploration: per fused subgraph, our tuned kernel or the vendor's.

The vendor path is the one the fastest CPU runtimes take (torch.compile's freezing, ONNX Runtime's
NCHWc fusions): in the model's NHWC graph (``graph.optimise``) every convolution chain
``conv2d (+bias) (+residual add) (+ReLU / clip / GELU ...)`` and every dense chain
``matmul (+bias) (+activation | +residual add)`` with a constant weight can become ONE oneDNN call,
``torch.ops.mkldnn._convolution_pointwise`` or ``_linear_pointwise`` (their ``.binary`` forms for
the residual), whose weight is reordered to oneDNN's blocked layout once (at the first call,
cached by the weight's content and the call's attributes) instead of on every call.  A batched
matmul of two activations (attention's ``q @ k^T`` and ``p @ v``) can become one ``torch.matmul``,
attention's softmax and a layer norm one PyTorch call each.  NHWC tensors
are what oneDNN calls channels-last NCHW, so activations pass through DLPack with no copy.

* ``find_ops``: the fusable chains of the NHWC graph, as ``LibraryOp`` signatures with call counts;
* ``plan``: per signature, the fused library call timed against the best tuned kernel of the same
  subgraph (its task in the tuning database); a call that fails for its shape or attributes
  falls back to the generated kernel with one warning;
* ``offload``: rewrites the chosen chains into ``R.call_pure_packed("adaptune.onednn.*", ...)``.

The packed functions are registered when this module is imported (``compile.load`` imports it, so
an exported library that calls oneDNN loads and runs in a fresh process).  ``compile.build_best``
then times the whole model built up to five ways and keeps the fastest (the choice is checked on
the whole model, not only per kernel).
"""
from __future__ import annotations

import functools
import hashlib
import sys
from dataclasses import dataclass, field

import numpy as np
import torch
import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

CONV, CONV_ADD, LINEAR = "adaptune.onednn.conv2d", "adaptune.onednn.conv2d_add", "adaptune.onednn.linear"
LINEAR_ADD = "adaptune.onednn.linear_add"
BMM = "adaptune.onednn.bmm"
SOFTMAX, SOFTMAX_MASK = "adaptune.torch.softmax", "adaptune.torch.softmax_mask"
LAYER_NORM = "adaptune.torch.layer_norm"

_CALLS: dict = {}           # (kind, digest of op, weight and bias) -> what the call needs besides x


def _post(spec: str):
    """``"hardtanh:0:6"`` -> ("hardtanh", [0.0, 6.0], ""): a post-op, its scalars and its algorithm,
    as the op takes them (GELU names its algorithm: "none" is erf's, "tanh" the approximation)."""
    name, *scalars = spec.split(":")
    if name.startswith("gelu"):
        return "gelu", [], "tanh" if name == "gelu_tanh" else "none"
    return name, [float(s) for s in scalars], ""


_post = functools.lru_cache(maxsize=None)(_post)


def _nchw(t):
    """An NHWC TVM tensor as the channels-last NCHW torch tensor oneDNN expects (a view, no copy)."""
    return torch.from_dlpack(t).permute(0, 3, 1, 2)


def _to_tvm_nhwc(y):
    """oneDNN's channels-last NCHW output back to a compact NHWC TVM tensor (a view unless ambiguous)."""
    y = y.permute(0, 2, 3, 1)
    return tvm.runtime.from_dlpack(y if y.is_contiguous() else y.contiguous())


def _conv_call(key, tx, w, b, padding, stride, dilation, groups, post):
    """The conv call's fixed arguments, prepared once per call site: the weight reordered to
    oneDNN's blocked layout, the bias as a torch tensor of its own, the attributes as lists (the
    per-call conversions cost ~40 µs, more than a small MobileNet convolution)."""
    call = _CALLS.get(key)
    if call is None:
        args = [list(padding), list(stride), list(dilation), int(groups)]
        packed = torch.ops.mkldnn._reorder_convolution_weight(torch.from_dlpack(w).clone(), *args, list(tx.shape))
        call = _CALLS[key] = (packed, torch.from_dlpack(b).clone(), args, *_post(post))
    return call


@tvm_ffi.register_global_func(CONV, override=True)
def onednn_conv2d(x, w, b, padding, stride, dilation, groups, post, key):
    """conv2d + bias + unary post-op in one oneDNN call; x NHWC, w OIHW (pre-packed once), b (C,)."""
    tx = _nchw(x)
    pw, tb, args, name, scalars, algorithm = _conv_call(("conv", key), tx, w, b, padding, stride, dilation,
                                                        groups, post)
    return _to_tvm_nhwc(torch.ops.mkldnn._convolution_pointwise(tx, pw, tb, *args, name, scalars, algorithm))


@tvm_ffi.register_global_func(CONV_ADD, override=True)
def onednn_conv2d_add(x, other, w, b, padding, stride, dilation, groups, post, key):
    """conv2d + bias + residual add (+ReLU) in one oneDNN call (the ``.binary`` form)."""
    tx = _nchw(x)
    pw, tb, args, name, scalars, _ = _conv_call(("conv", key), tx, w, b, padding, stride, dilation, groups, post)
    return _to_tvm_nhwc(torch.ops.mkldnn._convolution_pointwise.binary(
        tx, _nchw(other), pw, tb, *args, "add", None, None if name == "none" else name, scalars, None))


def _linear_call(key, tx, w, b, post):
    """The dense call's fixed arguments, prepared once per call site: the weight reordered to
    oneDNN's blocked layout for this batch, the bias, the post-op."""
    call = _CALLS.get(("linear", key))
    if call is None:
        packed = torch.ops.mkldnn._reorder_linear_weight(torch.from_dlpack(w).clone(), int(np.prod(tx.shape[:-1])))
        call = _CALLS[("linear", key)] = (packed, torch.from_dlpack(b).clone(), *_post(post))
    return call


@tvm_ffi.register_global_func(LINEAR, override=True)
def onednn_linear(x, w, b, post, key):
    """x @ w.T + b with a unary post-op in one oneDNN call; w (out, in), pre-packed once."""
    tx = torch.from_dlpack(x)
    packed, tb, name, scalars, algorithm = _linear_call(key, tx, w, b, post)
    return tvm.runtime.from_dlpack(torch.ops.mkldnn._linear_pointwise(tx, packed, tb, name, scalars, algorithm))


@tvm_ffi.register_global_func(LINEAR_ADD, override=True)
def onednn_linear_add(x, other, w, b, key):
    """x @ w.T + b + other (a transformer's residual) in one oneDNN call (the ``.binary`` form)."""
    tx = torch.from_dlpack(x)
    packed, tb, *_ = _linear_call(key, tx, w, b, "none")
    return tvm.runtime.from_dlpack(torch.ops.mkldnn._linear_pointwise.binary(
        tx, torch.from_dlpack(other), packed, tb, "add"))


@tvm_ffi.register_global_func(BMM, override=True)
def torch_bmm(a, b):
    """A batched matmul of two activations (attention's q @ k^T and p @ v; an ONNX export keeps
    the heads as a fourth axis): ``torch.matmul``, which runs it as one batched GEMM on oneDNN or
    MKL as PyTorch chooses; both operands arrive through DLPack, no copy."""
    return tvm.runtime.from_dlpack(torch.matmul(torch.from_dlpack(a), torch.from_dlpack(b)))


def torch_softmax(x, scale, mask=None):
    """softmax(x * scale (+ mask)) over the last axis (attention's scores; ``mask`` broadcasts):
    PyTorch's vectorised ops on a tensor of our own, so TVM's pool does not wake between the
    batched matmuls PyTorch runs on either side."""
    t = torch.from_dlpack(x)
    if float(scale) != 1.0:
        t = t.mul(float(scale))
        if mask is not None:
            t.add_(torch.from_dlpack(mask))
    elif mask is not None:
        t = t.add(torch.from_dlpack(mask))                  # not in place: x is the model's tensor
    return tvm.runtime.from_dlpack(torch.softmax(t, -1))


tvm_ffi.register_global_func(SOFTMAX, lambda x, scale: torch_softmax(x, scale), override=True)
tvm_ffi.register_global_func(SOFTMAX_MASK, lambda x, mask, scale: torch_softmax(x, scale, mask), override=True)


@tvm_ffi.register_global_func(LAYER_NORM, override=True)
def torch_layer_norm(x, gamma, beta, eps):
    """A layer norm over the last axis: PyTorch's, on OpenMP's threads like the dense calls around
    it (a transformer runs one before every attention and MLP block)."""
    g = torch.from_dlpack(gamma)
    return tvm.runtime.from_dlpack(torch.nn.functional.layer_norm(
        torch.from_dlpack(x), g.shape, g, torch.from_dlpack(beta), float(eps)))


def _shape(expr) -> tuple[int, ...]:
    return tuple(int(d) for d in expr.ty.shape)


@dataclass(frozen=True)
class LibraryOp:
    """One fusable chain's signature: kind, shapes, attributes and epilogue."""
    kind: str                           # "conv2d" | "linear" | "bmm" | "softmax" | "layer_norm"
    data: tuple[int, ...]               # conv2d: NHWC; linear: (..., in); bmm: (batch..., m, k); softmax: x
    weight: tuple[int, ...]             # as the vendor op takes it: OIHW | (out, in); bmm: (batch..., k, n);
                                        # softmax: the mask's shape, () without one; layer_norm: (C,)
    out: tuple[int, ...]
    attrs: tuple = ()                   # conv2d: (padding (h, w), strides, dilation, groups); softmax: (scale,);
                                        # layer_norm: (eps,)
    residual: bool = False              # a residual tensor added before the post-op (softmax: the mask)
    post: str = "none"                  # unary post-op, scalars after colons ("hardtanh:0:6")

    @property
    def label(self) -> str:
        tail = ("+add" if self.residual else "") + ("" if self.post == "none" else "+" + self.post.split(":")[0])
        if self.kind == "conv2d":
            pad, (sh, _), _, g = self.attrs
            return (f"conv2d {self.data[3]}->{self.weight[0]} {self.weight[2]}x{self.weight[3]} s{sh} p{pad[0]}"
                    f"{f' g{g}' if g > 1 else ''} @{self.data[1]}x{self.data[2]}{tail}")
        if self.kind == "bmm":
            return f"bmm {'x'.join(map(str, self.data))} @ {'x'.join(map(str, self.weight))}"
        if self.kind == "softmax":
            scale = f" *{self.attrs[0]:.4g}" if self.attrs[0] != 1.0 else ""
            return f"softmax {'x'.join(map(str, self.data))}{scale}{'+mask' if self.residual else ''}"
        if self.kind == "layer_norm":
            return f"layer_norm {'x'.join(map(str, self.data))}"
        return f"linear {'x'.join(map(str, self.data))} -> {self.weight[0]}{tail}"

    @property
    def flops(self) -> float:
        if self.kind == "softmax":
            return 5.0 * np.prod(self.out)                   # scale, mask, max, exp, sum, divide
        if self.kind == "layer_norm":
            return 8.0 * np.prod(self.out)                   # mean, variance, normalise, scale, shift
        if self.kind == "conv2d":
            return 2.0 * np.prod(self.out) * np.prod(self.weight[1:])
        return 2.0 * np.prod(self.out) * (self.weight[-2] if self.kind == "bmm" else self.weight[1])   # k; in

    def time(self, *, repeat: int = 5) -> float:
        """Seconds per call of the fused library kernel, through the DLPack path the model uses."""
        from .compile import time_callable
        rng = np.random.default_rng(0)
        if self.kind == "softmax":
            x, mask = (tvm.runtime.tensor(rng.standard_normal(s).astype("float32")) for s in (self.data, self.weight))
            return time_callable(lambda: torch_softmax(x, self.attrs[0], mask if self.residual else None),
                                 repeat=repeat, min_repeat_ms=100)
        if self.kind == "layer_norm":
            x, g, b = (tvm.runtime.tensor(rng.standard_normal(s).astype("float32"))
                       for s in (self.data, self.weight, self.weight))
            return time_callable(lambda: torch_layer_norm(x, g, b, self.attrs[0]), repeat=repeat, min_repeat_ms=100)
        arrays = [rng.standard_normal(s).astype("float32") for s in (self.data, self.weight, (self.weight[0],), self.out)]
        x, w, b, other = (tvm.runtime.tensor(a) for a in arrays)
        if self.kind == "bmm":
            return time_callable(lambda: torch_bmm(x, w), repeat=repeat, min_repeat_ms=100)
        key = _digest(self, arrays[1], arrays[2])
        if self.kind == "linear" and self.residual:
            return time_callable(lambda: onednn_linear_add(x, other, w, b, key), repeat=repeat, min_repeat_ms=100)
        if self.kind == "linear":
            return time_callable(lambda: onednn_linear(x, w, b, self.post, key), repeat=repeat, min_repeat_ms=100)
        if self.residual:
            return time_callable(lambda: onednn_conv2d_add(x, other, w, b, *self.attrs, self.post, key),
                                 repeat=repeat, min_repeat_ms=100)
        return time_callable(lambda: onednn_conv2d(x, w, b, *self.attrs, self.post, key), repeat=repeat,
                             min_repeat_ms=100)


# ---- the chains, as Relax dataflow patterns (longest first) --------------------------------------

def _unary_posts():
    """Relax unary ops that oneDNN takes as a post-op: (pattern, spec of the matched call)."""
    return {"relax.nn.relu": lambda c: "relu", "relax.nn.gelu": lambda c: "gelu",
            "relax.nn.gelu_tanh": lambda c: "gelu_tanh",
            "relax.sigmoid": lambda c: "sigmoid", "relax.tanh": lambda c: "tanh",
            "relax.nn.silu": lambda c: "swish"}


UNARY = _unary_posts()


@dataclass
class _Chain:
    """The matched pieces of one chain (the calls and constants ``offload`` rewrites)."""
    anchor: relax.Call                 # the conv2d / matmul
    bias: "tvm.ir.expr.Constant | None"
    residual: relax.Expr | None
    post: list[relax.Call]             # the epilogue's unary calls, in order (two for a clip)
    op: LibraryOp
    swapped: tuple[bool, bool] = (False, False)     # (bias, residual) came first in its add
    scaled: relax.Call | None = None                # softmax: the divide / multiply by the scale


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
        data, weight, out = _shape(anchor.args[0]), _shape(anchor.args[1]), _shape(anchor)
    except (TypeError, AttributeError):                     # symbolic or unknown shapes
        return None
    if any(str(a.ty.dtype) != "float32" for a in anchor.args[:2]):
        return None
    spec = _post_spec(post)
    if residual is not None and spec not in ("none", "relu"):
        return None                                         # oneDNN: after a binary post-op, ReLU only
    if residual is not None and _shape(residual) != out:
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


def _single_use(func) -> set:
    """The calls of ``func`` whose bound value is used exactly once (a chain may absorb only those:
    an intermediate read elsewhere would be computed twice)."""
    uses: dict = {}

    @relax.expr_functor.visitor
    class _Uses(relax.PyExprVisitor):
        def visit_var_(self, var):
            uses[var] = uses.get(var, 0) + 1

        def visit_dataflow_var_(self, var):
            uses[var] = uses.get(var, 0) + 1

    _Uses().visit_expr(func)
    return {b.value for block in func.body.blocks for b in block.bindings if uses.get(b.var, 0) == 1}


def _softmax_chain(matched, matches, parts, single) -> _Chain | None:
    """A softmax over the last axis of ``x (* scale) (+ mask)``, float32, scale a scalar constant,
    ``x`` of the output's shape (the mask may broadcast)."""
    scaled = matches[parts["scaled"]] if parts["scaled"] is not None else None
    mask = matches[parts["mask"]] if parts["mask"] is not None else None
    mask_add = matches[parts["mask_add"]] if mask is not None else None
    if any(c is not None and c not in single for c in (scaled, mask_add)):
        return None
    x = matches[parts["x"]]
    try:
        data, out = _shape(x), _shape(matched)
        mask_shape = _shape(mask) if mask is not None else ()
    except (TypeError, AttributeError):                     # symbolic or unknown shapes
        return None
    c = matches[parts["scale"]].value.numpy() if scaled is not None else np.ones(1)
    value = float(c.reshape(())) if c.size == 1 else 0.0
    if int(matched.attrs.axis) not in (-1, len(out) - 1) or value == 0.0 or data != out or \
            any(str(e.ty.dtype) != "float32" for e in [x, matched] + ([mask] if mask is not None else [])):
        return None
    scale = 1.0 / value if scaled is not None and scaled.op.name == "relax.divide" else value
    op = LibraryOp("softmax", data, mask_shape, out, (scale,), mask is not None)
    return _Chain(x, None, mask, [], op, (False, mask is not None and mask_add.args[0].same_as(mask)), scaled)


def _layer_norm_chain(matched) -> _Chain | None:
    """A float32 layer norm over the last axis with a constant scale and shift of that axis' size."""
    a = matched.attrs
    try:
        data = _shape(matched.args[0])
    except (TypeError, AttributeError):                     # symbolic or unknown shapes
        return None
    axes = [int(x) % len(data) for x in a.axes]
    if axes != [len(data) - 1] or not (a.center and a.scale) or str(matched.args[0].ty.dtype) != "float32" or \
            any(_shape(p) != (data[-1],) or str(p.ty.dtype) != "float32" for p in matched.args[1:3]):
        return None
    return _Chain(matched, None, None, [], LibraryOp("layer_norm", data, (data[-1],), data, (float(a.epsilon),)))


def _chain(matched, matches, parts, single) -> _Chain | None:
    if parts.get("softmax"):
        return _softmax_chain(matched, matches, parts, single)
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
    swapped = tuple(parts[k] is not None and isinstance(matches[parts[k]].args[0], type(matches[parts[p]]))
                    and matches[parts[k]].args[0].same_as(matches[parts[p]]) for k, p in (("bias_add", "bias"),
                                                                                           ("res_add", "residual")))
    return _Chain(anchor, bias, residual, post, op, swapped)


def _rewrite(mod, on_chain) -> "tvm.IRModule":
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
            single = _single_use(func)

            def rewriter(matched, matches, parts=parts, single=single):
                chain = _chain(matched, matches, parts, single)
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
        return _packed_call(chain)
    _rewrite(optimised, count)
    return found


def _digest(op: LibraryOp, weight: np.ndarray, bias: np.ndarray) -> int:
    """A content key for a call site's prepared arguments (same call, weight and bias: same key)."""
    h = hashlib.blake2b(weight.tobytes(), digest_size=8)
    h.update(bias.tobytes())
    h.update(repr(op).encode())
    return int.from_bytes(h.digest(), "little", signed=True)


def _weight_bias(chain: _Chain) -> tuple[np.ndarray, np.ndarray]:
    """The chain's weight as the vendor op takes it (OIHW | (out, in)) and its bias (zeros if none)."""
    op = chain.op
    w = chain.anchor.args[1].value.numpy()
    w = np.ascontiguousarray(w.transpose(0, 3, 1, 2) if op.kind == "conv2d" else w.T)  # OHWI -> OIHW; (in,out) -> (out,in)
    b = _per_channel(chain.bias, op.out[-1]) if chain.bias is not None else np.zeros(op.weight[0], "float32")
    return w, b


def _packed_call(chain: _Chain) -> relax.Call:
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
    w, b = _weight_bias(chain)
    consts = [relax.const(w), relax.const(np.ascontiguousarray(b))]
    tail = [relax.expr.String(op.post), relax.prim_value(_digest(op, w, b))]
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


def _winograd_call(chain: _Chain, add_func) -> relax.Expr:
    from . import winograd
    w, b = _weight_bias(chain)
    return winograd.call(chain.op, chain.anchor.args[0], w, b, chain.residual, _digest(chain.op, w, b), add_func)


IMPLS = ("onednn", "winograd")           # the library's implementations of a chain


def offload(optimised, ops: dict) -> "tvm.IRModule":
    """Rewrite every chain whose signature is in ``ops`` into its library implementation:
    ``"onednn"``, one fused oneDNN call; ``"winograd"``, ``winograd.call``."""
    if not ops:
        return optimised

    def on_chain(chain, add_func):
        impl = ops.get(chain.op)
        if impl == "onednn":
            return _packed_call(chain)
        if impl == "winograd":
            return _winograd_call(chain, add_func)
        return None
    return _rewrite(optimised, on_chain)


def chain_modules(optimised) -> dict[LibraryOp, "tvm.IRModule"]:
    """Each signature's chain as a module of its own (its fused kernel is the task to compare with)."""
    mods: dict[LibraryOp, tvm.IRModule] = {}

    def take(chain, _add):
        if chain.op in mods:
            return _packed_call(chain)
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
            return _packed_call(chain)
        if chain.op.kind == "layer_norm":
            x = relax.Var("x", chain.anchor.args[0].ty)
            with bb.function("main", [x]):
                with bb.dataflow():
                    gv = bb.emit_output(relax.Call(chain.anchor.op, [x, *chain.anchor.args[1:]], chain.anchor.attrs))
                bb.emit_func_output(gv)
            mods[chain.op] = bb.get()
            return _packed_call(chain)
        params = [relax.Var("x", chain.anchor.args[0].ty)]
        rhs = chain.anchor.args[1]
        if not isinstance(rhs, tvm.ir.expr.Constant):               # bmm: the second operand is an input too
            rhs = relax.Var("y", rhs.ty)
            params.append(rhs)
        res = relax.Var("r", chain.residual.ty) if chain.residual is not None else None
        with bb.function("main", params + ([res] if res is not None else [])):
            with bb.dataflow():
                y = bb.emit(relax.Call(chain.anchor.op, [params[0], rhs], chain.anchor.attrs,
                                       chain.anchor.ty_args))
                if chain.bias is not None:
                    y = bb.emit(relax.op.add(*((chain.bias, y) if chain.swapped[0] else (y, chain.bias))))
                if res is not None:
                    y = bb.emit(relax.op.add(*((res, y) if chain.swapped[1] else (y, res))))
                for call in chain.post:
                    y = bb.emit(relax.Call(call.op, [y, *call.args[1:]], call.attrs, call.ty_args))
                gv = bb.emit_output(y)
            bb.emit_func_output(gv)
        mods[chain.op] = bb.get()
        return _packed_call(chain)
    _rewrite(optimised, take)
    return mods


@dataclass
class Choice:
    op: LibraryOp
    calls: int
    library_s: float | None             # the fused oneDNN call; None: oneDNN failed for this signature
    generated_s: float | None           # the best record of the chain's fused task
    tasks: list[str] = field(default_factory=list)
    winograd_s: float | None = None     # Winograd F(4x4,3x3) (``winograd.py``); None: not applicable

    @property
    def library_impl(self) -> str | None:
        """The faster library implementation of the chain, or None when the library has none."""
        times = {k: v for k, v in (("onednn", self.library_s), ("winograd", self.winograd_s)) if v is not None}
        return min(times, key=times.get) if times else None

    @property
    def impl(self) -> str:
        """What the chain runs in the per-chain choice: "generated", "onednn" or "winograd"."""
        lib = self.library_impl
        if lib is None:
            return "generated"
        lib_s = self.library_s if lib == "onednn" else self.winograd_s
        return lib if self.generated_s is None or lib_s < self.generated_s else "generated"

    @property
    def use_library(self) -> bool:
        return self.impl != "generated"

    def as_dict(self) -> dict:
        ms = lambda s: None if s is None else s * 1e3                     # noqa: E731
        return {"op": self.op.label, "calls": self.calls, "library_ms": ms(self.library_s),
                "winograd_ms": ms(self.winograd_s), "generated_ms": ms(self.generated_s), "tasks": self.tasks,
                "choice": self.impl}


def _chain_tasks(optimised, target):
    """(signature, its chain as a module, the tasks that module compiles to) for every chain."""
    from .graph import extract_tasks
    for op, mod in chain_modules(optimised).items():
        yield op, mod, extract_tasks(mod, target)[0]


def _time_winograd(op: LibraryOp, chain_mod, target, repeat: int = 5) -> float:
    """Seconds per call of the chain as Winograd F(4x4,3x3), built and run through the Relax VM."""
    from .compile import time_vm
    from .graph import fuse
    ex = tvm.compile(fuse(offload(chain_mod, {op: "winograd"}), target), target=target)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal([int(d) for d in p.ty.shape]).astype("float32") for p in chain_mod["main"].params]
    return time_vm(ex, inputs, repeat=repeat, min_repeat_ms=100)


def library_time(op: LibraryOp, impl: str, chain_mod, target, times: dict | None = None) -> float | None:
    """Seconds per call of the chain on ``impl`` ("onednn": the fused call; "winograd"), or None
    where it does not apply or fails (one warning line: the chain keeps its other paths).
    ``times`` holds what this run measured already: tuning's ``task_floors`` and the build's
    ``plan`` time each chain once between them."""
    from . import winograd
    times = {} if times is None else times
    if (op, impl) not in times:
        if impl == "winograd" and not winograd.supports(op):
            times[op, impl] = None
            return None
        try:
            times[op, impl] = op.time(repeat=5) if impl == "onednn" else _time_winograd(op, chain_mod, target)
        except Exception as e:                              # noqa: BLE001 - any failure of a library path
            name, rest = ("oneDNN", "the generated kernel") if impl == "onednn" else \
                ("Winograd", "oneDNN or the generated kernel")
            print(f"adaptune: warning: {name} cannot run {op.label} ({' '.join(str(e).split())[:120]}); "
                  f"using {rest}", file=sys.stderr)
            times[op, impl] = None
    return times[op, impl]


def plan(optimised, database, target, times: dict | None = None) -> list[Choice]:
    """Time each chain's fused library call and look up its tuned kernel (see module doc).

    A library call that raises (a shape or attribute oneDNN does not take) is reported in one
    warning line and that chain stays generated.  ``times``: see ``library_time``."""
    from .measure import latency
    counts = find_ops(optimised)
    choices = []
    for op, chain_mod, tasks in _chain_tasks(optimised, target):
        lats = []
        for t in tasks:
            rec = database.query_tuning_record(t.mod, target, t.name) if database is not None else None
            if rec is not None and rec.run_secs:
                lats.append(latency(rec.run_secs))
        generated = sum(lats) if len(lats) == len(tasks) and lats else None
        choices.append(Choice(op, counts.get(op, 0), library_time(op, "onednn", chain_mod, target, times), generated,
                              [t.name for t in tasks], library_time(op, "winograd", chain_mod, target, times)))
    return choices


def task_floors(optimised, tasks, target, times: dict | None = None) -> dict[str, float]:
    """Per task that computes exactly one library chain, the fused library call's time: what a
    tuned kernel must beat to be used (the scheduler spends trials where generated code can win).
    ``times``: see ``library_time``."""
    by_hash = {tvm_ffi.structural_hash(t.mod): t.name for t in tasks}
    floors = {}
    for op, chain_mod, chain_tasks in _chain_tasks(optimised, target):
        name = by_hash.get(tvm_ffi.structural_hash(chain_tasks[0].mod)) if len(chain_tasks) == 1 else None
        if name is not None and name not in floors:
            found = [t for t in (library_time(op, impl, chain_mod, target, times) for impl in ("onednn", "winograd"))
                     if t is not None]
            if found:
                floors[name] = min(found)
    return floors


def chosen(choices) -> dict[LibraryOp, str]:
    """The signatures a plan gives to the library, with the implementation each runs."""
    return {c.op: c.impl for c in choices if c.use_library}


def eligible(choices) -> dict[LibraryOp, str]:
    """Every signature the library can run, on its faster implementation (the all-library build)."""
    return {c.op: c.library_impl for c in choices if c.library_impl is not None}


def schedule_epilogues(mod) -> "tvm.IRModule":
    """Parallelise and vectorise the unscheduled all-spatial PrimFuncs that ``offload`` leaves.

    Written by hand: TVM's default CPU schedules (dlight.cpu) cover GEMV and reductions only, and
    an elementwise kernel needs nothing more than inline, fuse, parallel, vectorise.  A kernel
    that cannot be scheduled this way (several output blocks, e.g. a split) is left to TVM.
    Updates ``mod`` in place (a module fresh from ``apply_database``) and returns it."""
    from tvm import s_tir, tirx
    for gv, func in list(mod.functions_items()):
        if not isinstance(func, tirx.PrimFunc) or (func.attrs and func.attrs.get("tirx.is_scheduled")):
            continue
        sch = s_tir.Schedule(func)
        try:
            blocks = sch.get_child_blocks(sch.get_sblock("root"))
            if not blocks or any(int(iv.iter_type) != 0 for b in blocks for iv in sch.get(b).iter_vars):
                continue                                  # not purely spatial: leave it to TVM
            for b in blocks[:-1]:
                sch.compute_inline(b)
            loop = sch.fuse(*sch.get_loops(blocks[-1]))
            extent = int(sch.get(loop).extent)
            vec = next(v for v in (16, 8, 4, 2, 1) if extent % v == 0)
            outer, inner = sch.split(loop, [None, vec])
            sch.parallel(outer)
            if vec > 1:
                sch.vectorize(inner)
        except s_tir.ScheduleError:
            continue
        mod.update_func(gv, sch.mod["main"].with_attr("tirx.is_scheduled", True))
    return mod
