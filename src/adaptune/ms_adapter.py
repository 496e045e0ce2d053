"""Any adaptune strategy as a MetaSchedule search strategy.

``ms.tune_tir(mod, target, ..., strategy=MetaScheduleStrategy("sa"))`` runs our search inside
MetaSchedule's own loop: MetaSchedule builds, runs and stores records; we propose candidates from
the knob space and refit our cost model on its results (its ``cost_model`` argument is unused).
"""
from __future__ import annotations

import time
from typing import List, Optional

import numpy as np
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.search_strategy import MeasureCandidate, PySearchStrategy

from ._tvm import ms
from .measure.run import latency
from .search.space import KnobSpace
from .search.strategies import make_strategy
from .search.state import TuneState


@derived_object
class MetaScheduleStrategy(PySearchStrategy):
    def __init__(self, strategy="chameleon", seed: int = 0, **options):
        self.strategy_spec, self.seed, self.options = strategy, seed, options

    def _initialize_with_tune_context(self, context) -> None:
        self.mod, self.target = context.mod, context.target
        self.postprocs = context.space_generator.postprocs

    def pre_tuning(self, max_trials: int, num_trials_per_iter: int, design_spaces, database=None,
                   cost_model=None) -> None:
        space = KnobSpace(self.mod, self.target, seed=self.seed, design_spaces=design_spaces,
                          postprocs=self.postprocs)
        self.state = TuneState(space, seed=self.seed)
        self.strategy = make_strategy(self.strategy_spec, **self.options)
        self.strategy.setup(self.state.context)
        self.max_trials, self.per_iter, self.done = max_trials, num_trials_per_iter, 0
        self.pending: list[np.ndarray] = []
        if database is not None and database.has_workload(space.mod):     # reuse earlier records
            configs, lats = [], []
            for rec in database.get_top_k(database.commit_workload(space.mod), 1 << 30):
                config = space.encode(rec.trace)
                if config is not None:
                    configs.append(config)
                    lats.append(latency(rec.run_secs))
            self.state.resume(np.array(configs, dtype=np.int64).reshape(-1, space.ndim), lats)

    def post_tuning(self) -> None:
        self.pending = []

    def generate_measure_candidates(self) -> Optional[List[MeasureCandidate]]:
        if self.done >= self.max_trials:
            return None
        t0 = time.perf_counter()
        batch = self.state.prepare(self.strategy, min(self.per_iter, self.max_trials - self.done))
        if not batch:
            return None
        self.pending = [c for c, _ in batch]
        self.handed_out = time.perf_counter()      # MetaSchedule builds and runs from here to notify
        self.generate_s = self.handed_out - t0
        return [MeasureCandidate(sch, ms.arg_info.ArgInfo.from_entry_func(sch.mod, remove_preproc=True))
                for _, sch in batch]

    def notify_runner_results(self, measure_candidates, results) -> None:
        t0 = time.perf_counter()
        self.state.measure_s = t0 - self.handed_out
        lats = [latency(r.run_secs) if r.error_msg is None and r.run_secs else None for r in results]
        self.done += len(results)
        self.state.after_measure(self.strategy, np.array(self.pending), lats)
        self.state.overhead_s = self.generate_s + time.perf_counter() - t0

    def clone(self) -> "MetaScheduleStrategy":
        return MetaScheduleStrategy(self.strategy_spec, self.seed, **self.options)
