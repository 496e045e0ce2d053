"""Kernel rewrites on the Relax graph before legalisation, for x86's vector width: output channels
padded to whole vectors (``pad_output_channels``), each depthwise convolution fused with the 1x1
one it alone feeds, and with the 1x1 expansion before it where the expanded tensor outgrows L2
(``fuse_separable``), each depthwise convolution left apart fused with the 1x1 expansion before it
(``fuse_expansion_depthwise``), and the model's NCHW input read by its first convolution itself
(``fuse_input_transpose``).  Each rewritten kernel is one ``call_te`` PrimFunc marked
output-elementwise fusable, so Relax still fuses the bias, residual and activation behind it, and
the expert template (``search/expert.py``) schedules it."""
from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import tvm
from tvm import relax, te, topi

from .functions import mutate_each


#: a convolution's output channels are padded to whole vectors only where that adds at most this share of work
PAD_CHANNELS_MAX = 4 / 3


#: a half-width vector counts as a whole one where its FMAs keep at least this share of the full width's FLOP/s
HALF_VECTOR_RATE = 3 / 4


def padded_channels(co: int, lanes: int) -> int:
    """``co`` rounded up to whole ``lanes``-wide vectors where that adds at most ``PAD_CHANNELS_MAX``
    of work, else ``co``."""
    padded = -(-co // lanes) * lanes
    return co if padded > PAD_CHANNELS_MAX * co else padded


def pad_lanes(target, lanes: int, channels) -> int:
    """The vector width output channels are padded to: ``lanes``, or half of it where this CPU runs
    half-width FMAs at ``HALF_VECTOR_RATE`` or more of the full width's FLOP/s.  AMD Zen 4 executes a
    zmm FMA as two ymm halves (measured: ymm 215, zmm 224 GFLOP/s), so MobileNetV2's 24 channels as a
    zmm and a ymm do 3/4 of the padded 32's work and run 3-10% faster; on Intel's two 512-bit FMA
    ports a ymm takes a zmm's slot and padding wins (docs/decisions.md, sessions 63 and 92).  Measured
    only where the target is this host's CPU and some of ``channels`` (the model's convolutions'
    output channels, ``conv_output_channels``) pad differently at the two widths; elsewhere whole
    vectors (a ResNet's channels are whole vectors at either width: its processes measure nothing)."""
    from .timing import best_fma_peak_gflops
    half = lanes // 2
    if lanes <= 4 or str(target.attrs.get("mcpu", "")) != tvm.target.codegen.llvm_get_system_cpu() or \
            all(padded_channels(co, half) == padded_channels(co, lanes) for co in channels):
        return lanes
    return half if best_fma_peak_gflops(target, half) >= HALF_VECTOR_RATE * best_fma_peak_gflops(target) else lanes


def conv_output_channels(mod) -> set[int]:
    """The output channel counts of ``mod``'s NHWC convolutions with constant weights: those the
    rewrites here may pad, and the depthwise ones, which they never pad (a superset does no harm)."""
    found = set()

    def visit(expr):
        if _conv_attrs(expr) is not None:
            found.add(int(expr.args[1].ty.shape[0]))
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return found


def _conv_attrs(call):
    """(strides, padding, dilation, groups) of a Relax NHWC/OHWI conv2d call with a constant float32
    weight, or None for any other call."""
    if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.conv2d"):
        return None
    a, w = call.attrs, call.args[1]
    if (str(a.data_layout), str(a.kernel_layout), str(a.out_layout)) != ("NHWC", "OHWI", "NHWC") or \
            not isinstance(w, tvm.ir.expr.Constant) or str(w.ty.dtype) != "float32":
        return None
    ints = lambda xs: [int(x) for x in xs]                          # noqa: E731
    return ints(a.strides), ints(a.padding), ints(a.dilation), int(a.groups)


def _padded_weight(w, padded: int):
    """An OHWI weight (numpy) with zero output channels added up to ``padded``."""
    wp = np.zeros((padded, *w.shape[1:]), w.dtype)
    wp[:w.shape[0]] = w
    return wp


def _sliced(y, co: int):
    """The first ``co`` channels of an NHWC tensor (the real ones of a padded convolution)."""
    return te.compute((*y.shape[:3], co), lambda n, h, w_, c: y[n, h, w_, c], name="T_strided_slice")


#: elementwise ops that may sit between a depthwise convolution and the pointwise one it feeds, as
#: TOPI computes them: binary ones take a constant second argument, ``relu`` none
SEPARABLE_EPILOGUE = {"relax.add": topi.add, "relax.subtract": topi.subtract, "relax.multiply": topi.multiply,
                      "relax.divide": topi.divide, "relax.maximum": topi.maximum, "relax.minimum": topi.minimum,
                      "relax.nn.relu": topi.nn.relu}
UNARY_EPILOGUE = ("relax.nn.relu",)


def _output_kernel(builder, name: str, compute, *args):
    """``compute`` on ``args`` as one PrimFunc marked output-elementwise fusable (as Relax's own
    conv2d is), so Relax fuses the bias, residual and activation behind it."""
    out = builder.call_te(compute, *args, primfunc_name_hint=name)
    gv = out.args[0]
    builder.update_func(gv, builder.get()[gv].with_attr("op_pattern", 4))  # kOutEWiseFusable
    return out


def pad_output_channels(mod, lanes: int) -> "tvm.IRModule":
    """Each NHWC convolution (constant OHWI weight, one group) whose output channels are not a whole
    number of ``lanes``-wide vectors computes them padded to the next multiple with zero weights, and
    its kernel keeps the real channels (a slice fused as its epilogue, before the bias, residual and
    activation that Relax then fuses behind it), where that adds at most ``PAD_CHANNELS_MAX`` of work.

    MobileNetV2's 24-channel projections on Intel's AVX-512: no register tile covers 24 lanes well (a
    zmm and a ymm, or three half-zmm blocks each loading its broadcast input again), and the tuned
    144->24 kernel ran at 89 GFLOPS where 144->32 runs at 193 (docs/decisions.md, session 63).
    ``lanes`` is ``pad_lanes``' width in a model."""

    @relax.expr_functor.mutator
    class _Pad(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            attrs = _conv_attrs(call)
            if attrs is None or attrs[3] != 1:
                return call
            strides, padding, dilation, _ = attrs
            w = call.args[1].value.numpy()
            co = w.shape[0]
            padded = padded_channels(co, lanes)
            if padded == co:
                return call

            def padded_conv(x, filt):
                y = topi.nn.conv(x, filt, stride=strides, padding=padding, dilation=dilation,
                                 groups=1, data_layout="NHWC", kernel_layout="OHWI")
                return _sliced(y, co)
            return _output_kernel(self.builder_, "conv2d_padded", padded_conv, call.args[0],
                                  relax.const(_padded_weight(w, padded)))

    return mutate_each(mod, _Pad)


def fuse_input_transpose(mod, lanes: int) -> "tvm.IRModule":
    """Each NHWC convolution whose input is an NCHW tensor transposed (the model's input:
    ``ConvertLayout`` transposes it at the edge) reads the NCHW tensor itself, so the transpose
    happens in the convolution's padding pass (the expert template inlines it there) instead of in
    a kernel of its own that writes a copy (MobileNetV2's 224x224x3 input: 0.03 ms of 2.3 in the
    model); other readers of the transposed tensor keep the transpose.  Output channels are padded
    as ``pad_output_channels`` does."""

    @relax.expr_functor.mutator
    class _Transposed(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            attrs = _conv_attrs(call)
            x = call.args[0]
            if attrs is None or not isinstance(x, relax.Var):
                return call
            t = self.lookup_binding(x)
            if not (isinstance(t, relax.Call) and isinstance(t.op, tvm.ir.Op) and t.op.name == "relax.permute_dims"
                    and t.attrs.axes is not None and [int(a) for a in t.attrs.axes] == [0, 2, 3, 1]):
                return call
            strides, padding, dilation, groups = attrs
            w = call.args[1].value.numpy()
            co = w.shape[0]
            padded = padded_channels(co, lanes) if groups == 1 else co

            def transposed_conv(data, filt):
                y = topi.nn.conv(topi.transpose(data, [0, 2, 3, 1]), filt, stride=strides, padding=padding,
                                 dilation=dilation, groups=groups, data_layout="NHWC", kernel_layout="OHWI")
                return y if padded == co else _sliced(y, co)
            weight = call.args[1] if padded == co else relax.const(_padded_weight(w, padded))
            return _output_kernel(self.builder_, "conv2d_nchw_input", transposed_conv, t.args[0], weight)

    return mutate_each(mod, _Transposed)


def cache_bytes(index: int, default: int = 1 << 20) -> int:
    """Bytes of cpu0's cache ``index`` (Linux sysfs: 2 is the L2, 3 the last level on x86), ``default``
    where that cannot be read."""
    try:
        size = Path(f"/sys/devices/system/cpu/cpu0/cache/index{index}/size").read_text().strip()
        return int(size[:-1]) * {"K": 1 << 10, "M": 1 << 20}[size[-1]] if size[-1] in "KM" else int(size)
    except (OSError, ValueError, IndexError, KeyError):
        return default


def l2_bytes() -> int:
    """Bytes of L2 cache per core of this CPU (Linux sysfs), 1 MiB where that cannot be read."""
    return cache_bytes(2)


def _pointwise(call) -> bool:
    """Whether ``call`` is a 1x1, stride-1, unpadded, ungrouped NHWC convolution with a constant weight."""
    attrs = _conv_attrs(call)
    return attrs is not None and attrs[3] == 1 and call.args[1].value.shape[1:3] == (1, 1) \
        and attrs[0] == [1, 1] and not any(attrs[1])


def fuse_separable(mod, lanes: int, l2_total: int | None = None, pad: int | None = None) -> "tvm.IRModule":
    """Each depthwise convolution whose (bias, activation) output feeds a 1x1 convolution only
    becomes one kernel with it (a depthwise-separable block's second half: MobileNetV2's depthwise
    and projection), which the expert template schedules with the depthwise rows of each output tile
    computed into registers and a stack buffer just before the pointwise micro-kernel reads them.

    Apart, the depthwise output makes a round trip through memory (1.6-1.8 MB at MobileNetV2's
    112x112x32 and 56x56x144, about L2's size); fused, each tile's rows stay in L1.  The pointwise
    output channels are padded as ``pad_output_channels`` does, to whole ``pad``-wide vectors
    (default ``lanes``).  The two stay apart where the depthwise channels are not whole vectors, the
    ops between are other than ``SEPARABLE_EPILOGUE``, or the pointwise weight is larger than the
    depthwise output (more output channels than pixels): each parallel tile would read the whole
    weight again, where apart the pointwise kernel reads each weight block once (MobileNetV2's 7x7
    layers, 960x320 weights for 49 pixels: 0.135 ms fused, 0.108 apart; docs/decisions.md, session 65).

    Where the (padded) depthwise convolution's input is a 1x1 convolution's (bias, activation)
    output larger than ``l2_total`` bytes (the cores' L2 together) that only it reads, that 1x1
    convolution joins the kernel too (an inverted residual's expansion: MobileNetV2's 112x112x96,
    4.8 MB): apart, the expanded tensor goes out to L3 and comes back; the template computes it in
    bands of rows that stay in L2 (``expert._expansion_at``)."""
    uses = _uses(mod)

    @relax.expr_functor.mutator
    class _Separable(relax.PyExprMutator):
        def _expansion(self, expr):
            """(the 1x1 convolution, its epilogue) computing a depthwise convolution's input ``expr``
            where that is larger than ``l2_total`` and only the depthwise convolution reads it."""
            if l2_total is None or math.prod(int(d) for d in expr.ty.shape) * 4 <= l2_total:
                return None
            found = _epilogue(self, uses, expr)
            return (found[1], found[0]) if found and found[0] and _pointwise(found[1]) else None

        def visit_call_(self, call):
            call = super().visit_call_(call)
            found = _epilogue(self, uses, call.args[0]) if _pointwise(call) else None
            if not found or not found[0] or _conv_attrs(found[1]) is None:
                return call
            epilogue, x = found
            strides, padding, dilation, groups = _conv_attrs(x)
            channels = int(x.args[0].ty.shape[3])
            if groups != channels or int(x.args[1].ty.shape[0]) != channels or channels % lanes:
                return call
            w = call.args[1].value.numpy()
            co = w.shape[0]
            if co > int(x.ty.shape[1]) * int(x.ty.shape[2]):
                return call                     # the pointwise weight outweighs the depthwise output
            padded = padded_channels(co, pad or lanes)
            expansion = self._expansion(x.args[0]) if any(padding) else None
            exp_epilogue = expansion[1] if expansion else []

            def separable(data, *args):
                args = list(args)
                if expansion:
                    data = topi.nn.conv(data, args.pop(0), stride=1, padding=0, dilation=1, groups=1,
                                        data_layout="NHWC", kernel_layout="OHWI")
                    for op, const in reversed(exp_epilogue):
                        data = op(data) if const is None else op(data, args.pop(0))
                dw_filt, proj_filt, *consts = args
                y = topi.nn.conv(data, dw_filt, stride=strides, padding=padding, dilation=dilation,
                                 groups=channels, data_layout="NHWC", kernel_layout="OHWI")
                for op, const in reversed(epilogue):
                    y = op(y) if const is None else op(y, consts.pop(0))
                y = topi.nn.conv(y, proj_filt, stride=1, padding=0, dilation=1, groups=1,
                                 data_layout="NHWC", kernel_layout="OHWI")
                return y if padded == co else _sliced(y, co)
            consts = [c for _, c in reversed(epilogue) if c is not None]
            proj = relax.const(w if padded == co else _padded_weight(w, padded))
            if expansion:
                e = expansion[0]
                inputs = [e.args[0], e.args[1], *[c for _, c in reversed(exp_epilogue) if c is not None]]
                return _output_kernel(self.builder_, "expanded_separable_conv2d", separable, *inputs,
                                      x.args[1], proj, *consts)
            return _output_kernel(self.builder_, "separable_conv2d", separable, x.args[0], x.args[1], proj, *consts)

    return mutate_each(mod, _Separable)


#: the most bytes of one channel block's expansion (all its pixels) that ``fuse_expansion_depthwise``
#: lets a kernel hold: a quarter of L2, so the block's input rows and weights stay beside it
EXPANSION_BLOCK_SHARE = 4


def fuse_expansion_depthwise(mod, lanes: int, l2: int | None = None) -> "tvm.IRModule":
    """Each depthwise convolution that ``fuse_separable`` left apart (its 1x1 consumer has more
    output channels than it has pixels) and whose input is a 1x1 convolution's (bias, activation)
    output that only it reads becomes one kernel with that expansion.  A depthwise convolution mixes
    no channels, so the expert template runs blocks of channels in parallel, each computing its
    slice of the expansion over the whole image into a buffer (no halo recomputed) and the
    depthwise convolution on it: the expanded tensor never goes to memory, and one kernel launch
    goes.  Only where a block's slice of ``lanes`` channels takes at most ``l2 / EXPANSION_BLOCK_SHARE``
    bytes (MobileNetV2's 7x7 layers, 160->960 then the 960-channel depthwise: 9 KB)."""
    uses = _uses(mod)
    budget = (l2 or l2_bytes()) // EXPANSION_BLOCK_SHARE

    @relax.expr_functor.mutator
    class _ExpandedDepthwise(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            attrs = _conv_attrs(call)
            if attrs is None:
                return call
            strides, padding, dilation, groups = attrs
            channels = int(call.args[0].ty.shape[3])
            if groups != channels or int(call.args[1].ty.shape[0]) != channels or channels % lanes:
                return call
            found = _epilogue(self, uses, call.args[0])
            if not found or not found[0] or not _pointwise(found[1]):
                return call
            epilogue, expansion = found
            if int(expansion.ty.shape[1]) * int(expansion.ty.shape[2]) * lanes * 4 > budget:
                return call

            def expanded_depthwise(data, weight, *args):
                args = list(args)
                x = topi.nn.conv(data, weight, stride=1, padding=0, dilation=1, groups=1,
                                 data_layout="NHWC", kernel_layout="OHWI")
                for op, const in reversed(epilogue):
                    x = op(x) if const is None else op(x, args.pop(0))
                return topi.nn.conv(x, args.pop(0), stride=strides, padding=padding, dilation=dilation,
                                    groups=channels, data_layout="NHWC", kernel_layout="OHWI")
            consts = [c for _, c in reversed(epilogue) if c is not None]
            return _output_kernel(self.builder_, "expanded_depthwise_conv2d", expanded_depthwise,
                                  expansion.args[0], expansion.args[1], *consts, call.args[1])

    return mutate_each(mod, _ExpandedDepthwise)


def _producer(mutator, uses, expr):
    """The call that computes ``expr`` where one kernel is its only reader, else None."""
    return mutator.lookup_binding(expr) if isinstance(expr, relax.Var) and uses[expr] == 1 else None


def _epilogue(mutator, uses, expr):
    """(the elementwise ``SEPARABLE_EPILOGUE`` ops computing ``expr``, last first, and the call before
    them), each read by one kernel only; None where one takes a non-constant operand."""
    epilogue, x = [], _producer(mutator, uses, expr)
    while isinstance(x, relax.Call) and isinstance(x.op, tvm.ir.Op) and x.op.name in SEPARABLE_EPILOGUE:
        const = None if x.op.name in UNARY_EPILOGUE else x.args[1]
        if const is not None and not isinstance(const, tvm.ir.expr.Constant):
            return None
        epilogue.append((SEPARABLE_EPILOGUE[x.op.name], const))
        x = _producer(mutator, uses, x.args[0])
    return epilogue, x


def _uses(mod) -> Counter:
    """How many times each variable of ``mod``'s Relax functions is read."""
    counts = Counter()

    @relax.expr_functor.visitor
    class _Uses(relax.PyExprVisitor):
        def visit_var_(self, var):
            counts[var] += 1

        def visit_dataflow_var_(self, var):
            counts[var] += 1

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            _Uses().visit_expr(func)
    return counts
