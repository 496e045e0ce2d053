"""Compile and time loop nests in process (LoopTune §3.2), with the paper's evaluation cache.

A nest is built with TVM for the host CPU, checked against numpy, warmed up, then timed several
times for at least a few milliseconds each; the fastest run counts.  Identical nests (same
``LoopNest.key``) are built once.  The empirical peak that normalises rewards is numpy's BLAS on a
large matmul, measured once per process: the paper measures its peak rather than trusting specs.
"""
from __future__ import annotations

import functools
import logging
import os
import time

import numpy as np

from .nest import Contraction, LoopNest

log = logging.getLogger(__name__)


# LoopTune times bare kernels of 10-500 us back to back, on TVM's pool alone, against numpy's BLAS,
# whose threads spin between calls.  TVM's workers, told to sleep at once (``adaptune``'s default,
# for models that share the cores with OpenMP), were woken for every call: the same 100x150x200
# kernel measured 77 or 128 GFLOPS by whether the other core happened to be awake.  So LoopTune's
# processes give TVM's workers a bounded spin, unless the user chose one; TVM reads it once, when
# its pool starts, which in LoopTune's commands is after the first ``Evaluator``.  Each side's
# spinning threads are left to stop before the other is timed (``QUIET_S``).
SPIN_COUNT = "10000"
QUIET_S = 0.2


def _spin_tvm_workers() -> None:
    import adaptune
    if not adaptune.TVM_SPIN_CHOSEN:
        os.environ["TVM_THREAD_POOL_SPIN_COUNT"] = SPIN_COUNT


class NestError(RuntimeError):
    """Generated code that failed to build or computed a wrong result."""


class Evaluator:
    """GFLOPS of loop nests of one contraction, cached by what the nest computes."""

    def __init__(self, contraction: Contraction, target=None, *, warmup: int = 3, repeat: int = 5,
                 min_repeat_ms: int = 2, seed: int = 0):
        from .._tvm import tvm
        from ..measure.target import host_target
        _spin_tvm_workers()
        self.contraction = contraction
        self.target = target if target is not None else host_target()
        self.dev = tvm.cpu()
        self.warmup, self.repeat, self.min_repeat_ms = warmup, repeat, min_repeat_ms
        inputs = contraction.random_inputs(np.random.default_rng(seed))
        self.expected = contraction.reference(inputs)
        self.args = [tvm.runtime.tensor(a, self.dev) for a in inputs]
        self.args.append(tvm.runtime.empty(self.expected.shape, "float32", self.dev))
        self.cache: dict[tuple, float] = {}

    def __call__(self, nest: LoopNest) -> float:
        """GFLOPS of ``nest`` (0.0 for a nest TVM cannot build, logged)."""
        if nest.key not in self.cache:
            try:
                self.cache[nest.key] = self.contraction.flops / self.seconds(nest) / 1e9
            except NestError as e:
                log.warning("%s", e)
                self.cache[nest.key] = 0.0
        return self.cache[nest.key]

    def seconds(self, nest: LoopNest) -> float:
        """Build, check and time ``nest`` (not cached)."""
        from ..measure.pipeline import compile_module
        from ..measure.verify import TOLERANCE, relative_error
        try:
            ex = compile_module(nest.schedule(self.target).mod, self.target)
        except Exception as e:  # noqa: BLE001 - TVM raises many kinds; the search goes on
            raise NestError(f"nest did not build: {str(e).splitlines()[-1][:200]}") from e
        fn = ex["main"]
        self.args[-1].copyfrom(np.zeros(self.expected.shape, np.float32))
        for _ in range(self.warmup):
            fn(*self.args)
        got = self.args[-1].numpy()
        if relative_error(got, self.expected) > TOLERANCE:
            raise NestError(f"nest computed a wrong result (max error {np.abs(got - self.expected).max():.3g})")
        timer = ex.mod.time_evaluator("main", self.dev, number=1, repeat=self.repeat,
                                      min_repeat_ms=self.min_repeat_ms)
        return min(timer(*self.args).results)

    @property
    def evaluations(self) -> int:
        return len(self.cache)


@functools.lru_cache(maxsize=1)
def peak_gflops(n: int = 512, runs: int = 5) -> float:
    """The machine's empirical fp32 peak: the best of numpy's BLAS on an n×n×n matmul."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(runs))
    return 2 * n ** 3 / best / 1e9


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def numpy_gflops(contraction: Contraction, repeat: int = 5, min_repeat_ms: float = 2.0) -> float:
    """numpy's GFLOPS on the same contraction (the paper's NumPy/MKL comparison; matmul only), timed
    as ``Evaluator`` times a nest: each of ``repeat`` timings the mean of back-to-back calls lasting at
    least ``min_repeat_ms``; the fastest counts."""
    if contraction.kind != "matmul":
        raise ValueError("numpy baseline is for matmul")
    a, b = contraction.random_inputs(np.random.default_rng(0))
    time.sleep(QUIET_S)                 # TVM's workers stop spinning
    for _ in range(3):
        a @ b
    number = max(1, int(min_repeat_ms / 1e3 / _timed(lambda: a @ b)))

    def mean() -> float:
        t0 = time.perf_counter()
        for _ in range(number):
            a @ b
        return (time.perf_counter() - t0) / number
    best = min(mean() for _ in range(repeat))
    time.sleep(QUIET_S)                 # and the BLAS threads
    return contraction.flops / best / 1e9


def versus_numpy(ev: Evaluator, nest: LoopNest, rounds: int = 3) -> tuple[float, float]:
    """(GFLOPS of ``nest``, numpy's GFLOPS) on ``ev``'s matmul, each the best of ``rounds`` timings
    taken in alternation, the order flipped every round: on a shared 2-core VM a kernel's speed
    changes by 2x from one second to the next, and one timing of each could land in different phases.
    The nest's first timing is the evaluator's own (cached; 0.0 for a nest that did not build)."""
    best, npy = 0.0, 0.0
    for r in range(rounds):
        for side in ("nest", "numpy") if r % 2 == 0 else ("numpy", "nest"):
            if side == "numpy":
                npy = max(npy, numpy_gflops(ev.contraction))
            else:
                best = max(best, ev(nest) if r == 0 else ev.contraction.flops / ev.seconds(nest) / 1e9)
        if not best:
            break
    return best, npy
