"""Woodpecker-DL's per-operator choice: per chain signature, the library call timed against the
best tuned kernel of the same subgraph, and the epilogue schedule of the library's glue."""
from __future__ import annotations

import sys
from dataclasses import dataclass, field

import numpy as np
import tvm
import tvm_ffi

from ...measure.pipeline import compile_module
from ...measure.target import device, is_cuda
from ..timing import device_exclusive
from .lowering import chain_modules, offload
from .op import LibraryOp
from .patterns import find_ops


#: implementations that call the vendor library (the others are all generated code)
LIBRARY_IMPLS = ("onednn", "winograd")


@dataclass
class Choice:
    op: LibraryOp
    calls: int
    library_s: float | None             # the fused oneDNN call; None: oneDNN failed for this signature
    generated_s: float | None           # the best record of the chain's fused task
    tasks: list[str] = field(default_factory=list)
    winograd_s: float | None = None     # Winograd F(4x4,3x3) (``winograd.py``); None: not applicable
    winograd_generated_s: float | None = None   # the same with its GEMMs generated; None: no tuned GEMM
    winograd2_generated_s: float | None = None  # F(2x2,3x3), GEMMs generated (``winograd.forms``); None: not offered
    own_kernel: bool = True             # False: the generated build runs the chain inside a larger kernel

    @property
    def library_impl(self) -> str | None:
        """The faster library implementation of the chain, or None when the library has none."""
        times = {k: v for k, v in (("onednn", self.library_s), ("winograd", self.winograd_s)) if v is not None}
        return min(times, key=times.get) if times else None

    @property
    def generated_times(self) -> dict[str, float]:
        """The chain's all-generated implementations that were timed: the tuned direct kernel
        ("generated"), Winograd F(4x4,3x3) and F(2x2,3x3) with the tuned GEMM."""
        return {k: v for k, v in (("generated", self.generated_s), ("winograd-generated", self.winograd_generated_s),
                                  ("winograd-generated-f2", self.winograd2_generated_s)) if v is not None}

    @property
    def generated_impl(self) -> str:
        """The chain's fastest all-generated implementation (``generated_times``; "generated" when the
        direct kernel has no record and Winograd none either)."""
        times = self.generated_times
        return min(times, key=times.get) if times else "generated"

    @property
    def winograd_forms(self) -> list[str]:
        """The generated Winograd forms that timed faster than the chain's direct kernel, F(4x4,3x3)
        first (``compile.winograd_caps`` falls back to F(2x2,3x3) where F(4x4)'s weight is too large)."""
        times, direct = self.generated_times, self.generated_s
        return [k for k in ("winograd-generated", "winograd-generated-f2")
                if k in times and (direct is None or times[k] < direct)]

    @property
    def impl(self) -> str:
        """What the chain runs in the per-chain choice: "generated", "winograd-generated", "onednn"
        or "winograd".  A chain the generated build runs inside a larger kernel (a depthwise conv
        and the 1x1 conv it feeds, ``kernel_rewrites.fuse_separable``) stays generated: that kernel
        has no fused library counterpart, and the whole-model race times it."""
        lib, gen = self.library_impl, self.generated_impl
        if lib is None or not self.own_kernel:
            return gen
        lib_s = self.library_s if lib == "onednn" else self.winograd_s
        gen_s = self.generated_times.get(gen)
        return lib if gen_s is None or lib_s < gen_s else gen

    @property
    def use_library(self) -> bool:
        return self.impl in LIBRARY_IMPLS

    def as_dict(self) -> dict:
        ms = lambda s: None if s is None else s * 1e3                     # noqa: E731
        return {"op": self.op.label, "calls": self.calls, "library_ms": ms(self.library_s),
                "winograd_ms": ms(self.winograd_s), "winograd_generated_ms": ms(self.winograd_generated_s),
                "winograd2_generated_ms": ms(self.winograd2_generated_s),
                "generated_ms": ms(self.generated_s), "tasks": self.tasks, "own_kernel": self.own_kernel,
                "choice": self.impl}


def _chain_tasks(optimised, target):
    """(signature, its chain as a module, the tasks that module compiles to) for every chain."""
    from ..graph import extract_tasks
    for op, mod in chain_modules(optimised).items():
        yield op, mod, extract_tasks(mod, target)[0]


def _time_winograd(op: LibraryOp, impl: str, chain_mod, target, database=None, repeat: int = 5) -> float | None:
    """Seconds per call of the chain as Winograd ``impl``, built and run through the Relax VM; a
    "-generated" form runs its GEMMs from their best record in ``database`` (None when it has none)."""
    from ..timing import time_vm
    from ..graph import apply_database, fuse
    from ..winograd import gemm_name, tile
    mod = fuse(offload(chain_mod, {op: impl}), target)
    if "generated" in impl:
        mod = apply_database(mod, database, target)
        gemm = next(f for gv, f in mod.functions_items() if gv.name_hint.startswith(gemm_name(op, tile(impl))))
        if not (gemm.attrs and gemm.attrs.get("tirx.is_scheduled")):
            return None
    ex = compile_module(mod, target)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal([int(d) for d in p.ty.shape]).astype("float32") for p in chain_mod["main"].params]
    return time_vm(ex, inputs, repeat=repeat, min_repeat_ms=100)


def library_time(op: LibraryOp, impl: str, chain_mod, target, times: dict | None = None,
                 database=None, beat: float | None = None) -> float | None:
    """Seconds per call of the chain on ``impl`` ("onednn": the fused call; "winograd";
    "winograd-generated" and "winograd-generated-f2", whose GEMMs come from ``database``), or None
    where it does not apply or fails (one warning line: the chain keeps its other paths).
    ``times`` holds what this run measured already: tuning's ``task_floors`` and the build's
    ``plan`` time each chain once between them.

    ``beat``: the direct kernel's recorded time.  A Winograd form timed no faster gets one more
    sample and keeps the faster of the two: a form judged slower is left out of every build the
    whole-model race sees, so one transient slowdown of a shared machine must not decide it (the
    race still times every build it does see)."""
    from .. import winograd
    times = {} if times is None else times
    if (op, impl) not in times:
        if impl != "onednn" and (is_cuda(target) or impl not in winograd.forms(op)):
            times[op, impl] = None
            return None
        try:
            with device_exclusive():
                times[op, impl] = op.time(repeat=5, dev=device(target)) if impl == "onednn" else \
                    _time_winograd(op, impl, chain_mod, target, database)
        except Exception as e:                              # noqa: BLE001 - any failure of a library path
            name, rest = {"onednn": ("oneDNN", "the generated kernel"),
                          "winograd": ("Winograd", "oneDNN or the generated kernel"),
                          "winograd-generated": ("Winograd with generated GEMMs", "the other paths"),
                          "winograd-generated-f2": ("Winograd F(2x2) with generated GEMMs", "the other paths")}[impl]
            print(f"adaptune: warning: {name} cannot run {op.label} ({' '.join(str(e).split())[:120]}); "
                  f"using {rest}", file=sys.stderr)
            times[op, impl] = None
    t = times[op, impl]
    if beat is not None and impl != "onednn" and t is not None and t >= beat and (op, impl, "again") not in times:
        times[op, impl, "again"] = True                  # sampled twice: not a third time
        try:
            with device_exclusive():
                again = _time_winograd(op, impl, chain_mod, target, database)
        except Exception:                                   # noqa: BLE001 - the first sample stands
            again = None
        times[op, impl] = min(t, again if again is not None else t)
    return times[op, impl]


def plan(optimised, database, target, times: dict | None = None, library: bool = True) -> list[Choice]:
    """Time each chain's fused library call and Winograd with generated GEMMs, and look up its tuned
    kernel (see module doc); without ``library``, only the generated paths.  A chain whose kernels
    are not the model's own (``Choice.own_kernel``) has no record: it stays generated.

    A library call that raises (a shape or attribute oneDNN does not take) is reported in one
    warning line and that chain stays generated.  ``times``: see ``library_time``."""
    from ...measure.run import latency
    from ..graph import extract_tasks
    counts = find_ops(optimised)
    kernels = {tvm_ffi.structural_hash(t.mod) for t in extract_tasks(optimised, target)[0]}
    choices = []
    for op, chain_mod, tasks in _chain_tasks(optimised, target):
        lats = []
        for t in tasks:
            rec = database.query_tuning_record(t.mod, target, t.name) if database is not None else None
            if rec is not None and rec.run_secs:
                lats.append(latency(rec.run_secs))
        generated = sum(lats) if len(lats) == len(tasks) and lats else None
        lib = {impl: library_time(op, impl, chain_mod, target, times) if library else None
               for impl in ("onednn", "winograd")}
        wgen = {impl: library_time(op, impl, chain_mod, target, times, database, beat=generated)
                if database is not None else None for impl in ("winograd-generated", "winograd-generated-f2")}
        choices.append(Choice(op, counts.get(op, 0), lib["onednn"], generated, [t.name for t in tasks],
                              lib["winograd"], wgen["winograd-generated"], wgen["winograd-generated-f2"],
                              own_kernel=all(tvm_ffi.structural_hash(t.mod) in kernels for t in tasks)))
    return choices


def gemm_tasks(optimised, target) -> list:
    """The generated GEMM (``winograd.gemm``) of every generated Winograd form of every chain
    (``winograd.forms``), as tuning tasks (weight: its calls), so that the all-generated model can run
    Winograd too.  None on a GPU (the transforms are CPU code)."""
    from ..graph import extract_tasks
    from ..winograd import forms
    if is_cuda(target):
        return []
    tasks: dict[str, object] = {}
    for impl in ("winograd-generated", "winograd-generated-f2"):
        ops = {op: impl for op in find_ops(optimised) if impl in forms(op)}
        if ops:
            tasks.update((t.name, t) for t in extract_tasks(offload(optimised, ops), target)[0]
                         if t.name.startswith("winograd_gemm_"))
    return list(tasks.values())


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
    """The signatures the per-chain choice rewrites (library calls, Winograd), with the implementation each runs."""
    return {c.op: c.impl for c in choices if c.impl != "generated"}


def generated_choice(choices) -> dict[LibraryOp, str]:
    """The signatures the all-generated build runs as Winograd with generated GEMMs."""
    return {c.op: c.generated_impl for c in choices if c.generated_impl != "generated"}


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
