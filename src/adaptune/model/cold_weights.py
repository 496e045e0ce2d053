"""Records chosen with their weights cold.

A model whose constants outgrow the last-level cache reads each large kernel's weights from DRAM on
every inference, but tuning times every candidate hot (its repeats find the weights cached).  Among a
task's fastest records the schedules differ in how well they stream their weights: ResNet-50's
Winograd GEMM 16x256x256 on Zen 4, ten records within 6% of each other hot, took 0.43-0.50 ms with
its weights cold, and the hot-fastest was the slowest cold (docs/decisions.md, session 82).  So for
such kernels ``ColdChoice`` times a task's top records again, their weights rotated through copies
larger than the cache, and keeps the fastest.  ``compile.build_best`` races the build it gives
beside the others, so the whole model decides.
"""
from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path

import numpy as np
import tvm_ffi

from .._tvm import ms, tvm
from ..measure.paired import paired_seconds, sample_alternately
from .graph import kernel_records
from .kernel_rewrites import cache_bytes

#: a kernel's weights from this size on cannot stay in its core's L2 between inferences
HEAVY_BYTES = 1 << 20
TOP = 6                 # the fastest distinct records (hot) of a task that are timed cold
ROUNDS = 5              # alternated samples of each
SAMPLE_MS = 15


def constant_bytes(mod) -> int:
    """Bytes of the Relax constants (tensors) of ``mod``, each counted once."""
    from tvm import relax
    seen = set()

    def visit(e):
        if isinstance(e, tvm.ir.expr.Constant) and hasattr(e.value, "shape"):
            seen.add(e)                 # tensors only; TVM objects hash and compare by identity
    for _, f in mod.functions_items():
        if isinstance(f, relax.Function):
            relax.analysis.post_order_visit(f, visit)
    return sum(int(np.prod(c.value.shape)) * np.dtype(str(c.value.dtype)).itemsize for c in seen)


def _nbytes(arg) -> int:
    """Bytes of one argument (a MetaSchedule ``ArgInfo``)."""
    return math.prod(int(d) for d in arg.shape) * np.dtype(str(arg.dtype)).itemsize


def _weight_bytes(func) -> int:
    """Bytes of a kernel's layout-free (constant weight) parameters."""
    free = {int(i) for i in (func.attrs or {}).get("layout_free_buffers", [])}
    return sum(_nbytes(a) for i, a in enumerate(ms.arg_info.ArgInfo.from_prim_func(func)) if i in free)


def _distinct_top(database, mod, k: int) -> list:
    """The ``k`` fastest records of ``mod``'s workload with distinct traces (hot, as tuned)."""
    if not database.has_workload(mod):
        return []
    out, seen = [], set()
    for rec in database.get_top_k(database.commit_workload(mod), 4 * k):
        key = str(rec.trace)
        if key not in seen:
            seen.add(key)
            out.append(rec)
        if len(out) == k:
            break
    return out


def _cold_sampler(rec, free: list[int], llc: int, workdir: Path, index: int):
    """A function timing one short sample (seconds per call) of ``rec``'s kernel, each call on the next
    of several copies of its weight arguments (together past ``llc``), other arguments fixed."""
    from ..measure.build import fast_build
    from ..measure.verify import random_args
    from .openmp import load
    sch = tvm.s_tir.Schedule(rec.workload.mod)
    rec.trace.apply_to_schedule(sch, remove_postproc=False)
    path = workdir / f"candidate{index}.so"
    fast_build(sch.mod, rec.target, None).export_library(str(path))
    func = load(path)[0]["main"]
    shapes = [(tuple(int(d) for d in a.shape), str(a.dtype)) for a in rec.args_info]
    fixed = [tvm.runtime.tensor(a) for a in random_args(shapes)]
    weight = sum(_nbytes(rec.args_info[i]) for i in free)
    copies = min(16, max(2, math.ceil(2 * llc / max(weight, 1))))
    sets = [fixed] + [list(fixed) for _ in range(copies - 1)]
    for args in sets[1:]:
        for i, a in zip(free, random_args([shapes[i] for i in free])):
            args[i] = tvm.runtime.tensor(a)
    func(*sets[0])
    state = {"n": 0, "calls": 1}

    def sample() -> float:
        t = time.perf_counter()
        for _ in range(state["calls"]):
            func(*sets[state["n"] % copies])
            state["n"] += 1
        seconds = (time.perf_counter() - t) / state["calls"]
        state["calls"] = max(1, min(200, int(SAMPLE_MS * 1e-3 / max(seconds, 1e-6))))
        return seconds
    return sample


class ColdChoice:
    """Per task, which of its fastest records runs fastest with its weights cold; tasks timed once and
    remembered, so every build of one model shares the timings."""

    def __init__(self, database, target, llc: int | None = None, top: int = TOP):
        self.database, self.target, self.top = database, target, top
        self.llc = llc if llc is not None else cache_bytes(3, default=32 << 20)
        self.chosen: dict[str, object] = {}          # workload key -> record

    def applies(self, mod) -> bool:
        """Whether the model's constants outgrow the last-level cache, so its large weights come cold."""
        return constant_bytes(mod) > self.llc

    def _choose(self, func, mod):
        key = str(tvm_ffi.structural_hash(mod))
        if key in self.chosen:
            return self.chosen[key]
        recs = _distinct_top(self.database, mod, self.top)
        best = recs[0] if recs else None
        if len(recs) > 1:
            free = [int(i) for i in func.attrs["layout_free_buffers"]]
            with tempfile.TemporaryDirectory() as d:
                samplers = {str(i): _cold_sampler(r, free, self.llc, Path(d), i) for i, r in enumerate(recs)}
                seconds = paired_seconds(sample_alternately(samplers, ROUNDS), "0")
            best = recs[int(min(seconds, key=seconds.get))]
        self.chosen[key] = best
        return best

    def database_for(self, fused) -> "ms.database.MemoryDatabase":
        """The best record of every kernel of ``fused``, the cold-fastest of the top ``top`` for each
        kernel whose weights reach ``HEAVY_BYTES``."""
        def record(name, func, mod):
            if (func.attrs or {}).get("layout_free_buffers") and _weight_bytes(func) >= HEAVY_BYTES:
                return self._choose(func, mod)
            return self.database.query_tuning_record(mod, self.target, name)
        return kernel_records(fused, self.target, record)
