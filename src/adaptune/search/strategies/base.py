"""The one interface every search strategy implements, and the registry of names.

A strategy sees the tuning state (knob space, cost model, what was measured) and proposes configs
to measure; it may propose fewer than asked (adaptive sampling does).  Adding a strategy means one
new file with a subclass decorated by ``@register("name")``.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ..state import TuneState

STRATEGIES: dict[str, type["Strategy"]] = {}


def register(*names: str):
    def deco(cls):
        for n in names:
            STRATEGIES[n] = cls
        cls.name = names[0]
        return cls
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
    fills_batch = True      # False: a short proposal is deliberate, do not top it up

    def setup(self, state: "TuneState") -> None:
        self.state = state

    @abstractmethod
    def propose(self, n: int) -> np.ndarray:
        """Up to ``n`` configs (rows) not measured yet, best first."""

    def update(self, configs: np.ndarray, latencies: list) -> None:
        """Measured latencies (seconds, None for failures) of proposed configs."""
