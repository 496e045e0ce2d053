"""The one interface every search strategy implements, and the registry of names.

A strategy gets the search's read-only ``SearchContext`` (knob space, cost model, rng, what was
measured) once, proposes configs to measure and hears their outcomes; only the loop records them.
It may propose fewer than asked (adaptive sampling does).  Adding a strategy means one new file
with a subclass, or a factory returning one, decorated by ``@register("name")``.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable

import numpy as np

from ..state import SearchContext, TuneState

STRATEGIES: dict[str, Callable[..., "Strategy"]] = {}


def register(*names: str):
    """Register a ``Strategy`` subclass, or a factory of one, under ``names``."""
    def deco(factory):
        for n in names:
            STRATEGIES[n] = factory
        if isinstance(factory, type):
            factory.name = names[0]
        return factory
    return deco


def make_strategy(strategy, **kwargs) -> "Strategy":
    if isinstance(strategy, Strategy):
        return strategy
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {', '.join(sorted(STRATEGIES))}")
    return STRATEGIES[strategy](**kwargs)


class Strategy(ABC):
    """propose() a batch of unmeasured configs; update() with their measurements."""

    name = "strategy"
    fills_batch = True      # False: a short proposal is deliberate, the loop does not top it up

    def setup(self, context: SearchContext) -> None:
        """Called once by the loop before the first ``propose``; ``self.state`` is then the
        search's read-only view (a ``TuneState`` given by hand stands for its ``context``)."""
        self.state = context.context if isinstance(context, TuneState) else context

    @abstractmethod
    def propose(self, n: int) -> np.ndarray:
        """Up to ``n`` configs (rows) not measured yet, best first."""

    def update(self, configs: np.ndarray, latencies: list) -> None:
        """Measured latencies (seconds, None for failures) of proposed configs."""
