"""The tuning loop for one operator: propose -> decode -> measure -> record -> refit -> update.

``search.state.TuneState`` is what both front doors share: ``tune_tir`` (our own loop, with
records and resume) and ``MetaScheduleStrategy`` (MetaSchedule's loop); strategies see its
read-only ``SearchContext``.
"""
from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ._tvm import ms
from .measure.records import RecordStore
from .measure.paired import Incumbent, kernel_sampler
from .measure.run import OK, WRONG, Measurer, MeasureResult
from .search.space import KnobSpace
from .search.state import TuneState
from .search.strategies import make_strategy
from .measure.target import parse_target
from .measure.verify import KernelChecker

log = logging.getLogger("adaptune")

PEAK_SLACK = 1.1    # kernels time at up to ~1.05x the FMA loop's own rate (the clock moves); estimates
                    # at 1.18x and 1.44x it came from the pairing, not from faster kernels (session 91)


def fastest_possible(mod, target) -> float:
    """Seconds ``mod``'s arithmetic takes at PEAK_SLACK times this CPU's FMA peak
    (``best_fma_peak_gflops``); 0 where no such peak is measured here (a GPU)."""
    if target.kind.name != "llvm":
        return 0.0
    from tvm.s_tir.analysis import estimate_tir_flops
    from .model.timing import best_fma_peak_gflops
    return float(estimate_tir_flops(mod)) / (PEAK_SLACK * best_fma_peak_gflops(target) * 1e9)


@dataclass
class TuneResult:
    workload: str
    best_config: np.ndarray | None
    best_latency: float | None          # seconds
    best_schedule: object | None
    trials: int                         # candidates measured (this run and resumed ones)
    new_trials: int                     # measured in this run
    invalid: int
    failures: dict[str, int]
    wall_time: float
    history: list[tuple[int, float, float | None]] = field(default_factory=list)  # (trial, elapsed s, best so far)
    overhead: float = 0.0               # seconds outside build+run (search, decode, model, checks, records)
    setup_time: float = 0.0             # of which one-off: design spaces, knobs, reference kernel
    work_dir: str | None = None
    last_error: str = ""                # the latest failure's kind and message


class TaskTuner:
    """One task's tuning loop, run one iteration at a time so a scheduler can interleave tasks.

    Each ``step`` is one iteration: the strategy proposes, candidates are decoded, measured and
    recorded (to the work dir the moment each result is known), the cost model is refit and the
    strategy updated.  A candidate measured faster than the best so far is checked (``verify``)
    and, with ``confirm``, timed again beside the best and recorded at the paired estimate
    (``measure.paired``: on a noisy machine the fastest single measurement is the luckiest), unless
    the estimate is faster than the CPU's FMA peak allows (``fastest_possible``)."""

    def __init__(self, mod, target, *, strategy="chameleon", seed: int = 0, store_args: dict | None = None,
                 measurer: Measurer | None = None, label: str = "", strategy_options: dict | None = None,
                 on_result: Callable[["TaskTuner"], None] | None = None, verify: bool = True,
                 spaces: str = "auto", confirm: bool = True):
        self.t0 = time.perf_counter()
        self.label = label or "main"
        self.space = KnobSpace(mod, target, seed=seed, spaces=spaces)
        self.state = TuneState(self.space, seed=seed)
        self.strategy = make_strategy(strategy, **(strategy_options or {}))
        self.strategy.setup(self.state.context)
        self.owns_measurer = measurer is None
        self.measurer = measurer or Measurer(self.space.target)
        self.store = RecordStore(space=self.space, label=label, **store_args) if store_args else None
        self.on_result = on_result
        self.checker = KernelChecker(mod, self.space.target, seed=seed) if verify else None
        self.incumbent = Incumbent() if confirm else None
        if self.checker is not None:    # one-off, so part of setup rather than of an iteration
            try:
                self.checker.reference()
            except Exception:  # noqa: BLE001 - the first check meets the same error and reports it
                pass
        self.schedules: dict[tuple, object] = {}
        self.failures: dict[str, int] = {}
        self.history: list[tuple[int, float, float | None]] = []
        self.measure_time = 0.0
        self.exhausted = False
        self.last_error = ""
        if self.store is not None:
            configs, lats = self.store.measured()
            for res in self.store.records.values():
                if not res.ok:
                    self.failures[res.error] = self.failures.get(res.error, 0) + 1
            if len(configs):
                log.info("%s: resumed %d measured record(s)", self.label, len(configs))
            self.state.resume(configs, lats)
        self.done0 = len(self.state.results)
        self.setup_time = time.perf_counter() - self.t0

    @property
    def trials(self) -> int:
        return len(self.state.results)

    def step(self, n: int) -> int:
        """Measure up to ``n`` new candidates; returns how many (0 once the space is exhausted)."""
        t0 = time.perf_counter()
        batch = self.state.prepare(self.strategy, n)
        if not batch:
            if not self.exhausted:
                log.info("%s: design space exhausted after %d configs", self.label, self.trials)
            self.exhausted = True
            return 0
        tm = time.perf_counter()
        bookkeeping = 0.0       # checking and recording results: overhead, not measurement
        latencies: list[float | None] = [None] * len(batch)

        def on_result(i: int, res: MeasureResult) -> None:
            nonlocal bookkeeping
            t = time.perf_counter()
            config, sch = batch[i]
            res = self._confirmed(sch, self._verified(sch, res))
            if self.store is not None:
                self.store.add(config, sch, res)
            self.state.record([config], [res.latency])     # now: the next check compares with it
            latencies[i] = res.latency
            if res.ok:
                self.schedules[tuple(int(x) for x in config)] = sch
            else:
                self.failures[res.error] = self.failures.get(res.error, 0) + 1
                self.last_error = f"{res.error}: {res.message}"
            self.history.append((self.trials, time.perf_counter() - self.t0, self.state.best_latency))
            if self.on_result is not None:
                self.on_result(self)
            bookkeeping += time.perf_counter() - t

        self.measurer.measure([sch.mod for _, sch in batch], on_result=on_result)
        self.state.measure_s = time.perf_counter() - tm - bookkeeping
        self.measure_time += self.state.measure_s
        self.state.after_measure(self.strategy, np.array([c for c, _ in batch]), latencies)
        self.state.overhead_s = time.perf_counter() - t0 - self.state.measure_s
        return len(batch)

    def _verified(self, sch, res: MeasureResult) -> MeasureResult:
        """A would-be new best must compute what the untuned kernel computes (see verify.py)."""
        best = self.state.best_latency
        if self.checker is None or not res.ok or (best is not None and res.latency >= best):
            return res
        try:
            ok, why = self.checker.check(sch.mod, res.artifact if res.own_args else None)
        except Exception as e:  # noqa: BLE001 - a kernel we cannot re-run is not trusted either
            ok, why = False, f"could not be re-run for checking: {type(e).__name__}: {e}"
        if ok is False:
            log.warning("%s: fast candidate rejected, wrong result (%s)", self.label, why)
            return MeasureResult(WRONG, res.run_secs, why)
        return res

    def _confirmed(self, sch, res: MeasureResult) -> MeasureResult:
        """A would-be new best timed again beside the incumbent, alternately; recorded at the
        incumbent's latency times their paired ratio (``Incumbent.challenge``; the latency scaled and
        the measurement alone are in its message)."""
        best = self.state.best_latency
        if self.incumbent is None or not res.ok or res.artifact is None or (best is not None and res.latency >= best):
            return res
        if self.incumbent.sample is None and best is not None and not self.incumbent.lost:
            try:
                self._load_incumbent()
            except Exception as e:  # noqa: BLE001 - tried once: the challenger below is crowned as measured
                log.warning("%s: the resumed best could not be timed again (%s: %s); the next best is kept as measured",
                            self.label, type(e).__name__, e)
                self.incumbent.lost = True
        try:
            sample = kernel_sampler(sch.mod, res.artifact, self.space.target)
            if self.incumbent.sample is None:
                self.incumbent.crown(sample, res.latency)
                return res
            estimate, ratio, scale = self.incumbent.challenge(sample)
        except Exception as e:  # noqa: BLE001 - a kernel that cannot be re-timed keeps its measurement
            log.warning("%s: a new best could not be timed beside the incumbent (%s: %s); kept as measured",
                        self.label, type(e).__name__, e)
            return res
        paired = f"paired with the best so far: {ratio:.4g}x its {scale * 1e3:.4g} ms"
        if estimate < res.latency and estimate < self._floor:
            # the two kernels slowed unequally between the incumbent's record and the pairs
            self.incumbent.crown(sample, res.latency)
            return MeasureResult(OK, res.run_secs, f"{paired} = {estimate * 1e3:.4g} ms, faster than this "
                                                   "CPU's FMA peak allows: kept as measured alone")
        return MeasureResult(OK, [estimate], f"{paired} (measured alone: {res.latency * 1e3:.4g} ms)")

    @functools.cached_property
    def _floor(self) -> float:
        """``fastest_possible`` for this task, measured at the first need, on a local device only (the
        peak is this machine's)."""
        return 0.0 if self.measurer.rpc is not None else fastest_possible(self.space.mod, self.space.target)

    def _load_incumbent(self) -> None:
        """The resumed best record's kernel, built again to be timed beside a challenger."""
        config = self.state.best(1)[0]
        sch = self.schedules.get(tuple(int(x) for x in config)) or self.space.decode(config)[0]
        built = self.measurer.builder.build([ms.builder.BuilderInput(sch.mod, self.space.target)])[0]
        if built.error_msg is not None:
            raise RuntimeError(f"the resumed best does not build again: {built.error_msg[-200:]}")
        try:
            self.incumbent.crown(kernel_sampler(sch.mod, built.artifact_path, self.space.target),
                                 self.state.best_latency)
        finally:
            ms.utils.remove_build_dir(built.artifact_path)

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
        if self.owns_measurer:
            self.measurer.close()

    def result(self) -> TuneResult:
        best = self.state.best(1)
        best_config = best[0] if len(best) else None
        best_sch = None
        if best_config is not None:
            best_sch = self.schedules.get(tuple(best_config)) or self.space.decode(best_config)[0]
        wall = time.perf_counter() - self.t0
        return TuneResult(workload=self.label, best_config=best_config, best_latency=self.state.best_latency,
                          best_schedule=best_sch, trials=self.trials, new_trials=self.trials - self.done0,
                          invalid=len(self.state.invalid), failures=self.failures, wall_time=wall,
                          history=self.history, overhead=wall - self.measure_time, setup_time=self.setup_time,
                          work_dir=str(self.store.dir) if self.store else None, last_error=self.last_error)


def tune_tir(mod, target=None, *, strategy="chameleon", trials: int = 64, work_dir=None, resume: bool = False,
             seed: int = 0, batch_size: int | None = None, measurer: Measurer | None = None,
             on_progress: Callable[[int, int, float | None], None] | None = None,
             label: str = "", strategy_options: dict | None = None, spaces: str = "auto") -> TuneResult:
    """Tune one TIR workload with an adaptune strategy.

    ``trials`` is the total measurement budget of the work dir: a resumed run measures only what
    is left.  ``spaces`` picks the design spaces (``knobs.space_generator``: auto, generic, expert,
    both).  ``batch_size`` (configs per iteration) defaults to 64, capped at trials/4 so even
    small budgets give the cost model several rounds."""
    if trials <= 0:
        raise ValueError("trials must be positive")
    target = parse_target(target)
    progress = None if on_progress is None else (lambda t: on_progress(t.trials, trials, t.state.best_latency))
    tuner = TaskTuner(mod, target, strategy=strategy, seed=seed, measurer=measurer, label=label,
                      strategy_options=strategy_options, on_result=progress, spaces=spaces,
                      store_args={"work_dir": work_dir, "resume": resume} if work_dir else None)
    batch_size = batch_size or max(1, min(64, max(8, trials // 4)))
    try:
        while tuner.trials < trials and tuner.step(min(batch_size, trials - tuner.trials)):
            pass
    finally:
        tuner.close()
    return tuner.result()
