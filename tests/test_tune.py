import json
import logging
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from adaptune.testing import faults as faulty
from adaptune import tune_tir
from adaptune._tvm import ms, tvm
from adaptune.cli.ops import check_numerics
from adaptune.measure.records import RECORDS
from adaptune.measure.run import Measurer
from adaptune.model.workloads import get_workload

DENSE = get_workload("tiny-dense")


def _records(wd):
    return [json.loads(ln) for ln in (wd / RECORDS).read_text().splitlines() if ln.strip()]


@pytest.mark.parametrize("strategy", ["random", "sa"])
def test_strategy_end_to_end_with_real_measurements(tmp_path, target, strategy):
    res = tune_tir(DENSE.mod(), target, strategy=strategy, trials=8, batch_size=4, work_dir=tmp_path, seed=1)
    assert res.trials == 8 and res.best_latency > 0
    recs = _records(tmp_path)
    assert len(recs) == 8 and len({tuple(r["config"]) for r in recs}) == 8
    ok, err = check_numerics(DENSE, res.best_schedule, target)
    assert ok, err
    # the work dir is a MetaSchedule database TVM can compile from
    db = ms.database.JSONDatabase(work_dir=str(tmp_path))
    assert len(db) == sum(r["error"] == "ok" for r in recs)
    sch = ms.tir_integration.compile_tir(db, DENSE.mod(), target)
    assert sch is not None
    ok_recs = [r for r in recs if r["error"] == "ok"]
    assert res.best_latency == pytest.approx(min(np.median(r["run_secs"]) for r in ok_recs))
    best = db.get_top_k(db.commit_workload(DENSE.mod()), 1)[0]     # TVM ranks by the mean of the repeats,
    assert np.mean([float(x) for x in best.run_secs]) == pytest.approx(  # we by the median: with noise the
        min(np.mean(r["run_secs"]) for r in ok_recs))                    # two may pick different records
    tvm.compile(sch.mod, target=target)


@pytest.mark.slow
def test_resume_measures_nothing_twice_and_tolerates_torn_lines(tmp_path, target, caplog):
    first = tune_tir(DENSE.mod(), target, strategy="sa", trials=6, batch_size=3, work_dir=tmp_path, seed=2)
    assert first.trials == 6
    with pytest.raises(ValueError, match="--resume"):
        tune_tir(DENSE.mod(), target, trials=6, work_dir=tmp_path)
    before = _records(tmp_path)
    with open(tmp_path / RECORDS, "a") as f:            # a write torn by kill -9
        f.write('{"config": [1, 2')
    with open(tmp_path / "database_tuning_record.json", "a") as f:
        f.write('[0, [[["GetSBlock"')
    with caplog.at_level(logging.WARNING, logger="adaptune"):
        second = tune_tir(DENSE.mod(), target, strategy="sa", trials=9, batch_size=3, work_dir=tmp_path,
                          resume=True, seed=2)
    assert "unreadable line" in caplog.text
    assert second.trials == 9 and second.new_trials == 3
    after = _records(tmp_path)
    assert after[:6] == before and len(after) == 9
    assert len({tuple(r["config"]) for r in after}) == 9
    assert second.best_latency <= first.best_latency


def test_resume_recovers_records_only_in_tvm_database(tmp_path, target):
    tune_tir(DENSE.mod(), target, strategy="random", trials=4, batch_size=4, work_dir=tmp_path, seed=4)
    lines = (tmp_path / RECORDS).read_text().splitlines()
    (tmp_path / RECORDS).write_text("\n".join(lines[:2]) + "\n")   # killed between the two writes
    res = tune_tir(DENSE.mod(), target, strategy="random", trials=4, work_dir=tmp_path, resume=True, seed=4)
    assert res.new_trials == 0 and res.trials == 4
    assert len(_records(tmp_path)) == 4


def test_resume_of_an_older_knob_encoding_rebuilds_records_from_tvm_database(tmp_path, target, caplog):
    tune_tir(DENSE.mod(), target, strategy="random", trials=4, batch_size=4, work_dir=tmp_path, seed=4)
    meta = json.loads((tmp_path / "adaptune.json").read_text())
    old = dict(meta, knob_sizes=[s + 1 for s in meta["knob_sizes"]])      # what encoding 1 wrote
    del old["knob_encoding"]
    (tmp_path / "adaptune.json").write_text(json.dumps(old))
    before = {tuple(r["config"]) for r in _records(tmp_path)}
    with caplog.at_level(logging.WARNING, logger="adaptune"):
        res = tune_tir(DENSE.mod(), target, strategy="random", trials=4, work_dir=tmp_path, resume=True, seed=4)
    assert "older encoding" in caplog.text
    assert res.new_trials == 0 and res.trials == 4
    assert {tuple(r["config"]) for r in _records(tmp_path)} == before
    assert (tmp_path / "adaptune_records.v1.jsonl").exists()
    assert json.loads((tmp_path / "adaptune.json").read_text())["knob_encoding"] == meta["knob_encoding"]


class _Injecting(Measurer):
    """Swaps two candidates of the first batch for a segfaulting and a hanging kernel."""

    def measure(self, mods, on_result=None):
        mods = list(mods)
        if not getattr(self, "_done", False):
            mods[1], mods[2], self._done = faulty.Segfault, faulty.Hang, True
        return super().measure(mods, on_result)


@pytest.mark.slow
def test_crashing_and_hanging_candidates_do_not_stop_the_run(tmp_path, target):
    res = tune_tir(DENSE.mod(), target, strategy="sa", trials=8, batch_size=4, work_dir=tmp_path, seed=3,
                   measurer=_Injecting(target, timeout=5))
    assert res.trials == 8 and res.failures == {"crash": 1, "timeout": 1}
    assert res.best_latency > 0
    errors = [r["error"] for r in _records(tmp_path)]
    assert errors.count("crash") == 1 and errors.count("timeout") == 1 and errors.count("ok") == 6


def test_an_incumbent_keeps_its_crown_against_a_challenger_lucky_only_alone():
    """The machine is 3x slower for the first rounds: the pairs still give each challenger its true
    ratio; one 1.2x slower is recorded above the incumbent and not crowned, one 0.8x is crowned."""
    from adaptune.measure.paired import Incumbent

    clock = []

    def kernel(seconds):
        def sample():
            clock.append(seconds)
            return seconds * (3.0 if len(clock) <= 6 else 1.0)
        return sample

    best = Incumbent(rounds=7)
    best.crown(kernel(1.0), 0.010)
    assert best.challenge(kernel(1.2)) == (pytest.approx(0.012), pytest.approx(1.2), 0.010)
    assert best.latency == 0.010
    assert best.challenge(kernel(0.8)) == (pytest.approx(0.008), pytest.approx(0.8), 0.010)
    assert best.latency == pytest.approx(0.008) and len(clock) == 28


def test_a_first_record_taken_in_a_slow_phase_does_not_set_the_scale_of_the_next_best():
    """The incumbent was recorded at 2 ms, one measurement in a slow phase; beside challengers it
    samples 1 ms.  A 1.2x slower challenger is estimated above the record (2.4 ms, not crowned); a
    0.8x one is crowned at 0.8 ms, the ratio times the incumbent's samples, not 1.6 ms."""
    from adaptune.measure.paired import Incumbent

    best = Incumbent(rounds=5)
    best.crown(lambda: 1e-3, 2e-3)
    assert best.challenge(lambda: 1.2e-3) == (pytest.approx(2.4e-3), pytest.approx(1.2), 2e-3)
    assert best.latency == 2e-3
    assert best.challenge(lambda: 0.8e-3) == (pytest.approx(0.8e-3), pytest.approx(0.8), pytest.approx(1e-3))
    assert best.latency == pytest.approx(0.8e-3) and best.samples == [0.8e-3] * 5


class _Faked(Measurer):
    """The k-th kernel that runs is recorded at ``seconds(k)`` alone, as a noisy single measurement
    could have it."""

    def __init__(self, target, seconds):
        super().__init__(target)
        self.seconds, self.k = seconds, 0

    def measure(self, mods, on_result=None):
        def faked(i, res):
            if res.ok:
                res.run_secs = [self.seconds(self.k)]
                self.k += 1
            on_result(i, res)
        return super().measure(mods, faked)


def _lucky(k):
    """The first kernel at 1 s, every later one at 0 s: each is a would-be new best."""
    return 1.0 if k == 0 else 0.0


def _falling(k):
    """Every kernel at half the last one's time, from below any real kernel's: each is a would-be new best."""
    return 1e-8 / 2 ** (k + 1)


@pytest.mark.slow
def test_a_would_be_best_is_recorded_at_its_time_paired_with_the_incumbent(tmp_path, target, monkeypatch, caplog):
    """Every would-be best after the first is re-timed beside the incumbent (also after a resume,
    where the incumbent is built again) and recorded at the incumbent's latency times their
    paired ratio, not at its lucky single measurement; the first record's 1 s, far above what the
    kernels sample, does not scale the records after the first crowned one.  A resumed best that
    cannot be built again is tried once; the next best is then kept as measured and becomes the
    incumbent."""
    from adaptune.tuner import TaskTuner

    measurer = _Faked(target, _lucky)
    try:
        tune_tir(DENSE.mod(), target, strategy="random", trials=5, batch_size=5, work_dir=tmp_path, seed=4,
                 measurer=measurer)
        res = tune_tir(DENSE.mod(), target, strategy="random", trials=8, batch_size=3, work_dir=tmp_path, seed=4,
                       measurer=measurer, resume=True)
    finally:
        measurer.close()
    recs = [r for r in _records(tmp_path) if r["error"] == "ok"]
    assert len(recs) >= 6 and recs[0]["message"] == "" and recs[0]["run_secs"] == [1.0]
    best = 1.0
    for r in recs[1:]:
        ratio, scale = (float(x) for x in re.fullmatch(
            r"paired with the best so far: ([\d.e+-]+)x its ([\d.e+-]+) ms \(measured alone: 0 ms\)", r["message"]).groups())
        assert r["run_secs"][0] == pytest.approx(scale / 1e3 * ratio, rel=1e-3) and r["run_secs"][0] > 0
        assert scale / 1e3 == pytest.approx(best, rel=1e-3) if ratio >= 1 else scale / 1e3 <= best * (1 + 1e-3)
        best = min(best, r["run_secs"][0])
    assert res.best_latency == pytest.approx(best, rel=1e-3) and best < 0.01

    loads = []

    def unbuildable(self):
        loads.append(1)
        raise RuntimeError("the resumed best does not build again")
    monkeypatch.setattr(TaskTuner, "_load_incumbent", unbuildable)
    measurer = _Faked(target, _falling)
    try:
        with caplog.at_level(logging.WARNING):
            tune_tir(DENSE.mod(), target, strategy="random", trials=11, batch_size=3, work_dir=tmp_path, seed=4,
                     measurer=measurer, resume=True)
    finally:
        measurer.close()
    after = [r for r in _records(tmp_path) if r["error"] == "ok"][-3:]
    assert loads == [1] and "the resumed best could not be timed again" in caplog.text
    assert after[0]["run_secs"] == [5e-9] and after[0]["message"] == ""
    assert all(r["message"].startswith("paired with the best so far") for r in after[1:])


def _halving(k):
    """Each kernel alone at half the last one's time, from 1 s: each is a would-be new best."""
    return 2.0 ** -k


@pytest.mark.slow
def test_a_paired_estimate_beyond_the_fma_peak_is_not_recorded(tmp_path, target, monkeypatch):
    """ResNet-50's 3x3 stride-2 layer (session 91): a challenger measured alone 4% faster than the
    incumbent's record took 0.65x of its time in the pairs, a phase later, and was recorded at
    327 GFLOP/s on a 227 GFLOP/s machine.  An estimate the CPU's FMA peak rules out keeps the
    challenger's measurement alone; the challenger is still crowned, at that measurement."""
    import adaptune.tuner as tuner

    floors = []
    monkeypatch.setattr(tuner, "fastest_possible", lambda mod, t: floors.append(1) or 10.0)   # every estimate below it
    measurer = _Faked(target, _halving)
    try:
        res = tune_tir(DENSE.mod(), target, strategy="random", trials=6, batch_size=3, work_dir=tmp_path, seed=4,
                       measurer=measurer)
    finally:
        measurer.close()
    recs = [r for r in _records(tmp_path) if r["error"] == "ok"]
    assert len(recs) == 6 and recs[0]["message"] == "" and floors == [1]   # the floor is found once
    kept = 0
    for k, r in enumerate(recs[1:], 1):
        if r["message"].endswith("faster than this CPU's FMA peak allows: kept as measured alone"):
            assert r["run_secs"] == [2.0 ** -k]
            kept += 1
        else:       # slower than the incumbent in the pairs: estimated above its record, not crowned
            assert float(re.match(r"paired with the best so far: ([\d.e+-]+)x", r["message"]).group(1)) >= 1
    assert kept >= 1 and res.best_latency == min(r["run_secs"][0] for r in recs)


def test_the_fastest_possible_time_is_below_a_real_kernel_and_above_zero(target):
    """The floor is what the arithmetic takes at the FMA peak: positive, and below the time of the
    untuned dense kernel (so it only ever rejects estimates no kernel can reach)."""
    from adaptune.measure.run import Measurer
    from adaptune.scheduler import untuned_schedule
    from adaptune.tuner import fastest_possible

    floor = fastest_possible(DENSE.mod(), target)
    measurer = Measurer(target)
    try:
        untuned = measurer.measure([untuned_schedule(DENSE.mod(), target).mod])[0].latency
    finally:
        measurer.close()
    assert 0 < floor < untuned
    assert fastest_possible(DENSE.mod(), tvm.target.Target({"kind": "cuda"})) == 0.0


@pytest.mark.slow
def test_kill_9_then_resume_loses_nothing(tmp_path):
    wd = tmp_path / "wd"
    cmd = [sys.executable, "-m", "adaptune.cli", "tune-op", "tiny-dense", "--trials", "40", "--batch-size", "4",
           "--work-dir", str(wd)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline:
        if (wd / RECORDS).exists() and len(_records(wd)) >= 6:
            break
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed = _records(wd)
    assert 6 <= len(killed) < 40
    out = subprocess.run(cmd[:-2] + ["--work-dir", str(wd), "--resume", "--trials", str(len(killed) + 4)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    after = _records(wd)
    assert after[:len(killed)] == killed
    assert len(after) == len(killed) + 4 and len({tuple(r["config"]) for r in after}) == len(after)
    db = ms.database.JSONDatabase(work_dir=str(wd))
    assert len(db) == sum(r["error"] == "ok" for r in after)


def _ms_tune(work_dir, target, trials: int, seed: int):
    """MetaSchedule's own loop with adaptune's ``sa`` as its search strategy, on DENSE."""
    import adaptune
    from adaptune.measure.build import fast_build

    return ms.tune_tir(DENSE.mod(), target, work_dir=str(work_dir), max_trials_global=trials, num_trials_per_iter=4,
                       strategy=adaptune.MetaScheduleStrategy("sa", seed=seed),
                       builder=ms.builder.LocalBuilder(f_build=fast_build, max_workers=2), cost_model="random")


def test_metaschedule_runs_an_adaptune_strategy(tmp_path, target):
    db = _ms_tune(tmp_path, target, 8, seed=1)
    assert len(db) == 8
    sch = ms.tir_integration.compile_tir(db, DENSE.mod(), target)
    assert sch is not None and check_numerics(DENSE, sch, target)[0]


@pytest.mark.slow
def test_metaschedule_strategy_resumes_from_its_database(tmp_path, target):
    """A database that knows the workload but holds no record, then one that holds the first run's
    records: both start (the records' kernels are registered, none is measured again)."""
    ms.database.JSONDatabase(work_dir=str(tmp_path)).commit_workload(DENSE.mod())
    for seed in (1, 2):
        db = _ms_tune(tmp_path, target, 4, seed=seed)
    recs = db.get_all_tuning_records()
    assert len(recs) == 8 and len({str(r.trace) for r in recs}) == 8
