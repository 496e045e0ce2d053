"""AutoTVM's parallel simulated annealing over the cost model, Chameleon's ``sa`` explorer.

The baseline of the Chameleon paper (Table 8): 128 Markov chains, at most 500 steps (stopping
early once the top list stops improving for 50 steps), a plan of the 64 best predicted configs not
measured yet.  Chains persist across batches, as in AutoTVM.  With greedy sampling
(``chameleon.py``) it is AutoTVM's model-based tuner, the strategy ``sa``.
"""
from __future__ import annotations

import heapq

import numpy as np


def simulated_annealing(space, score, rng, points, *, n_steps=500, temp=(1.0, 0.0), early_stop=50,
                        plan_size=64, exclude=frozenset()):
    """AutoTVM's ``SimulatedAnnealingOptimizer.find_maximums``.

    Returns (top configs by score, final chain points, step of the last improvement)."""
    scores = score(points)
    heap = [(-np.inf, -1 - i, None) for i in range(plan_size)]     # (score, tiebreak, config) min-heap
    in_heap: set[tuple] = set()

    def push(cfgs, scs):
        for c, s in zip(cfgs, scs):
            key = tuple(c)
            if s > heap[0][0] and key not in in_heap and key not in exclude:
                _, _, old = heapq.heapreplace(heap, (float(s), hash(key), key))
                in_heap.discard(old)
                in_heap.add(key)

    push(points, scores)
    t, k, last_improve = temp[0], 0, 0
    cool = (temp[0] - temp[1]) / (n_steps + 1)
    while k < n_steps and k - last_improve < early_stop:
        new = space.random_walk(points, rng)
        new_scores = score(new)
        accept = np.exp(np.minimum((new_scores - scores) / (t + 1e-5), 0)) > rng.random(len(points))
        points = np.where(accept[:, None], new, points)
        scores = np.where(accept, new_scores, scores)
        before = heap[0][0]
        push(new, new_scores)
        if heap[0][0] > before:
            last_improve = k
        k += 1
        t -= cool
    best = sorted((h for h in heap if h[2] is not None), reverse=True)
    return np.array([h[2] for h in best], dtype=np.int64).reshape(-1, space.ndim), points, last_improve


class SimulatedAnnealing:
    """Chameleon's explorer ``sa``: ``n_chains`` Markov chains over the cost model, kept across
    iterations, at most ``n_steps`` steps; the plan is the ``plan_size`` (at least a batch)
    best-predicted configs not measured."""

    def __init__(self, n_chains: int = 128, n_steps: int = 500, plan_size: int = 64):
        self.n_chains, self.n_steps, self.plan_size = n_chains, n_steps, plan_size
        self.points = None
        self.steps = 0          # step of the last run's last improvement (Chameleon Fig. 7a)

    def setup(self, context) -> None:
        pass

    def explore(self, context, n: int, last_search_s: float | None) -> tuple[np.ndarray, None]:
        """The plan, best first; the cost model scores it again where it is sampled."""
        st = context
        if self.points is None:
            self.points = st.space.random(self.n_chains, st.rng)
        plan, self.points, self.steps = simulated_annealing(
            st.space, st.cost_model.predict, st.rng, self.points, n_steps=self.n_steps,
            plan_size=max(self.plan_size, n), exclude=st.measured_keys())
        return plan, None

    def report(self) -> dict:
        return {"steps": self.steps, "episodes": None}

    def wait(self) -> None:
        pass
