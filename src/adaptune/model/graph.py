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
pre-transforms the constant weights once (``SplitLayoutRewritePreproc``, then ``constants``).
"""
from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass

from .._tvm import ms
from ..measure.target import is_cuda
from .constants import fold_calls, fold_constants
from .functions import each_function
from .kernel_rewrites import (conv_output_channels, fuse_expansion_depthwise, fuse_input_transpose,
                              fuse_separable, l2_bytes, pad_lanes, pad_output_channels)

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


def decompose_clip(mod) -> "tvm.IRModule":
    """``clip(x, lo, hi)`` -> ``minimum(maximum(x, lo), hi)``: Relax's ``clip`` has no layout
    inference, so ConvertLayout would wrap every ReLU6 in two transposes (MobileNetV2: 70)."""
    from tvm.relax.dpl import is_op, rewrite_call, wildcard

    def rewriter(call, _):
        x, (lo, hi) = call.args[0], (float(getattr(a.value, "value", a.value)) for a in call.args[1:3])
        dtype = str(x.ty.dtype)
        return relax.op.minimum(relax.op.maximum(x, relax.const(lo, dtype)), relax.const(hi, dtype))
    pattern = is_op("relax.clip")(wildcard(), wildcard(), wildcard())
    return each_function(mod, lambda f: rewrite_call(pattern, rewriter, f))


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
    return each_function(mod, lambda f: rewrite_call(pattern, rewriter, f))


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
    return each_function(mod, lambda f: rewrite_call(pattern, rewriter, f))


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
    return each_function(mod, each)


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
    return relax.transform.RemoveRedundantReshape()(each_function(mod, each))


_OPTIMISED: dict[int, tuple] = {}      # ``optimise``'s latest results: id(input) -> (input, result)
OPTIMISED_KEPT = 2


def optimise(mod) -> "tvm.IRModule":
    """The graph passes we run before Relax's fusion pipeline (see module docstring).

    The layout pass runs only on graphs with a convolution; where TVM's ConvertLayout fails (it
    aborts on ``topk`` in 0.27) the graph stays NCHW, with one warning.

    The latest results are kept by input module (the object itself; TVM's passes never change a
    module in place): a model's build race lowers the same graph once per build."""
    hit = _OPTIMISED.get(id(mod))
    if hit is not None and hit[0].same_as(mod):
        return hit[1]
    out = _optimise(mod)
    while len(_OPTIMISED) >= OPTIMISED_KEPT:
        _OPTIMISED.pop(next(iter(_OPTIMISED)))
    _OPTIMISED[id(mod)] = (mod, out)          # holding ``mod`` keeps its id from being reused
    return out


def _optimise(mod) -> "tvm.IRModule":
    mod = tvm.transform.Sequential([
        relax.transform.FoldBatchnormToConv2D(), relax.transform.DecomposeOpsForInference(),
        tvm.transform.module_pass(lambda m, _ctx: fold_constants(m), opt_level=0, name="adaptune.FoldConstants")
    ])(recognise_gelu(fold_pads(pairwise_reductions(mod))))
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
    return fold_constants(nhwc)


def fuse(mod, target) -> "tvm.IRModule":
    """Relax's legalise + fuse pipeline, then weights marked layout-free (the tasks are these PrimFuncs).

    ``exp``, ``erf``, ``tanh`` and ``softmax`` first become TVM's fast versions (``FastMathTransform``:
    polynomials LLVM vectorises, ~1e-7 relative error; the libm calls they replace run one element
    at a time: BERT's softmax 0.64 -> 0.24 ms untuned).  After ``library.offload``, so oneDNN's
    post-ops still see the plain ops.  On x86, convolutions with output channels short of whole
    vectors (``pad_lanes``: half a register where this CPU runs those at the full rate) are padded
    first (``pad_output_channels``), after each depthwise convolution and the
    1x1 one it feeds became one kernel (``fuse_separable``; with the 1x1 expansion before them where
    the expanded tensor outgrows the cores' L2), each depthwise convolution left apart one with the
    1x1 expansion before it (``fuse_expansion_depthwise``) and the model's NCHW input went into
    the convolution that reads it (``fuse_input_transpose``)."""
    from ..search.expert import x86_lanes
    lanes = x86_lanes(target)
    if lanes:
        l2_total = l2_bytes() * int(target.attrs.get("num-cores", 1))
        pad = pad_lanes(target, lanes, conv_output_channels(mod))
        mod = fuse_expansion_depthwise(fuse_separable(mod, lanes, l2_total, pad), lanes, l2_bytes())
        mod = pad_output_channels(fuse_input_transpose(mod, pad), pad)
    with target, tvm.transform.PassContext(opt_level=3):
        mod = relax.get_pipeline("zero")(relax.transform.FastMathTransform()(mod))
        return relax.transform.AttachAttrLayoutFreeBuffers()(mod)


def kernels(fused):
    """(name, PrimFunc, the kernel alone as databases key it) for each kernel of ``fused``."""
    for gv, func in fused.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc):
            yield gv.name_hint, func, tvm.IRModule({"main": func.with_attr("global_symbol", "main")})


def kernel_records(fused, target, record) -> "ms.database.MemoryDatabase":
    """A database with one record per kernel of ``fused``: ``record(name, func, mod)`` gives the
    kernel's record (``mod``: the kernel alone, as databases key it), or None for none."""
    out = ms.database.MemoryDatabase()
    for name, func, mod in kernels(fused):
        rec = record(name, func, mod)
        if rec is not None:
            out.commit_tuning_record(ms.database.TuningRecord(rec.trace, out.commit_workload(rec.workload.mod),
                                                              run_secs=rec.run_secs, target=target,
                                                              args_info=rec.args_info))
    return out


def apply_database(fused, database, target) -> "tvm.IRModule":
    """Replace each kernel by its best record, then pre-transform the weights it rewrote.  The folded
    weights come back as tuples of constants unpacked per kernel call; ``CanonicalizeBindings`` and
    ``DeadCodeElimination`` pass the constants straight to the calls, so the VM does not build and
    take apart ~45 tuples per inference (MobileNetV2: 290 builtin calls -> 100)."""
    with target, database, tvm.transform.PassContext(opt_level=3):
        return tvm.transform.Sequential([
            relax.transform.MetaScheduleApplyDatabase(enable_warning=False),
            relax.transform.SplitLayoutRewritePreproc(),
            relax.transform.LiftTransformParams(),
            tvm.transform.module_pass(lambda m, _ctx: fold_calls(m), opt_level=0, name="adaptune.FoldCalls"),
            relax.transform.FoldConstant(),
            relax.transform.CanonicalizeBindings(),
            relax.transform.DeadCodeElimination(),
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
