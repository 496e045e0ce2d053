"""Paired timing on a noisy machine: contenders sampled alternately, compared by their paired
ratios, and the confirmation of a new best in tuning (the answer to the winner's curse).

Each candidate is timed once, for about 0.1 s; on a machine whose quick and slow phases last
seconds, the fastest of hundreds of such records is the luckiest rather than the fastest kernel
(docs/decisions.md, session 56: a 256-trial best that lost to the 64-trial one).  So a candidate
measured faster than the incumbent is timed again beside it, alternately (``ROUNDS`` short samples
each), and its latency becomes the incumbent's times the median of their paired ratios: a phase
slows both sides of a pair alike.  It replaces the incumbent only if it is faster in the pairs.
The incumbent's latency it is scaled by is the incumbent's record or, where lower, the median of
every sample taken of it beside challengers: a task's first record is one measurement, and one taken
in a slow phase (ResNet-50's F(2x2) GEMM: 1.03 ms, its kernel 0.45 ms alone; docs/decisions.md,
session 64) would otherwise set the scale of every later record of the task.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .._tvm import ms, tvm
from .target import device
from .verify import arg_shapes, random_args


def sample_alternately(samplers: dict[str, Callable[[], float | None]], rounds: int,
                       samples: dict | None = None) -> dict[str, list[float]]:
    """``rounds`` rounds of one sample (seconds) from each contender's sampler, back to back, the order
    reversed every other round, appended to ``samples[name]``: a noisy machine's quick and slow phases
    then fall on every contender alike, and ``paired_seconds`` pairs round ``i``'s samples.  A sampler
    that returns None takes no sample that round."""
    samples = {} if samples is None else samples
    names = list(samplers)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            s = samplers[name]()
            if s is not None:
                samples.setdefault(name, []).append(s)
    return samples


def paired_seconds(samples: dict[str, list[float]], reference: str) -> dict[str, float]:
    """Each contender's seconds: the reference's median times the median of the contender's paired
    ratios (its sample over the reference's of the same round; ``samples[name][i]`` is round ``i``'s,
    and the reference runs in every round).  A machine that slows down for seconds slows both sides
    of a pair, so the ratios hold where each contender's own median would not."""
    ref = samples[reference]
    base = float(np.median(ref))
    return {name: base * paired_ratio(own, ref) for name, own in samples.items() if own}


def paired_ratio(own: list[float], ref: list[float]) -> float:
    """The median of ``own[i] / ref[i]``: how much slower ``own`` is than ``ref``, round by round."""
    return float(np.median([a / b for a, b in zip(own, ref)]))


ROUNDS = 7              # alternated samples of each side: ~0.3 s for a new best, a handful per task
SAMPLE_MS = 20


def kernel_sampler(mod, artifact: str, target, *, sample_ms: int = SAMPLE_MS):
    """A function timing one short sample (seconds per call) of the built file ``artifact`` of the
    scheduled ``mod``, on random arguments of the shapes the measured binary takes (weights in a
    rewritten layout included), as MetaSchedule's runner calls it."""
    dev = device(target)
    lib = tvm.runtime.load_module(artifact)
    args = [tvm.runtime.tensor(a, dev)
            for a in random_args(arg_shapes(ms.arg_info.ArgInfo.from_entry_func(mod, remove_preproc=True)))]
    evaluator = lib.time_evaluator(lib.entry_name, dev, number=1, repeat=1, min_repeat_ms=sample_ms)

    def sample() -> float:
        dev.sync()
        return float(evaluator(*args).mean)
    return sample


class Incumbent:
    """The best kernel so far, loaded and ready to be timed beside a challenger."""

    def __init__(self, rounds: int = ROUNDS):
        self.rounds = rounds
        self.sample = None          # the incumbent's sampler (None until one is known)
        self.latency: float | None = None       # its recorded latency
        self.samples: list[float] = []          # its samples beside challengers, while it reigns
        self.lost = False           # a resumed best that could not be loaded again (tried once)

    def crown(self, sample, latency: float, samples=()) -> None:
        self.sample, self.latency, self.samples = sample, latency, list(samples)

    def anchor(self) -> float:
        """The latency a crowned challenger's paired ratio scales: the record, or the median of the
        incumbent's samples beside challengers where that is lower (module doc)."""
        return min(self.latency, float(np.median(self.samples))) if self.samples else self.latency

    def challenge(self, sample) -> tuple[float, float, float]:
        """(the challenger's estimated latency, its paired ratio to the incumbent, the latency that
        ratio scaled).  A challenger faster in the pairs is crowned at ``anchor()`` times its ratio,
        below the incumbent's record; a slower one is estimated at the record times its ratio, above it."""
        times = sample_alternately({"incumbent": self.sample, "challenger": sample}, self.rounds)
        ratio = paired_ratio(times["challenger"], times["incumbent"])
        self.samples += times["incumbent"]
        if ratio >= 1:
            return self.latency * ratio, ratio, self.latency
        scale = self.anchor()
        self.crown(sample, scale * ratio, times["challenger"])
        return scale * ratio, ratio, scale
