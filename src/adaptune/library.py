"""Woodpecker-DL's system-level exploration: per operator, our tuned kernel or the vendor library's.

On this CPU PyTorch's oneDNN convolutions often beat a generated kernel tuned for minutes, so
betting everything on generated code leaves speed behind.  For every convolution and matmul with
constant weights in the optimised graph we time PyTorch's kernel, called from the compiled model
through DLPack (zero-copy, the same path the model uses), against the best tuned kernel of the
fused task that contains it, and keep whichever is faster:

* ``find_ops``: the library-eligible calls of the optimised graph (NCHW/OIHW float32 conv2d,
  2-D matmul), grouped by signature;
* ``plan``: the measured choice per signature (a ``Choice`` table, shown by ``bench``/``report``);
* ``offload``: rewrites the chosen calls into ``R.call_pure_packed("adaptune.torch.*", ...)``.
  The bias/residual/ReLU epilogue around them stays in TVM, where FuseOps fuses it into one
  elementwise kernel; ``schedule_epilogues`` parallelises and vectorises those new kernels, which
  have no tuning record.

The packed functions are registered when this module is imported (``compile.load`` imports it, so
an exported library that calls PyTorch can be loaded in a fresh process).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
import tvm
import tvm_ffi
from tvm import relax

CONV2D, MATMUL = "adaptune.torch.conv2d", "adaptune.torch.matmul"


@tvm_ffi.register_global_func(CONV2D, override=True)
def torch_conv2d(x, w, strides, padding, dilation, groups):
    """PyTorch's conv2d on TVM tensors; padding is Relax's (top, left, bottom, right)."""
    tx, tw = torch.from_dlpack(x), torch.from_dlpack(w)
    top, left, bottom, right = (int(p) for p in padding)
    if (top, left) != (bottom, right):
        tx, pad = F.pad(tx, (left, right, top, bottom)), (0, 0)
    else:
        pad = (top, left)
    with torch.no_grad():
        y = F.conv2d(tx, tw, None, tuple(strides), pad, tuple(dilation), int(groups))
    return tvm.runtime.from_dlpack(y)


@tvm_ffi.register_global_func(MATMUL, override=True)
def torch_matmul(x, w):
    with torch.no_grad():
        return tvm.runtime.from_dlpack(torch.matmul(torch.from_dlpack(x), torch.from_dlpack(w)))


def _shape(expr) -> tuple[int, ...]:
    return tuple(int(d) for d in expr.ty.shape)


@dataclass(frozen=True)
class LibraryOp:
    """One operator signature that PyTorch can run: kind, shapes and (for conv) attributes."""
    kind: str                           # "conv2d" | "matmul"
    data: tuple[int, ...]
    weight: tuple[int, ...]
    out: tuple[int, ...]
    attrs: tuple = ()                   # conv2d: (strides, padding, dilation, groups)

    @property
    def label(self) -> str:
        if self.kind == "conv2d":
            (sh, _), pad, _, g = self.attrs
            return (f"conv2d {self.data[1]}->{self.weight[0]} {self.weight[2]}x{self.weight[3]} "
                    f"s{sh} p{pad[0]}{f' g{g}' if g > 1 else ''} @{self.data[2]}x{self.data[3]}")
        return f"matmul {'x'.join(map(str, self.data))} @ {'x'.join(map(str, self.weight))}"

    @property
    def flops(self) -> float:
        if self.kind == "conv2d":
            return 2.0 * np.prod(self.out) * np.prod(self.weight[1:])
        return 2.0 * np.prod(self.out) * self.weight[0]

    def packed_args(self) -> list:
        if self.kind == "conv2d":
            strides, padding, dilation, groups = self.attrs
            return [relax.ShapeExpr(list(strides)), relax.ShapeExpr(list(padding)),
                    relax.ShapeExpr(list(dilation)), relax.prim_value(groups)]
        return []

    def time(self, *, repeat: int = 10) -> float:
        """Seconds per call of the library kernel through the same DLPack path the model uses."""
        from .compile import time_callable
        rng = np.random.default_rng(0)
        x, w = (tvm.runtime.tensor(rng.standard_normal(s).astype("float32")) for s in (self.data, self.weight))
        if self.kind == "conv2d":
            return time_callable(lambda: torch_conv2d(x, w, *self.attrs), repeat=repeat)
        return time_callable(lambda: torch_matmul(x, w), repeat=repeat)


def _library_op(call) -> LibraryOp | None:
    """The call as a LibraryOp if PyTorch can run it with the weight as a constant, else None."""
    if not isinstance(call.op, tvm.ir.Op) or len(call.args) < 2 or not isinstance(call.args[1], tvm.ir.expr.Constant):
        return None
    try:
        data, weight, out = _shape(call.args[0]), _shape(call.args[1]), _shape(call)
    except (TypeError, AttributeError):           # symbolic or unknown shape
        return None
    if any(str(a.ty.dtype) != "float32" for a in call.args[:2]):
        return None
    if call.op.name == "relax.nn.conv2d":
        a = call.attrs
        if (a.data_layout, a.kernel_layout, a.out_layout) != ("NCHW", "OIHW", "NCHW") or \
                str(a.out_dtype) not in ("float32", ""):
            return None
        attrs = (tuple(int(s) for s in a.strides), tuple(int(p) for p in a.padding),
                 tuple(int(d) for d in a.dilation), int(a.groups))
        return LibraryOp("conv2d", data, weight, out, attrs)
    if call.op.name == "relax.matmul" and len(data) == 2 and len(weight) == 2:
        return LibraryOp("matmul", data, weight, out)
    return None


def _relax_functions(mod):
    return [(gv, f) for gv, f in mod.functions_items() if isinstance(f, relax.Function)]


def find_ops(optimised) -> dict[LibraryOp, int]:
    """Library-eligible operators of an optimised module and how often each is called."""
    found: dict[LibraryOp, int] = {}

    @relax.expr_functor.visitor
    class _Find(relax.PyExprVisitor):
        def visit_call_(self, call):
            op = _library_op(call)
            if op is not None:
                found[op] = found.get(op, 0) + 1
            super().visit_call_(call)

    for _, func in _relax_functions(optimised):
        _Find().visit_expr(func)
    return found


def offload(optimised, ops) -> "tvm.IRModule":
    """Rewrite every call whose signature is in ``ops`` into a call of PyTorch's kernel."""
    ops = set(ops)
    if not ops:
        return optimised

    @relax.expr_functor.mutator
    class _Offload(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            op = _library_op(call)
            if op is None or op not in ops:
                return call
            return relax.call_pure_packed(CONV2D if op.kind == "conv2d" else MATMUL, call.args[0],
                                          call.args[1], *op.packed_args(), ty_args=call.ty)

    mutator = _Offload(optimised)
    for gv, func in _relax_functions(optimised):
        mutator.builder_.update_func(gv, mutator.visit_expr(func))
    return mutator.builder_.get()


def _task_signature(task) -> tuple[set[tuple], tuple]:
    """(shapes of a task's inputs, shape of its output), read off its PrimFunc's buffers."""
    func = task.mod["main"]
    shapes = [tuple(int(d) for d in p.shape) for p in func.params]
    return set(shapes[:-1]), shapes[-1]


def tasks_of(op: LibraryOp, tasks) -> list:
    """Fused tasks that contain ``op``: the op's kind in the name, its inputs and output shapes."""
    hits = []
    for t in tasks:
        if op.kind not in t.name:
            continue
        ins, out = _task_signature(t)
        if op.data in ins and op.weight in ins and out == op.out:
            hits.append(t)
    return hits


@dataclass
class Choice:
    op: LibraryOp
    calls: int
    library_s: float
    generated_s: float | None           # the best record of the fastest task containing the op
    tasks: list[str] = field(default_factory=list)

    @property
    def use_library(self) -> bool:
        return self.generated_s is None or self.library_s < self.generated_s

    def as_dict(self) -> dict:
        return {"op": self.op.label, "calls": self.calls, "library_ms": self.library_s * 1e3,
                "generated_ms": None if self.generated_s is None else self.generated_s * 1e3,
                "tasks": self.tasks, "choice": "pytorch" if self.use_library else "generated"}


def best_record_latency(database, task, target) -> float | None:
    """Mean run time of the task's best record in the TVM database (None: no record)."""
    rec = database.query_tuning_record(task.mod, target, task.name)
    if rec is None or not rec.run_secs:
        return None
    return float(np.mean([float(s) for s in rec.run_secs]))


def plan(optimised, tasks, database, target) -> list[Choice]:
    """Time PyTorch's kernel for every eligible op and compare with the tuned kernel (see module doc).

    The generated side is the fused kernel (conv + epilogue), the library side the bare call:
    the epilogue it leaves behind is a small elementwise kernel, so the choice leans slightly
    towards the library; ``bench`` measures the whole model both ways."""
    choices = []
    for op, calls in find_ops(optimised).items():
        hits = tasks_of(op, tasks)
        lats = [(best_record_latency(database, t, target), t.name) for t in hits]
        lats = [(s, n) for s, n in lats if s is not None]
        generated = min(lats)[0] if lats else None
        choices.append(Choice(op, calls, op.time(), generated, [t.name for t in hits]))
    return choices


def plan_model(model, database, target) -> list[Choice]:
    """``plan`` for a frontend ``Model``: optimise, extract its tasks, measure, choose."""
    from .graph import extract_tasks, optimise
    optimised = optimise(model.mod)
    tasks, _ = extract_tasks(optimised, target)
    return plan(optimised, tasks, database, target)


def chosen(choices) -> list[LibraryOp]:
    """The operators a plan gives to the library (what ``compile.build_tuned`` takes)."""
    return [c.op for c in choices if c.use_library]


def schedule_epilogues(mod) -> "tvm.IRModule":
    """Parallelise and vectorise the unscheduled all-spatial PrimFuncs that ``offload`` leaves.

    Written by hand: TVM's default CPU schedules (dlight.cpu) cover GEMV and reductions only, and
    an elementwise kernel needs nothing more than inline, fuse, parallel, vectorise.  Updates
    ``mod`` in place (a module fresh from ``apply_database``) and returns it."""
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
        except (s_tir.ScheduleError, tvm.TVMError):
            continue
        mod.update_func(gv, sch.mod["main"].with_attr("tirx.is_scheduled", True))
    return mod
