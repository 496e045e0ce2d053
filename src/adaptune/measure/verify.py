"""Is a measured kernel correct?  Checked against the task's own untuned PrimFunc.

MetaSchedule measures speed only; a candidate that is fast because it computes the wrong thing
would win the search and end up in the compiled model.  Every task has a reference that needs no
framework: TVM's plain lowering of the same, unscheduled PrimFunc (on the host CPU for a GPU
target, whose unscheduled loops are bound to no threads).  The tuner checks each
candidate that would become the new best (a handful per task, so the cost stays small) on random
inputs, and records a mismatch as a failed candidate instead of a result.  ``relative_error`` is
the one numerics rule of the package (kernels, compiled models, loop nests, other runtimes).
"""
from __future__ import annotations

import numpy as np

from .._tvm import ms, s_tir, tvm
from ..search.knobs import as_module
from .pipeline import compile_module
from .target import device, reference_target

TOLERANCE = 1e-3       # the largest error, relative to the output's scale, a check lets pass


def arg_shapes(arg_infos) -> list[tuple[tuple[int, ...], str]]:
    """(shape, dtype) of each of MetaSchedule's ``ArgInfo``s."""
    return [(tuple(int(d) for d in a.shape), str(a.dtype)) for a in arg_infos]


def signature(mod) -> list[tuple[tuple[int, ...], str]]:
    """(shape, dtype) of each argument of ``mod``'s main PrimFunc."""
    return arg_shapes(ms.arg_info.ArgInfo.from_prim_func(mod["main"]))


def packs_arguments(mod) -> bool:
    """Whether a scheduled kernel packs an argument to a new layout (MetaSchedule's ``RewriteLayout``
    preprocessing block).  Its built file then takes the packed layout, which can have the original
    shape (a square weight transposed), so the shapes alone cannot tell; unsure means yes."""
    try:
        sch = s_tir.Schedule(mod, debug_mask="none")
        return any("meta_schedule.layout_rewrite_preproc" in sch.get(b).annotations
                   for b in sch.get_child_blocks(sch.get_sblock("root")))
    except Exception:  # noqa: BLE001 - no root block or not a single PrimFunc: assume it does
        return True


def random_args(sig, seed: int = 0) -> list[np.ndarray]:
    """Arrays for a kernel's arguments ``[(shape, dtype)]``: normal floats, small integers."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(d) if "float" in d else rng.integers(0, 4, s).astype(d) for s, d in sig]


class KernelChecker:
    def __init__(self, mod, target, *, seed: int = 0, rtol: float = TOLERANCE):
        self.mod, self.target, self.rtol = mod, target, rtol
        self.sig = signature(mod)
        self.args = random_args(self.sig, seed)
        self._expected: list[np.ndarray] | None = None

    def reference(self) -> list[np.ndarray]:
        """The untuned kernel's outputs (computed once, ~0.5-1 s)."""
        if self._expected is None:
            self._expected = self._run(self.mod, target=reference_target(self.target))
        return self._expected

    def _run(self, mod, artifact: str | None = None, target=None) -> list[np.ndarray]:
        target = target or self.target
        dev = device(target)
        # as_module: a private PrimFunc (no global_symbol) made public, or it compiles to nothing callable
        ex = tvm.runtime.load_module(artifact) if artifact else compile_module(as_module(mod), target)
        bufs = [tvm.runtime.tensor(a.copy(), dev) for a in self.args]
        ex["main"](*bufs)
        return [b.numpy() for b in bufs]

    def check(self, mod, artifact: str | None = None) -> tuple[bool | None, str]:
        """(True, "") if ``mod`` computes what the untuned kernel computes; (False, why) if not;
        (None, why) when it cannot be compared (another argument layout).  ``artifact``: the
        measured kernel's built file taking ``mod``'s own arguments (``MeasureResult.artifact``),
        run as is: the very binary that was timed, and no second compile (~0.3 s)."""
        if signature(mod) != self.sig:
            return None, "argument layout differs from the untuned kernel"
        got = self._run(mod, artifact)
        for i, (g, w) in enumerate(zip(got, self.reference())):
            if relative_error(g, w) > self.rtol:
                return False, f"argument {i} differs from the untuned kernel's result"
        return True, ""


def output_scale(want) -> float:
    """The scale errors are measured against: the reference's largest magnitude (1 for an all-zero
    one).  No floor: a model whose outputs are ~1e-21 is still compared, not passed for free."""
    return float(np.abs(want).max()) or 1.0


def relative_error(got, want) -> float:
    """The one numerics rule: the largest ``|got - want|`` relative to ``output_scale(want)``.

    Infinite when the shapes differ or the non-finite values do not match exactly (random inputs
    can overflow a kernel, e.g. an attention mask times float32's minimum; a NaN compared by size
    alone would pass anything).  A check passes when this is at most ``TOLERANCE``."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return float("inf")
    if not want.size:
        return 0.0
    finite = np.isfinite(want)
    if not np.array_equal(np.isfinite(got), finite) or \
            not np.array_equal(got[~finite], want[~finite], equal_nan=True):
        return float("inf")
    if not finite.any():
        return 0.0
    w = want[finite].astype(np.float64)
    return float(np.abs(got[finite].astype(np.float64) - w).max()) / output_scale(w)


def max_relative_error(got, want) -> float:
    """``relative_error`` over paired outputs, the worst (0 for none)."""
    return max((relative_error(g, w) for g, w in zip(got, want)), default=0.0)
