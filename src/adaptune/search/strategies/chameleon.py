"""Chameleon (ICLR 2020): an explorer finds candidates on the cost model, a sampler picks which
to measure.

Explorers: ``SimulatedAnnealing`` (``sa.py``, AutoTVM's) and ``AdaptiveExploration``
(``exploration.py``, the paper's PPO agent).  Samplers: ``GreedySampling`` (AutoTVM's top-k) and
``AdaptiveSampling`` (the paper's clustering), both in ``samplers.py``.  The paper's four
variants are registered as factories: ``sa`` (AutoTVM, the baseline), ``rl``, ``sa+as`` and
``rl+as`` (alias ``chameleon``, the default).  A factory's options go to the explorer or the
sampler that takes them; an option neither takes is refused.
"""
from __future__ import annotations

import inspect
import time
from typing import Protocol

import numpy as np

from .base import Strategy, register
from .exploration import AdaptiveExploration
from .ppo import one_thread
from .sa import SimulatedAnnealing
from .samplers import AdaptiveSampling, GreedySampling


class Explorer(Protocol):
    def setup(self, context) -> None: ...

    def explore(self, context, n: int, last_search_s: float | None) -> tuple[np.ndarray, np.ndarray | None]:
        """Candidates for a batch of ``n`` and, where the explorer has them, their scores
        (``last_search_s``: the last iteration's search seconds, None before it)."""

    def report(self) -> dict:
        """This iteration's ``steps`` (to converge) and ``episodes`` (None without an agent)."""

    def wait(self) -> None:
        """Finish work left running beside the sampling."""


class Sampler(Protocol):
    fills_batch: bool       # False: a short batch is deliberate (``Strategy.fills_batch``)

    def first(self, context, n: int) -> np.ndarray:
        """The first batch, before the cost model has anything to learn from."""

    def sample(self, context, configs: np.ndarray, scores: np.ndarray | None, n: int) -> tuple[np.ndarray, dict]:
        """Up to ``n`` of the candidates to measure, and ``candidates`` and ``k`` for the log."""


class Chameleon(Strategy):
    """Each iteration the explorer's candidates, then the sampler's pick of them; the first batch
    is the sampler's alone (the cost model has nothing to learn from yet)."""

    def __init__(self, explorer: Explorer, sampler: Sampler, name: str = "chameleon"):
        self.explorer, self.sampler, self.name = explorer, sampler, name
        self.fills_batch = sampler.fills_batch
        self.log: list[dict] = []       # per iteration: candidates, proposed, k, steps, episodes, search seconds

    def setup(self, context) -> None:
        super().setup(context)
        self.explorer.setup(self.state)

    def propose(self, n: int) -> np.ndarray:
        st = self.state
        if not st.cost_model.trained:          # nothing to learn from yet
            return self.sampler.first(st, n)
        with one_thread():      # tiny networks and k-means: extra threads only add hand-off cost
            t0 = time.perf_counter()
            try:
                configs, scores = self.explorer.explore(st, n, self.log[-1]["search_s"] if self.log else None)
                out, info = self.sampler.sample(st, configs, scores, n)
                self.log.append({**info, "proposed": len(out), **self.explorer.report()})
            finally:            # inside the one_thread block: the explorer's work ran under its limits
                self.explorer.wait()
            self.log[-1]["search_s"] = time.perf_counter() - t0
        return out


def _compose(name: str, explorer: type, sampler: type, options: dict, **tied) -> Chameleon:
    """``Chameleon(explorer(...), sampler(...))`` with each option given to the part whose
    constructor takes it; ``tied(sampler) -> value`` defaults an explorer option from the sampler."""
    takes = [set(inspect.signature(part).parameters) for part in (explorer, sampler)]
    unknown = set(options) - takes[0] - takes[1]
    if unknown:
        raise TypeError(f"strategy {name!r} takes no option {', '.join(sorted(unknown))}; "
                        f"it takes {', '.join(sorted(takes[0] | takes[1]))}")
    smp = sampler(**{k: v for k, v in options.items() if k in takes[1]})
    exp_options = {k: v for k, v in options.items() if k in takes[0]}
    exp = explorer(**{**{k: f(smp) for k, f in tied.items()}, **exp_options})
    return Chameleon(exp, smp, name)


@register("sa")
def sa(**options) -> Chameleon:
    """AutoTVM's tuner, the paper's baseline: simulated annealing x greedy top-k."""
    return _compose("sa", SimulatedAnnealing, GreedySampling, options)


@register("rl")
def rl(**options) -> Chameleon:
    """Adaptive Exploration x greedy top-k."""
    return _compose("rl", AdaptiveExploration, GreedySampling, options)


@register("sa+as")
def sa_as(**options) -> Chameleon:
    """Simulated annealing x Adaptive Sampling; the annealing's plan is the sampler's pool."""
    return _compose("sa+as", SimulatedAnnealing, AdaptiveSampling, options, plan_size=lambda smp: smp.pool)


@register("rl+as", "chameleon")
def rl_as(**options) -> Chameleon:
    """Adaptive Exploration x Adaptive Sampling: Chameleon."""
    return _compose("rl+as", AdaptiveExploration, AdaptiveSampling, options)
