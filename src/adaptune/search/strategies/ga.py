"""Woodpecker-DL's genetic search (§2.3): evolve knob vectors on measured runtimes alone.

* Step1: a random population; every member is checked valid (it decodes to a schedule) before
  it enters, so nothing invalid is ever proposed for measurement.
* Step2: fitness f = 1 / latency, measured on the hardware; a failed build or run scores 0.
* Step3: the fittest ``elite`` fraction passes on unchanged; every other child comes from two
  roulette-wheel parents (Eqs. 1-2), uniform per-knob crossover and per-knob mutation, redrawn
  until it decodes and was never measured (random valid configs fill in if that keeps failing).
* Step4: the paper stops once a generation's runtimes are close.  Under a fixed measurement
  budget stopping would waste it, so convergence (coefficient of variation of the population's
  runtimes below ``cv_threshold``) re-seeds instead: half of the next generation's children are
  fresh random configs.  (Re-seeding rather than a larger mutation rate: a converged population
  of near-copies mutated harder still crosses over into the same basin.)

A generation is the elites (already measured) plus the ``n`` children asked for, so the population
size follows the batch size, as the paper allows.  No cost model: the paper's search is
measurement-driven, and its Fig. 3a compares searches without one (chameleon is the model-based
entry of bench/search.py).
"""
from __future__ import annotations

import numpy as np

from .base import Strategy, register


def roulette_select(fitness, k: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of ``k`` individuals drawn by roulette wheel, with replacement.

    Selection probability p(a_i) = f(a_i) / sum f (Eq. 1), cumulative P(a_i) (Eq. 2); a uniform
    v in (0, 1] picks the i with P(a_{i-1}) < v <= P(a_i), so zero fitness is never picked (when
    every fitness is zero, all are equally likely)."""
    f = np.asarray(fitness, dtype=np.float64)
    if not f.sum() > 0:
        return rng.integers(len(f), size=k)
    cum = np.cumsum(f / f.sum())                                   # Eq. 1, then Eq. 2
    v = (1.0 - rng.random(k)) * cum[-1]                            # (0, P(a_m)]: rounding-safe
    return np.searchsorted(cum, v, side="left")


def crossover(a: np.ndarray, b: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Uniform crossover: each knob from ``a`` or ``b`` with equal chance."""
    return np.where(rng.random(len(a)) < 0.5, a, b)


def mutate(config: np.ndarray, sizes: np.ndarray, rate: float, rng: np.random.Generator) -> np.ndarray:
    """Each knob with more than one value, with probability ``rate``, set to a different value of
    its domain (pass size 1 for knobs that must not move)."""
    sizes = np.asarray(sizes)
    flip = (rng.random(len(config)) < rate) & (sizes > 1)
    step = 1 + (rng.random(len(config)) * np.maximum(sizes - 1, 1)).astype(np.int64)
    return np.where(flip, (config + step) % np.maximum(sizes, 1), config)


def converged(latencies, threshold: float) -> bool:
    """Step4: the population's measured runtimes are close (coefficient of variation < threshold)."""
    lats = np.array([x for x in latencies if x is not None], dtype=np.float64)
    return len(lats) >= 2 and float(lats.std() / lats.mean()) < threshold


@register("ga")
class GeneticSearch(Strategy):
    def __init__(self, elite: float = 0.25, mutation: float = 0.1, cv_threshold: float = 0.05,
                 reseed: float = 0.5, tries: int = 50):
        self.elite, self.mutation, self.cv_threshold = elite, mutation, cv_threshold
        self.reseed, self.tries = reseed, tries
        self.population: list[tuple[tuple, float | None]] = []     # (canonical config, latency) of the generation
        self.elites: list[tuple[tuple, float | None]] = []

    def _admit(self, config: np.ndarray, seen: set, taken: set) -> np.ndarray | None:
        """``config``'s key (its kernel, as the loop records it) if TVM accepts it and it was
        neither measured nor ``taken``; the key is then taken."""
        key = self.state.key(config)
        if key is None or key in seen or key in taken or not self.state.space.is_valid(np.array(key)):
            return None
        taken.add(key)
        return np.array(key, dtype=np.int64)

    def _fresh(self, n: int, taken: set) -> list[np.ndarray]:
        """Up to ``n`` random configs that decode and were neither measured nor ``taken``."""
        st, out = self.state, []
        for _ in range(self.tries):
            seen = st.measured_keys()
            for c in st.unmeasured(st.space.random(4 * (n - len(out)), st.rng)):
                if len(out) < n and (key := self._admit(c, seen, taken)) is not None:
                    out.append(key)
            if len(out) >= n:
                break
        return out

    def _children(self, n: int, taken: set) -> list[np.ndarray]:
        """Step3: up to ``n`` valid, unmeasured children of roulette-chosen parents."""
        st, space = self.state, self.state.space
        parents = np.array([c for c, _ in self.population], dtype=np.int64)
        fitness = [0.0 if lat is None else 1.0 / lat for _, lat in self.population]
        seen, out = st.measured_keys(), []
        for _ in range(self.tries * n):
            if len(out) == n:
                break
            i, j = roulette_select(fitness, 2, st.rng)
            child = crossover(parents[i], parents[j], st.rng)
            child = mutate(child, np.where(space.active[child[0]], space.sizes, 1), self.mutation, st.rng)
            if (key := self._admit(child, seen, taken)) is not None:
                out.append(key)
        return out

    def propose(self, n: int) -> np.ndarray:
        st = self.state
        if not self.population and st.outcomes:       # resumed: the best records are the first population
            keys = [tuple(int(x) for x in c) for c in st.best(2 * n)]
            self.population = [(k, st.outcomes[k]) for k in keys]
        taken: set = set()
        if not self.population:
            out = self._fresh(n, taken)                                              # Step1
        else:
            ranked = sorted(self.population, key=lambda p: np.inf if p[1] is None else p[1])
            self.elites = [p for p in ranked[:max(1, round(self.elite * len(ranked)))] if p[1] is not None]
            n_fresh = int(self.reseed * n) if converged([lat for _, lat in self.population], self.cv_threshold) else 0
            out = self._fresh(n_fresh, taken)
            out += self._children(n - len(out), taken)
            out += self._fresh(n - len(out), taken)     # the neighbourhood is used up: random valid ones
        return np.array(out, dtype=np.int64).reshape(-1, st.space.ndim)

    def update(self, configs: np.ndarray, latencies: list) -> None:
        """Step2: the measured children and the elites form the next generation."""
        kids = [(tuple(int(x) for x in c), lat) for c, lat in zip(configs, latencies)]
        self.population = self.elites + kids
