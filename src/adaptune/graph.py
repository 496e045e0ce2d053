"""Graph optimisation and task extraction (Woodpecker-DL's graph level, done with Relax's passes).

``optimise`` folds BatchNorm into the preceding convolution's weights, decomposes what is left of
the inference-only ops into elementwise arithmetic and folds constants; Relax's "zero" pipeline
(legalise, annotate, fold, fuse, FuseTIR) then fuses every conv/matmul with its elementwise
epilogue, so each task is one kernel.  The same pipeline runs again at compile time with the
tuning database applied, which is why tasks are keyed by the structurally identical PrimFuncs.
Layout: activations stay NCHW; weights are marked layout-free (``AttachAttrLayoutFreeBuffers``,
as TVM's own ``static_shape_tuning`` pipeline does on CPU), so each tuned schedule may choose the
weight layout its loops read contiguously (MetaSchedule's ``RewriteLayout``), and compilation
pre-transforms the constant weights once (``SplitLayoutRewritePreproc`` + ``FoldConstant``).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ._tvm import ms

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


GRAPH_PASSES = ("FoldBatchnormToConv2D", "DecomposeOpsForInference", "FoldConstant")


def optimise(mod) -> "tvm.IRModule":
    """The graph passes we run before Relax's fusion pipeline (see module docstring)."""
    return tvm.transform.Sequential([getattr(relax.transform, p)() for p in GRAPH_PASSES])(mod)


def fuse(mod, target) -> "tvm.IRModule":
    """Relax's legalise + fuse pipeline, then weights marked layout-free (the tasks are these PrimFuncs)."""
    with target, tvm.transform.PassContext(opt_level=3):
        mod = relax.get_pipeline("zero")(mod)
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
