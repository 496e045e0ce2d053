"""LoopTune's environment (§3) with the Gymnasium API.

An episode takes one contraction (from ``contractions``, or ``reset(options={"contraction": c})``),
starts from its untiled nest with the cursor on the outermost loop, and lasts a fixed number of
actions (10 by default, the paper's implicit stop: no terminate action).  The reward of an action
is the change in GFLOPS divided by the machine's measured peak.  The observation is the nest's
20 features per loop (``LoopNest.features``), log-scaled (log2(1 + x)) so trip counts and access
counts of 2^20 do not swamp the binary flags, padded with zero rows to ``MAX_ROWS``.
"""
from __future__ import annotations

from typing import Callable, Sequence

import gymnasium as gym
import numpy as np

from .evaluate import Evaluator, peak_gflops
from .nest import ACTIONS, FEATURES, MAX_ROWS, Contraction, LoopNest


def observe(nest: LoopNest) -> np.ndarray:
    """The flat observation vector of ``nest``."""
    obs = np.zeros((MAX_ROWS, FEATURES), dtype=np.float32)
    feats = nest.features()
    obs[:len(feats)] = np.log2(1.0 + feats)
    return obs.ravel()


class LoopTuneEnv(gym.Env):
    """Loop-nest scheduling as a Gymnasium environment; GFLOPS come from ``gflops(nest)``
    (real measurements by default, one cached ``Evaluator`` per contraction, ``timing`` passed to it)."""

    metadata: dict = {"render_modes": ["ansi"]}

    def __init__(self, contractions: Sequence[Contraction], *, steps: int = 10, peak: float | None = None,
                 gflops: Callable[[LoopNest], float] | None = None, target=None, timing: dict | None = None):
        if not contractions:
            raise ValueError("LoopTuneEnv needs at least one contraction")
        self.contractions = list(contractions)
        self.steps = steps
        self.peak = peak if peak is not None else peak_gflops()
        self._gflops = gflops
        self._target, self._timing = target, timing or {}
        self.evaluators: dict[Contraction, Evaluator] = {}      # one measurement cache per contraction
        self.action_space = gym.spaces.Discrete(len(ACTIONS))
        self.observation_space = gym.spaces.Box(0.0, 64.0, shape=(MAX_ROWS * FEATURES,), dtype=np.float32)
        self.nest: LoopNest | None = None

    def gflops(self, nest: LoopNest) -> float:
        if self._gflops is not None:
            return self._gflops(nest)
        ev = self.evaluators.get(nest.contraction)
        if ev is None:
            ev = self.evaluators[nest.contraction] = Evaluator(nest.contraction, self._target, **self._timing)
        return ev(nest)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        con = (options or {}).get("contraction")
        if con is None:
            con = self.contractions[int(self.np_random.integers(len(self.contractions)))]
        self.nest, self.t = LoopNest.initial(con), 0
        self.value = self.gflops(self.nest)
        return observe(self.nest), {"gflops": self.value}

    def step(self, action):
        if self.nest is None:
            raise RuntimeError("call reset() first")
        self.nest = self.nest.apply(int(action))
        value = self.gflops(self.nest)
        reward = (value - self.value) / self.peak
        self.value, self.t = value, self.t + 1
        return observe(self.nest), float(reward), False, self.t >= self.steps, {"gflops": value}

    def render(self):
        return self.nest.render() if self.nest is not None else ""
