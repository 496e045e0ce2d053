"""Graph optimisation and task extraction (Woodpecker-DL's graph level, done with Relax's passes).

``optimise`` folds explicit zero pads into the convolution after them and reads an importer's
stacked two-input reductions as the elementwise ops they are, folds BatchNorm into the preceding convolution's weights, decomposes what is left of
the inference-only ops into elementwise arithmetic and folds constants; Relax's "zero" pipeline
(legalise, annotate, fold, fuse, FuseTIR) then fuses every conv/matmul with its elementwise
epilogue, so each task is one kernel.  The same pipeline runs again at compile time with the
tuning database applied, which is why tasks are keyed by the structurally identical PrimFuncs.
Layout: the whole graph runs NHWC (``ConvertLayout`` to NHWC/OHWI after BatchNorm folding, which
handles OIHW only), with layout transforms only at the model's edges; generated kernels are tuned in
the layout they run in, and oneDNN reads NHWC as channels-last with no copy (``library``).
Weights are marked layout-free (``AttachAttrLayoutFreeBuffers``,
as TVM's own ``static_shape_tuning`` pipeline does on CPU), so each tuned schedule may choose the
weight layout its loops read contiguously (MetaSchedule's ``RewriteLayout``), and compilation
pre-transforms the constant weights once (``SplitLayoutRewritePreproc`` + ``FoldConstant``).
"""
from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass

from .._tvm import ms
from ..measure.target import is_cuda

import tvm
from tvm import relax


@dataclass
class Task:
    name: str
    weight: int                       # how many times the model calls this kernel
    mod: "tvm.IRModule"               # the PrimFunc to tune, as "main"
    flops: float


def op_counts(mod) -> Counter:
    """How many calls of each Relax operator / fused kernel the module's Relax functions make."""
    counts: Counter = Counter()

    @relax.expr_functor.visitor
    class _Count(relax.PyExprVisitor):
        def visit_call_(self, call):
            if isinstance(call.op, tvm.ir.Op):
                name = call.op.name
                if name == "relax.call_tir":
                    counts["kernel:" + call.args[0].name_hint] += 1
                else:
                    counts[name.removeprefix("relax.")] += 1
            super().visit_call_(call)

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            _Count().visit_expr(func)
    return counts


GRAPH_PASSES = ("PairwiseReductions", "FoldPads", "RecogniseGelu", "FoldBatchnormToConv2D",
                "DecomposeOpsForInference", "FoldConstant", "DecomposeClip", "SinkReshapes",
                "ConvertLayout(NHWC)", "FoldConstant")
LAYOUT = {"relax.nn.conv2d": ["NHWC", "OHWI"]}


def _each_function(mod, rewrite) -> "tvm.IRModule":
    """``mod`` with ``rewrite`` applied to each of its Relax functions (PrimFuncs as they are)."""
    return tvm.IRModule({gv: rewrite(f) if isinstance(f, relax.Function) else f for gv, f in mod.functions_items()},
                        attrs=mod.attrs)


def decompose_clip(mod) -> "tvm.IRModule":
    """``clip(x, lo, hi)`` -> ``minimum(maximum(x, lo), hi)``: Relax's ``clip`` has no layout
    inference, so ConvertLayout would wrap every ReLU6 in two transposes (MobileNetV2: 70)."""
    from tvm.relax.dpl import is_op, rewrite_call, wildcard

    def rewriter(call, _):
        x, (lo, hi) = call.args[0], (float(getattr(a.value, "value", a.value)) for a in call.args[1:3])
        dtype = str(x.ty.dtype)
        return relax.op.minimum(relax.op.maximum(x, relax.const(lo, dtype)), relax.const(hi, dtype))
    pattern = is_op("relax.clip")(wildcard(), wildcard(), wildcard())
    return _each_function(mod, lambda f: rewrite_call(pattern, rewriter, f))


def fold_pads(mod) -> "tvm.IRModule":
    """``conv2d(pad(x))`` -> ``conv2d(x)`` with the pad in the conv's own (possibly asymmetric)
    padding, for a zero ``constant`` pad of the spatial axes only.  TensorFlow-style "same" padding
    (HF MobileNetV2's ``tf_padding``) puts such a pad before every convolution: a copy per layer, and
    a conv the library's chains cannot see past (52 pads in MobileNetV2)."""
    from tvm.relax.dpl import is_op, rewrite_call, wildcard

    pad = is_op("relax.nn.pad")(wildcard())
    pattern = is_op("relax.nn.conv2d")(pad, wildcard())

    def rewriter(call, matches):
        p, a = matches[pad].attrs, call.attrs
        if p.pad_mode != "constant" or float(p.pad_value) != 0.0:
            return call
        widths = [int(w) for w in p.pad_width]
        layout = str(a.data_layout)
        spatial = {layout.index("H"), layout.index("W")}
        if any(widths[2 * i] or widths[2 * i + 1] for i in range(len(layout)) if i not in spatial) or min(widths) < 0:
            return call
        h, w = layout.index("H"), layout.index("W")
        top, left, bottom, right = (int(x) for x in a.padding)
        padding = (top + widths[2 * h], left + widths[2 * w], bottom + widths[2 * h + 1], right + widths[2 * w + 1])
        return relax.op.nn.conv2d(matches[pad].args[0], call.args[1], a.strides, padding, a.dilation, a.groups,
                                  a.data_layout, a.kernel_layout, a.out_layout, a.out_dtype)
    return _each_function(mod, lambda f: rewrite_call(pattern, rewriter, f))


def pairwise_reductions(mod) -> "tvm.IRModule":
    """``max(stack([broadcast_to(a), broadcast_to(b)]), axis=0)`` -> ``maximum(a, b)`` (and ``min``,
    ``sum``): TVM's ONNX importer writes a two-input ``Max``/``Min``/``Sum`` with static shapes as
    two broadcast copies, a stack and a reduction, which no chain pattern or layout rule reads as
    the elementwise op it is (``Clip``'s bounds, see ``frontends.onnx._clip_as_max_min``)."""
    from tvm.relax.dpl import is_op, is_tuple, rewrite_call, wildcard

    a, b = wildcard(), wildcard()
    stack = is_op("relax.stack")(is_tuple([is_op("relax.broadcast_to")(a, wildcard()),
                                           is_op("relax.broadcast_to")(b, wildcard())]))
    binary = {"relax.max": relax.op.maximum, "relax.min": relax.op.minimum, "relax.sum": relax.op.add}
    pattern = functools.reduce(lambda x, y: x | y, [is_op(name)(stack) for name in binary])

    def rewriter(call, matches):
        if int(matches[stack].attrs.axis) != 0 or [int(x) for x in call.attrs.axis or ()] != [0] or \
                call.attrs.keepdims:
            return call
        return binary[call.op.name](matches[a], matches[b])
    return _each_function(mod, lambda f: rewrite_call(pattern, rewriter, f))


def recognise_gelu(mod) -> "tvm.IRModule":
    """``x * (erf(x / sqrt 2) + 1) * 0.5`` -> ``gelu(x)``: an ONNX export before opset 20 writes
    GELU out as Div, Erf, Add, Mul, Mul (BERT, ViT, ConvNeXt), five kernels' worth of elementwise
    work that oneDNN takes as one post-op of the dense call once it is a ``gelu`` again.  Likewise
    GPT-2's tanh approximation, written out in its PyTorch code, -> ``gelu_tanh(x)``."""
    from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

    x, c_in, one, half = wildcard(), is_const(), is_const(), is_const()
    erf = is_op("relax.erf")(is_op("relax.divide")(x, c_in) | is_op("relax.multiply")(x, c_in))
    t = is_op("relax.add")(erf, one) | is_op("relax.add")(one, erf)
    xt = is_op("relax.multiply")(x, t) | is_op("relax.multiply")(t, x)
    pattern = is_op("relax.multiply")(xt, half) | is_op("relax.multiply")(half, xt)

    def value(c):
        a = c.value.numpy()
        return float(a.reshape(())) if a.size == 1 else float("nan")

    def rewriter(call, matches):
        scale = value(matches[c_in])
        by = scale if matches[erf].args[0].op.name == "relax.divide" else 1.0 / scale if scale else 0.0
        if abs(by - 2 ** 0.5) > 1e-4 or value(matches[one]) != 1.0 or value(matches[half]) != 0.5:
            return call
        return relax.op.nn.gelu(matches[x])
    # GPT-2's gelu_new: 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3)))
    y, three, k, s2pi, one_t, half_t = wildcard(), is_const(), is_const(), is_const(), is_const(), is_const()
    cube = is_op("relax.multiply")(is_op("relax.power")(y, three), k) | \
        is_op("relax.multiply")(k, is_op("relax.power")(y, three))
    inner = is_op("relax.add")(y, cube) | is_op("relax.add")(cube, y)
    th = is_op("relax.tanh")(is_op("relax.multiply")(inner, s2pi) | is_op("relax.multiply")(s2pi, inner))
    u = is_op("relax.add")(th, one_t) | is_op("relax.add")(one_t, th)
    hy = is_op("relax.multiply")(y, half_t) | is_op("relax.multiply")(half_t, y)
    tanh_form = is_op("relax.multiply")(hy, u) | is_op("relax.multiply")(u, hy)

    def tanh_rewriter(call, matches):
        want = {three: 3.0, k: 0.044715, s2pi: (2 / 3.141592653589793) ** 0.5, one_t: 1.0, half_t: 0.5}
        if any(abs(value(matches[c]) - v) > 1e-5 for c, v in want.items()):
            return call
        return relax.op.nn.gelu_tanh(matches[y])

    def each(f):
        return rewrite_call(tanh_form, tanh_rewriter, rewrite_call(pattern, rewriter, f))
    return _each_function(mod, each)


UNARY_ELEMENTWISE = ("relax.nn.relu", "relax.nn.gelu", "relax.nn.gelu_tanh", "relax.sigmoid", "relax.tanh",
                     "relax.nn.silu")


def sink_reshapes(mod) -> "tvm.IRModule":
    """Move reshapes below what a dense layer's library call can absorb, then merge consecutive
    reshapes: PyTorch's 3-D ``Linear`` imports as reshape, matmul, add, reshape, so BERT's GELU and
    every transformer's residual add sat behind a reshape where no chain pattern could take them
    into the dense layer's call.

    * ``act(reshape(x))`` -> ``reshape(act(x))`` for elementwise activations;
    * ``reshape(dense) + r`` -> ``reshape(dense + reshape(r))`` where ``dense`` is a matmul with a
      constant weight (+ a constant bias) and ``r`` has the reshape's shape (no broadcast): the
      residual's reshape is a view."""
    from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

    reshape = is_op("relax.reshape")(wildcard(), wildcard())

    def rewriter(call, matches):
        inner = matches[reshape]
        return relax.op.reshape(relax.Call(call.op, [inner.args[0]], call.attrs), inner.args[1])
    pattern = functools.reduce(lambda a, b: a | b, [is_op(name)(reshape) for name in UNARY_ELEMENTWISE])

    dense = is_op("relax.matmul")(wildcard(), is_const())
    dense = dense | is_op("relax.add")(dense, is_const()) | is_op("relax.add")(is_const(), dense)
    flat = is_op("relax.reshape")(dense, wildcard())
    residual = wildcard()
    add = is_op("relax.add")(flat, residual) | is_op("relax.add")(residual, flat)

    def residual_rewriter(call, matches):
        inner, r = matches[flat], matches[residual]
        y = inner.args[0]
        try:
            same = [int(d) for d in r.ty.shape] == [int(d) for d in call.ty.shape]
        except (TypeError, AttributeError):                 # symbolic or unknown shapes
            return call
        if not same:
            return call
        r = relax.op.reshape(r, y.ty.shape)
        return relax.op.reshape(relax.op.add(*((y, r) if call.args[0].same_as(inner) else (r, y))), inner.args[1])

    def each(f):
        return rewrite_call(add, residual_rewriter, rewrite_call(pattern, rewriter, f))
    return relax.transform.RemoveRedundantReshape()(_each_function(mod, each))


def optimise(mod) -> "tvm.IRModule":
    """The graph passes we run before Relax's fusion pipeline (see module docstring).

    The layout pass runs only on graphs with a convolution; where TVM's ConvertLayout fails (it
    aborts on ``topk`` in 0.27) the graph stays NCHW, with one warning."""
    mod = tvm.transform.Sequential([
        relax.transform.FoldBatchnormToConv2D(), relax.transform.DecomposeOpsForInference(),
        relax.transform.FoldConstant()])(recognise_gelu(fold_pads(pairwise_reductions(mod))))
    mod = sink_reshapes(decompose_clip(mod))
    if "nn.conv2d" not in op_counts(mod):
        return mod
    try:
        nhwc = relax.transform.ConvertLayout(LAYOUT)(mod)
    except tvm.error.InternalError as e:
        import sys
        print(f"adaptune: warning: the graph stays NCHW (TVM's ConvertLayout failed: {str(e).strip()[:100]})",
              file=sys.stderr)
        return mod
    return relax.transform.FoldConstant()(nhwc)


#: a convolution's output channels are padded to whole vectors only where that adds at most this share of work
PAD_CHANNELS_MAX = 4 / 3


def padded_channels(co: int, lanes: int) -> int:
    """``co`` rounded up to whole ``lanes``-wide vectors where that adds at most ``PAD_CHANNELS_MAX``
    of work, else ``co``."""
    padded = -(-co // lanes) * lanes
    return co if padded > PAD_CHANNELS_MAX * co else padded


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
    import numpy as np
    wp = np.zeros((padded, *w.shape[1:]), w.dtype)
    wp[:w.shape[0]] = w
    return wp


def _sliced(y, co: int):
    """The first ``co`` channels of an NHWC tensor (the real ones of a padded convolution)."""
    from tvm import te
    return te.compute((*y.shape[:3], co), lambda n, h, w_, c: y[n, h, w_, c], name="T_strided_slice")


#: elementwise ops that may sit between a depthwise convolution and the pointwise one it feeds:
#: (op, whether its second argument is a constant it takes)
SEPARABLE_EPILOGUE = {"relax.add": True, "relax.subtract": True, "relax.multiply": True, "relax.divide": True,
                      "relax.maximum": True, "relax.minimum": True, "relax.nn.relu": False}


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

    MobileNetV2's 24-channel projections on AVX-512: no register tile covers 24 lanes well (a zmm and
    a ymm, or three half-zmm blocks each loading its broadcast input again), and the tuned 144->24
    kernel ran at 89 GFLOPS where 144->32 runs at 193 (docs/decisions.md, session 63)."""
    from tvm import topi

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

    return _mutate_each(mod, _Pad)


def fuse_separable(mod, lanes: int) -> "tvm.IRModule":
    """Each depthwise convolution whose (bias, activation) output feeds a 1x1 convolution only
    becomes one kernel with it (a depthwise-separable block's second half: MobileNetV2's depthwise
    and projection), which the expert template schedules with the depthwise rows of each output tile
    computed into registers and a stack buffer just before the pointwise micro-kernel reads them.

    Apart, the depthwise output makes a round trip through memory (1.6-1.8 MB at MobileNetV2's
    112x112x32 and 56x56x144, about L2's size); fused, each tile's rows stay in L1.  The pointwise output channels are padded as
    ``pad_output_channels`` does.  The two stay apart where the depthwise channels are not whole
    vectors, the ops between are other than ``SEPARABLE_EPILOGUE``, or the pointwise weight is larger
    than the depthwise output (more output channels than pixels): each parallel tile would read the
    whole weight again, where apart the pointwise kernel reads each weight block once
    (MobileNetV2's 7x7 layers, 960x320 weights for 49 pixels: 0.135 ms fused, 0.108 apart)."""
    from tvm import topi

    uses = _uses(mod)

    @relax.expr_functor.mutator
    class _Separable(relax.PyExprMutator):
        def _producer(self, expr):
            """The call that computes ``expr`` where this kernel is its only reader, else None."""
            return self.lookup_binding(expr) if isinstance(expr, relax.Var) and uses[expr] == 1 else None

        def visit_call_(self, call):
            call = super().visit_call_(call)
            attrs = _conv_attrs(call)
            if attrs is None or attrs[3] != 1 or call.args[1].value.shape[1:3] != (1, 1) \
                    or attrs[0] != [1, 1] or any(attrs[1]):
                return call
            epilogue, x = [], self._producer(call.args[0])
            while isinstance(x, relax.Call) and isinstance(x.op, tvm.ir.Op) and x.op.name in SEPARABLE_EPILOGUE:
                takes_const = SEPARABLE_EPILOGUE[x.op.name]
                if takes_const and not isinstance(x.args[1], tvm.ir.expr.Constant):
                    return call
                epilogue.append((x.op.name, x.args[1] if takes_const else None))
                x = self._producer(x.args[0])
            dw = _conv_attrs(x)
            if not epilogue or dw is None:
                return call
            strides, padding, dilation, groups = dw
            channels = int(x.args[0].ty.shape[3])
            if groups != channels or int(x.args[1].ty.shape[0]) != channels or channels % lanes:
                return call
            w = call.args[1].value.numpy()
            co = w.shape[0]
            if co > int(x.ty.shape[1]) * int(x.ty.shape[2]):
                return call                     # the pointwise weight outweighs the depthwise output
            padded = padded_channels(co, lanes)
            ops = {"relax.add": topi.add, "relax.subtract": topi.subtract, "relax.multiply": topi.multiply,
                   "relax.divide": topi.divide, "relax.maximum": topi.maximum, "relax.minimum": topi.minimum}

            def separable(data, dw_filt, proj_filt, *consts):
                y = topi.nn.conv(data, dw_filt, stride=strides, padding=padding, dilation=dilation,
                                 groups=channels, data_layout="NHWC", kernel_layout="OHWI")
                consts = list(consts)
                for name, const in reversed(epilogue):
                    y = topi.nn.relu(y) if const is None else ops[name](y, consts.pop(0))
                y = topi.nn.conv(y, proj_filt, stride=1, padding=0, dilation=1, groups=1,
                                 data_layout="NHWC", kernel_layout="OHWI")
                return y if padded == co else _sliced(y, co)
            consts = [c for _, c in reversed(epilogue) if c is not None]
            proj = relax.const(w if padded == co else _padded_weight(w, padded))
            return _output_kernel(self.builder_, "separable_conv2d", separable, x.args[0], x.args[1], proj, *consts)

    return _mutate_each(mod, _Separable)


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


def _mutate_each(mod, mutator_class) -> "tvm.IRModule":
    """``mod`` with ``mutator_class``'s rewrite applied to each Relax function, dead bindings removed."""
    mutator = mutator_class(mod)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gv, mutator.visit_expr(func))
    return relax.transform.DeadCodeElimination()(mutator.builder_.get())


def fuse(mod, target) -> "tvm.IRModule":
    """Relax's legalise + fuse pipeline, then weights marked layout-free (the tasks are these PrimFuncs).

    ``exp``, ``erf``, ``tanh`` and ``softmax`` first become TVM's fast versions (``FastMathTransform``:
    polynomials LLVM vectorises, ~1e-7 relative error; the libm calls they replace run one element
    at a time: BERT's softmax 0.64 -> 0.24 ms untuned).  After ``library.offload``, so oneDNN's
    post-ops still see the plain ops.  On x86, convolutions with output channels short of whole
    vectors are padded first (``pad_output_channels``), after each depthwise convolution and the
    1x1 one it feeds became one kernel (``fuse_separable``)."""
    from ..search.expert import x86_lanes
    lanes = x86_lanes(target)
    if lanes:
        mod = pad_output_channels(fuse_separable(mod, lanes), lanes)
    with target, tvm.transform.PassContext(opt_level=3):
        mod = relax.get_pipeline("zero")(relax.transform.FastMathTransform()(mod))
        return relax.transform.AttachAttrLayoutFreeBuffers()(mod)


def apply_database(fused, database, target) -> "tvm.IRModule":
    """Replace each kernel by its best record, then pre-transform the weights it rewrote."""
    with target, database, tvm.transform.PassContext(opt_level=3):
        return tvm.transform.Sequential([
            relax.transform.MetaScheduleApplyDatabase(enable_warning=False),
            relax.transform.SplitLayoutRewritePreproc(),
            relax.transform.LiftTransformParams(),
            relax.transform.FoldConstant(),
        ])(fused)


GPU_RULES = ("Matmul", "GEMV", "Reduction", "GeneralReduction", "Fallback")


def _gpu_rules():
    from tvm.s_tir import dlight as dl
    return [getattr(dl.gpu, r)() for r in GPU_RULES]


def gpu_default_schedule(mod, target) -> "tvm.IRModule":
    """On a GPU every kernel needs its loops bound to threads: the kernels no record scheduled get
    TVM's default GPU schedules (dlight: matmul, GEMV, reductions, else one thread per element).
    A CPU module is returned as it is (TVM lowers unscheduled loops serially there)."""
    from tvm.s_tir import dlight as dl
    if not is_cuda(target):
        return mod
    with target:
        return dl.ApplyDefaultSchedule(*_gpu_rules())(mod)


def gpu_kernel_schedule(mod, target):
    """``gpu_default_schedule`` of one kernel ("main") as an ``s_tir.Schedule``, with its trace."""
    for rule in _gpu_rules():
        sch = rule.apply(mod["main"], target, False)
        if sch is not None:
            return sch[0] if isinstance(sch, list) else sch
    raise ValueError("no default GPU schedule applies to this kernel")


def extract_tasks(optimised, target) -> tuple[list[Task], dict]:
    """Tasks of an optimised module (heaviest first) and a summary of what the passes did."""
    from tvm.s_tir.analysis import estimate_tir_flops
    fused = fuse(optimised, target)
    tasks = []
    for tk in ms.relax_integration.extract_tasks(fused, target):
        try:
            flops = float(estimate_tir_flops(tk.mod))
        except Exception:          # e.g. data-dependent loops: treat as not worth tuning for long
            flops = 0.0
        tasks.append(Task(tk.task_name, int(tk.weight), tk.mod, flops))
    tasks.sort(key=lambda t: (-t.flops * t.weight, t.name))
    kernels = {k: v for k, v in op_counts(fused).items() if k.startswith("kernel:")}
    summary = {"passes": list(GRAPH_PASSES) + ["LegalizeOps", "AnnotateTIROpPattern", "FoldConstant",
                                                "FuseOps", "FuseTIR"],
               "kernel_calls": sum(kernels.values()), "tasks": len(tasks)}
    return tasks, summary


def pass_report(frontend_mod, optimised) -> dict:
    """Operator counts before and after the graph passes (for the CLI and the report)."""
    before, after = op_counts(frontend_mod), op_counts(optimised)
    return {"before": dict(sorted(before.items())), "after": dict(sorted(after.items())),
            "ops_before": sum(before.values()), "ops_after": sum(after.values())}
