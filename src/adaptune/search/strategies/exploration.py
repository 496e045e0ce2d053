"""Chameleon's Adaptive Exploration (§3.2), its ``rl`` explorer: a PPO agent walking the knobs,
rewarded by the cost model, kept across iterations so it keeps what it learned of the space.

Each iteration starts ``episodes`` episodes (the paper's 128) from the ``n_init_best`` best
measured configs and random ones; the candidates are every distinct config the episodes reached,
with the cost model's score of each.  The agent's PPO update runs on a second thread while the
sampler clusters and decodes those candidates (``wait`` joins it).

With ``overhead_share`` (off by default) search effort follows measurement cost: the agent gets
what is left of that share of the last batch's build+run seconds after the rest of the last
iteration's overhead, as fewer episodes (at least ``min_episodes``) learning from proportionally
fewer transitions.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from functools import cache

import numpy as np

from .ppo import CHAMELEON, PPOAgent, PPOConfig


@cache
def _learner() -> ThreadPoolExecutor:
    """The thread the agent's PPO update runs on while the sampler clusters and decodes candidates:
    the update does not change this iteration's candidates, and torch releases the GIL in its
    kernels, so on two cores it overlaps the k-means and TVM's replays."""
    return ThreadPoolExecutor(1, thread_name_prefix="adaptune-ppo")


class AdaptiveExploration:
    def __init__(self, episodes: int = 128, max_steps: int = 500, n_init_best: int = 16,
                 overhead_share: float | None = None, min_episodes: int = 32, ppo: PPOConfig = CHAMELEON):
        self.episodes, self.max_steps, self.n_init_best, self.ppo = episodes, max_steps, n_init_best, ppo
        self.overhead_share, self.min_episodes = overhead_share, min(min_episodes, episodes)
        self.n_episodes = episodes      # this iteration's, see _effort
        self.agent: PPOAgent | None = None
        self._learning: Future | None = None     # the agent's PPO update, running beside the sampling

    def setup(self, context) -> None:
        if self.agent is None:          # one-off: torch's optimiser import takes ~2 s
            self.agent = PPOAgent(context.space.sizes, self.ppo, seed=int(context.rng.integers(1 << 30)))

    def explore(self, context, n: int, last_search_s: float | None) -> tuple[np.ndarray, np.ndarray]:
        """The configs the episodes reached and the cost model's score of each (NaN: a start
        state never reached)."""
        st = context
        episodes = self._effort(st, last_search_s)
        best = st.best(self.n_init_best)
        init = np.concatenate([best, st.space.random(max(episodes - len(best), 0), st.rng)])
        visited, scores = self.agent.explore(
            init, lambda c: st.cost_model.predict(st.space.canonical(c)), max_steps=self.max_steps,
            max_batch=self.agent.max_batch * episodes // self.episodes, learn=False, rewards=True)
        self._learning = _learner().submit(self.agent.learn)
        return visited, scores

    def _effort(self, context, last_search_s: float | None) -> int:
        """Episodes for this iteration: last iteration's, scaled by how far the last search
        (``last_search_s``) was from the search budget (square root: damped, the timings are
        noisy), within [min_episodes, episodes]."""
        m, o = context.timings
        if self.overhead_share and m and o is not None and last_search_s is not None:
            budget = self.overhead_share * m - (o - last_search_s)
            ratio = max(budget, 0.0) / max(last_search_s, 1e-6)
            self.n_episodes = int(np.clip(round(self.n_episodes * min(ratio, 4.0) ** 0.5),
                                          self.min_episodes, self.episodes))
        return self.n_episodes

    def report(self) -> dict:
        return {"steps": self.agent.converge_step, "episodes": self.n_episodes}

    def wait(self) -> None:
        """Join the PPO update started by ``explore`` (no-op if none runs)."""
        if self._learning is not None:
            self._learning.result()
            self._learning = None
