"""Chameleon's two ways to pick the batch from an explorer's candidates (``search/sampling.py``
holds the algorithms): AutoTVM's greedy top-k and Chameleon's Adaptive Sampling (§3.3).

Departures from the paper in ``AdaptiveSampling`` (see docs/decisions.md):
* it clusters the ``pool`` best-predicted distinct candidates, not every state the agent
  visited (most are the agent's early, poor steps);
* ``snap="best"``: each cluster is measured at its best-predicted member, not at the candidate
  nearest its centroid (``snap="centroid"``, the paper);
* the first batch is ``n_first`` configs from TVM's own sampling distribution
  (``KnobSpace.sample_prior``), not a full uniform batch, so the model guides from batch two;
* ``probes`` coverage probes per iteration: the best measured config with one knob (in turn) at
  its least-measured value (``sampling.coverage_probe``), with ``probe_refine`` the other knobs
  then refit to it on the cost model (``sampling.refine_on_model``), so a good value that a
  small knob's first good configs happened not to share is still measured in a good context.
"""
from __future__ import annotations

import numpy as np

from ..sampling import adaptive_sample, coverage_probe, greedy_top_k, refine_on_model


def _scored(context, configs: np.ndarray, scores: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """The unmeasured candidates among ``configs`` and their scores, from the cost model where the
    explorer gave none."""
    cands, keep = context.unmeasured(configs, index=True)
    scores = np.full(len(cands), np.nan) if scores is None else scores[keep]
    unscored = np.isnan(scores)
    if unscored.any():
        scores[unscored] = context.cost_model.predict(cands[unscored])
    return cands, scores


class GreedySampling:
    """AutoTVM's: the best-predicted candidates not measured, the last ``eps`` of the batch random
    (ε-greedy); a uniform random first batch."""

    fills_batch = True

    def __init__(self, eps: float = 0.05):
        self.eps = eps

    def first(self, context, n: int) -> np.ndarray:
        return context.unmeasured(context.space.random(4 * n, context.rng))[:n]

    def sample(self, context, configs: np.ndarray, scores: np.ndarray | None, n: int) -> tuple[np.ndarray, dict]:
        st = context
        cands, scores = _scored(st, configs, scores)
        n_random = int(round(self.eps * n))
        picks = greedy_top_k(cands, scores, st.measured_keys(), n - n_random)
        rand = st.unmeasured(st.space.random(4 * n, st.rng))
        return np.concatenate([picks, rand[: n - len(picks)]]), {"candidates": len(cands), "k": None}


class AdaptiveSampling:
    """Chameleon's: k-means over the candidates with k at the loss curve's knee, one valid, fresh
    config per cluster (Sample Synthesis for visited ones), plus coverage probes.  It measures
    fewer than a batch on purpose, so the loop does not top it up."""

    fills_batch = False

    def __init__(self, pool: int = 512, k_min: int = 8, k_max: int = 64, threshold: float = 2.5,
                 snap: str = "best", n_first: int = 16, probes: int = 1, probe_refine: bool = True):
        if snap not in ("best", "centroid"):
            raise ValueError("snap must be 'best' or 'centroid'")
        self.pool, self.k_min, self.k_max, self.threshold, self.snap = pool, k_min, k_max, threshold, snap
        self.n_first, self.probes, self.probe_refine = n_first, probes, probe_refine
        self._probe_knob = 0

    def first(self, context, n: int) -> np.ndarray:
        st, n = context, min(n, self.n_first)
        return st.unmeasured(np.concatenate([st.space.sample_prior(n, st.rng), st.space.random(4 * n, st.rng)]))[:n]

    def sample(self, context, configs: np.ndarray, scores: np.ndarray | None, n: int) -> tuple[np.ndarray, dict]:
        st = context
        cands, scores = _scored(st, configs, scores)
        visited = st.measured_keys()
        top = np.argsort(-scores, kind="stable")[: self.pool]
        out = adaptive_sample(cands[top], st.space.sizes, visited, k_min=self.k_min, k_max=min(self.k_max, n),
                              threshold=self.threshold, seed=int(st.rng.integers(1 << 30)),
                              resolve=st.resolve, scores=scores[top] if self.snap == "best" else None)[:n]
        k = len(out)
        return np.concatenate([out, self._probe(st, visited, out, n - k)]), {"candidates": len(cands), "k": k}

    def _probe(self, context, visited: set, picked: np.ndarray, room: int) -> np.ndarray:
        """Up to ``probes`` coverage probes at the best measured config, one knob each, the knobs
        taken in turn (the design-space knob among them)."""
        st = context
        best, out = st.best(1), []
        if not len(best) or room <= 0:
            return np.empty((0, st.space.ndim), dtype=np.int64)
        best = best[0]
        knobs = np.flatnonzero(st.space.movable(best))
        taken = visited | {tuple(int(x) for x in c) for c in picked}
        measured = np.array(list(st.outcomes), dtype=np.int64).reshape(-1, st.space.ndim)
        for _ in range(min(self.probes, room, len(knobs))):
            knob = knobs[self._probe_knob % len(knobs)]
            self._probe_knob += 1
            pick = coverage_probe(best, knob, st.space, measured, taken, st.resolve, st.cost_model.predict)
            if pick is not None and self.probe_refine:
                refined = refine_on_model(pick[0], knob, st.space, st.cost_model.predict)
                key = st.key(refined)
                if key is not None and key not in taken:
                    pick = (refined, key)
            if pick is not None:
                taken.add(pick[1])
                out.append(pick[0])
        return np.array(out, dtype=np.int64).reshape(-1, st.space.ndim)
