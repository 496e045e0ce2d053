"""Random search: uniform configs from the knob space (no cost model)."""
from __future__ import annotations

import numpy as np

from .base import Strategy, register


@register("random")
class RandomSearch(Strategy):
    def propose(self, n: int) -> np.ndarray:
        return self.state.unmeasured(self.state.space.random(4 * n, self.state.rng))[:n]
