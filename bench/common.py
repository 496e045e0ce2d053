"""Shared pieces of the benchmarks: run one strategy or TVM's stock search on a workload, the same
builder/runner settings for all, every best kernel checked against numpy before it is reported."""
from __future__ import annotations

import datetime as dt
import json
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from adaptune import tune_tir
from adaptune.measure.build import fast_build
from adaptune._tvm import ms
from adaptune.cli.ops import check_numerics
from adaptune.measure.run import MeasureResult, Measurer, latency
from adaptune.measure.workdir import WorkDir
from adaptune.search.knobs import space_generator
from adaptune.search.strategies import make_strategy


@dataclass
class Run:
    strategy: str
    layer: str
    curve: list            # (trials, elapsed s, best latency s) after each measurement
    best: float            # s
    wall: float            # s
    overhead: float        # s outside build+run (nan where unknown)
    iterations: int
    numerics_ok: bool
    steps: list = None     # explorer's steps to converge per iteration (sa / rl variants)
    setup: float = 0.0     # s of the overhead that is one-off (design spaces, knobs, reference kernel)

    @property
    def search_share(self) -> float:
        """Search overhead after setup as a share of measurement (build+run) time."""
        return (self.overhead - self.setup) / max(self.wall - self.overhead, 1e-9)

    def trials_to(self, latency: float) -> int | None:
        """Measurements until the best reached ``latency`` (None if never)."""
        return next((t for t, _, b in self.curve if b is not None and b <= latency * (1 + 1e-9)), None)

    def time_to(self, latency: float) -> float | None:
        return next((s for _, s, b in self.curve if b is not None and b <= latency * (1 + 1e-9)), None)

    def best_at(self, trials: int) -> float | None:
        """Best latency after the first ``trials`` measurements (None if none succeeded)."""
        return next((b for t, _, b in reversed(self.curve) if t <= trials), None)


def geomean(xs):
    """Geometric mean of the positive finite values (nan if none)."""
    xs = [x for x in xs if x is not None and x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def run_adaptune(wl, target, strategy, trials, batch, out: Path, seed=0, timeout=30.0, build_workers=None,
                 on_progress=None) -> Run:
    wd = out / f"{wl.label}-{strategy}"
    shutil.rmtree(wd, ignore_errors=True)
    strat = make_strategy(strategy)
    res = tune_tir(wl.mod(), target, strategy=strat, trials=trials, batch_size=batch, work_dir=wd, seed=seed,
                   measurer=Measurer(target, timeout=timeout, build_workers=build_workers), label=wl.label,
                   on_progress=on_progress)
    ok, _ = check_numerics(wl, res.best_schedule, target)
    iters = 1 + len(getattr(strat, "log", [])) if hasattr(strat, "log") else -(-res.trials // batch)
    steps = [e["steps"] for e in getattr(strat, "log", [])] or list(getattr(strat, "steps_taken", []))
    return Run(strategy, wl.label, res.history, res.best_latency, res.wall_time, res.overhead, iters, ok, steps,
               res.setup_time)


def run_ms_evolutionary(wl, target, trials, batch, out: Path, seed=0, timeout=30.0, build_workers=None) -> Run:
    """TVM MetaSchedule's default search (evolutionary + XGBoost), with our build function and runner
    and the design spaces our knob spaces are made of (``space_generator``: its default ones, except
    that a float32 CUDA workload skips the inapplicable tensor-core rules); it keeps its own
    ``LocalBuilder``, which starts fresh workers for each batch (its stock behaviour).  With a
    device lock (``ADAPTUNE_DEVICE_LOCK``) each batch's runs hold it, as our measurements do."""
    wd = out / f"{wl.label}-ms-evolutionary"
    shutil.rmtree(wd, ignore_errors=True)
    m = Measurer(target, timeout=timeout)
    t0 = time.perf_counter()
    db = ms.tune_tir(wl.mod(), target, work_dir=str(wd), max_trials_global=trials, num_trials_per_iter=batch,
                     builder=ms.builder.LocalBuilder(f_build=fast_build, timeout_sec=timeout,
                                                     max_workers=build_workers),
                     runner=m.ms_runner, strategy="evolutionary", cost_model="xgb", seed=seed,
                     space=space_generator(wl.mod(), target))
    wall = time.perf_counter() - t0
    curve = ms_curve(wd, wall)
    best = curve[-1][2]
    sch = ms.tir_integration.compile_tir(db, wl.mod(), target)
    ok, _ = check_numerics(wl, sch, target)
    search, iters = ms_search_seconds(wd / "logs" / "tvm.s_tir.meta_schedule.logging.task_scheduler.log")
    return Run("ms-evolutionary", wl.label, curve, best, wall, search, iters or -(-trials // batch), ok)


def _curve(latencies, times) -> list:
    """(trials, elapsed s, best so far) after each measurement."""
    curve, best = [], None
    for i, (lat, t) in enumerate(zip(latencies, times), 1):
        if lat is not None and (best is None or lat < best):
            best = lat
        curve.append((i, t, best))
    return curve


def ms_curve(wd: Path, wall: float) -> list:
    """MetaSchedule's convergence curve from its record file, which is appended as candidates are
    measured (its order is the measurement order); MS keeps no per-record time, so ``wall`` is
    spread evenly."""
    lines = (wd / "database_tuning_record.json").read_text().splitlines()
    lats = []
    for ln in lines:
        secs = [float(x) for x in json.loads(ln)[1][1] or []]
        lats.append(latency(secs) if secs and max(secs) < 1e9 else None)
    return _curve(lats, [wall * i / len(lines) for i in range(1, len(lines) + 1)])


def adaptune_curve(wd: Path) -> list:
    """Our convergence curve from a work dir's ``adaptune_records.jsonl`` (one line per measured
    candidate, in measurement order; elapsed time from the first record's timestamp)."""
    rows = WorkDir(wd).records()
    lats = [MeasureResult(r["error"], r["run_secs"]).latency for r in rows]
    return _curve(lats, [r["time"] - rows[0]["time"] for r in rows])


def ms_search_seconds(log: Path) -> tuple[float, int]:
    """MetaSchedule's search time from its task-scheduler log: per iteration, from "picks Task"
    to "Sending ... to builder" (generating and choosing candidates; whole seconds only)."""
    def stamp(line):
        return dt.datetime.strptime(line[:19], "%Y-%m-%d %H:%M:%S").timestamp()
    total, iters, start = 0.0, 0, None
    for line in log.read_text().splitlines() if log.exists() else []:
        if "picks Task" in line:
            start = stamp(line)
        elif "to builder" in line and start is not None:
            total, iters, start = total + stamp(line) - start, iters + 1, None
    return total, iters


def cost_model_speed(wl, target, n=10_000, repeats=5) -> tuple[float, float]:
    """Seconds to score ``n`` configs with a trained cost model: (median, fit time)."""
    from adaptune.search.cost_model import CostModel
    from adaptune.search.space import KnobSpace

    space = KnobSpace(wl.mod(), target)
    rng = np.random.default_rng(0)
    train = space.random(256, rng)
    model = CostModel(space)
    t = time.perf_counter()
    model.fit(train, list(rng.uniform(1e-4, 1e-3, len(train))))
    fit = time.perf_counter() - t
    configs = space.random(n, rng)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        model.predict(configs)
        times.append(time.perf_counter() - t)
    return float(np.median(times)), fit
