"""What the search knows so far: the knob space, the cost model and every outcome.  The loops
(``tuner.TaskTuner``, ``ms_adapter.MetaScheduleStrategy``) write it; strategies read it through
its ``SearchContext``."""
from __future__ import annotations

import logging
from collections.abc import Mapping
from types import MappingProxyType

import numpy as np
import tvm_ffi

from .cost_model import CostModel
from .knobs import first_rows, row_keys
from .space import KnobSpace

log = logging.getLogger("adaptune")


class SearchContext:
    """The read-only view of a ``TuneState`` that strategies get: the knob space, the cost model,
    the search's rng, what was measured (by key) and the last iteration's timings.

    A config's key is the kernel it gives (``resolve``), the key the loop records it under; a
    strategy that keys configs any other way can propose a kernel measured already."""

    def __init__(self, state: "TuneState"):
        self._state = state

    @property
    def space(self) -> KnobSpace:
        return self._state.space

    @property
    def cost_model(self) -> CostModel:
        return self._state.cost_model

    @property
    def rng(self) -> np.random.Generator:
        return self._state.rng

    @property
    def timings(self) -> tuple[float | None, float | None]:
        """(build+run seconds, other seconds) of the last iteration; None before the first."""
        return self._state.measure_s, self._state.overhead_s

    @property
    def best_latency(self) -> float | None:
        return self._state.best_latency

    def best(self, k: int = 1) -> np.ndarray:
        return self._state.best(k)

    @property
    def outcomes(self) -> Mapping[tuple, float | None]:
        """Key -> latency (None: failed) of every config measured, in measurement order; read-only."""
        return MappingProxyType(self._state.results)

    def measured_keys(self) -> set[tuple]:
        return self._state.measured_keys()

    def unmeasured(self, configs: np.ndarray, *, index: bool = False):
        return self._state.unmeasured(configs, index=index)

    def resolve(self, configs: np.ndarray) -> list[tuple | None]:
        return self._state.resolve(configs)

    def key(self, config) -> tuple | None:
        """``resolve`` for one config: its kernel's key, or None where TVM rejects it."""
        return self._state.resolve(np.atleast_2d(config))[0]


class TuneState:
    """Knob space, cost model and every outcome so far; the loop writes it, strategies read its
    ``context``."""

    def __init__(self, space: KnobSpace, *, seed: int = 0, cost_model: CostModel | None = None):
        self.space = space
        self.rng = np.random.default_rng(seed)
        self.cost_model = cost_model or CostModel(space, seed=seed)
        self.results: dict[tuple, float | None] = {}     # canonical config -> latency (None: failed)
        self.invalid: set[tuple] = set()
        self.aliases: dict[tuple, tuple] = {}           # config -> the other key TVM replayed it as
        self.kernels: dict[int, tuple] = {}             # structural hash of a decoded kernel -> its key
        self.measure_s: float | None = None             # build+run seconds of the last batch
        self.overhead_s: float | None = None            # its iteration's other seconds (search, refit, ...)
        self.context = SearchContext(self)

    # -- read (through ``context``) ------------------------------------------------------------------
    def measured_keys(self) -> set[tuple]:
        """Keys measured or known invalid, and the configs known to be one of them once replayed
        (see ``_decode``): the agent walks back onto those often, and each would otherwise cost a
        replay and, at the head of a cluster, a Sample Synthesis."""
        done = self.results.keys() | self.invalid
        return done | {raw for raw, key in self.aliases.items() if key in done}

    def unmeasured(self, configs: np.ndarray, *, index: bool = False):
        """Rows of ``configs`` (canonicalised, deduplicated, first-seen order) not measured or
        invalid, nor outside a GPU's thread limits (``KnobSpace.plausible``); with ``index``, also
        the positions in ``configs`` they were taken from."""
        canon = self.space.canonical(configs)
        keep = first_rows(canon)
        keep = keep[self.space.plausible(canon[keep])]
        seen = self.measured_keys()
        if seen and len(keep):
            keep = keep[~np.isin(row_keys(canon[keep]), row_keys(np.array(list(seen), dtype=np.int64)))]
        return (canon[keep], keep) if index else canon[keep]

    def resolve(self, configs: np.ndarray) -> list[tuple | None]:
        """Per row, the key the config would be measured under (its canonical form once TVM has
        replayed it), or None for a config TVM rejects; rejected ones join ``invalid``.  Decodes
        are cached, so measuring a resolved config does not replay it again."""
        keys = []
        for sch, _, key in self._decode(configs):
            if sch is None:
                self.invalid.add(key)
            keys.append(key if sch is not None else None)
        return keys

    def _decode(self, configs: np.ndarray) -> list[tuple[object, str, tuple]]:
        """``KnobSpace.decode_many``, keyed by kernel: a config's key is the first config seen that
        gives the same kernel (same TIR after the postprocessors); notes the aliases.

        Different knob values can give one kernel: ``KnobSpace`` keys a compute location by where
        TVM settles it, but tilings that differ only in where a unit-extent loop sits often give
        one loop nest too, and MetaSchedule's evolutionary search skips those by structural hash
        too."""
        configs = self.space.canonical(configs)
        out = []
        for c, (sch, reason, canon) in zip(configs, self.space.decode_many(configs)):
            raw, settled = tuple(int(x) for x in c), tuple(int(x) for x in canon)
            key = settled
            if sch is not None:
                key = self.kernels.setdefault(tvm_ffi.structural_hash(sch.mod), settled)
            for alias in {raw, settled} - {key}:
                self.aliases[alias] = key
            out.append((sch, reason, key))
        return out

    def best(self, k: int = 1) -> np.ndarray:
        """The ``k`` fastest measured configs."""
        good = sorted((lat, key) for key, lat in self.results.items() if lat is not None)
        return np.array([key for _, key in good[:k]], dtype=np.int64).reshape(-1, self.space.ndim)

    @property
    def best_latency(self) -> float | None:
        lats = [v for v in self.results.values() if v is not None]
        return min(lats) if lats else None

    # -- write (the loops) ------------------------------------------------------------------------
    def prepare(self, strategy, n: int, attempts: int = 3,
                fill_rounds: int = 4) -> list[tuple[np.ndarray, object]]:
        """Ask the strategy for up to ``n`` configs; decode them; drop duplicates and invalid ones.

        If the strategy comes back with too little that is measurable, up to ``fill_rounds``
        rounds of random configs fill in (a strategy must never stall the run): on a GPU, where
        ~1-5% of a design space passes ``VerifyGPUCode``, a short round is normal, not a sign
        of exhaustion.  An empty list means the space is exhausted."""
        batch: list[tuple[np.ndarray, object]] = []
        keys: set[tuple] = set()
        for attempt in range(attempts + fill_rounds):
            want = n - len(batch)
            if want <= 0:
                break
            if attempt < attempts:
                proposals = np.atleast_2d(strategy.propose(want))[: want * 4]
            else:
                proposals = self.space.random(16 * want, self.rng)
            for sch, reason, key in self._decode(proposals):
                if key in keys or key in self.results or key in self.invalid:
                    continue
                if sch is None:
                    self.invalid.add(key)
                    log.debug("invalid config %s: %s", key, reason)
                    continue
                keys.add(key)
                batch.append((np.array(key, dtype=np.int64), sch))
                if len(batch) == n:
                    break
            if batch and not strategy.fills_batch:
                break      # e.g. adaptive sampling chose fewer on purpose
        return batch

    def record(self, configs: np.ndarray, latencies: list) -> None:
        for c, lat in zip(configs, latencies):
            self.results[tuple(int(x) for x in c)] = lat

    def resume(self, configs: np.ndarray, latencies: list) -> None:
        """Start from earlier measurements: record them, note their kernels (so no alias of one is
        measured again) and fit the cost model on them."""
        self.record(configs, latencies)
        if len(configs):
            self.resolve(np.asarray(configs, dtype=np.int64))
        self.refit()

    def after_measure(self, strategy, configs: np.ndarray, latencies: list) -> None:
        """A batch's outcomes are in: record them, refit the cost model, tell the strategy."""
        self.record(configs, latencies)
        self.refit()
        strategy.update(np.asarray(configs, dtype=np.int64).reshape(-1, self.space.ndim), list(latencies))

    def refit(self) -> None:
        if not self.results:
            return
        keys = list(self.results)
        self.cost_model.fit(np.array(keys, dtype=np.int64), [self.results[k] for k in keys])
