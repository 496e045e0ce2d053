"""Measurements of several tuning processes sharing one device take turns (ADAPTUNE_DEVICE_LOCK)."""
import dataclasses
import fcntl
import json
import os
import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import BENCH, bench_module, bench_on_path

from adaptune._tvm import ms
from adaptune.measure.run import OK, DeviceLock, LockedRunner, Measurer, RPCDevice
from adaptune.measure.target import parse_target
from adaptune.model.workloads import get_workload

TARGET = parse_target("llvm")


def _mod():
    return get_workload("matmul:16,16,16").mod()


def _lock_is_free(path) -> bool:
    """Whether an exclusive lock on ``path`` can be taken right now (from a fresh descriptor)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


class _FakeBuilder:
    """Skips the build: every module 'builds' to a path nothing reads (the fake runner does not)."""

    def __init__(self, tmp: Path):
        self.tmp = tmp

    def build(self, inputs):
        return [ms.builder.BuilderResult(str(self.tmp / f"build{i}" / "kernel.so"), None) for i in range(len(inputs))]

    def close(self):
        pass


class _SlowRunner:
    """Records when each run starts and ends; each takes 0.2 s."""

    def __init__(self, real, intervals: list, fail: bool = False):
        self.pool = real.pool           # Measurer.close shuts it down
        self.intervals, self.fail = intervals, fail

    def run(self, inputs):
        start = time.monotonic()
        time.sleep(0.2)
        self.intervals.append((start, time.monotonic()))
        if self.fail:
            raise RuntimeError("device fell over")
        return [SimpleNamespace(result=lambda: SimpleNamespace(error_msg=None, run_secs=[1e-3])) for _ in inputs]


def _overlap(intervals) -> bool:
    s = sorted(intervals)
    return any(b[0] < a[1] for a, b in zip(s, s[1:]))


@pytest.mark.parametrize("locked", [True, False])
def test_runs_of_measurers_sharing_a_lock_never_overlap(tmp_path, monkeypatch, locked):
    monkeypatch.delenv("ADAPTUNE_DEVICE_LOCK", raising=False)
    lock = str(tmp_path / "device.lock") if locked else None
    intervals, errors = [], []
    measurers = [Measurer(TARGET, timeout=10, build_workers=1, device_lock=lock) for _ in range(2)]
    assert all((m.device_lock is not None) == locked for m in measurers)
    for m in measurers:
        m.builder, m.runner = _FakeBuilder(tmp_path), _SlowRunner(m.runner, intervals)
    start = threading.Barrier(2)

    def tune(m):
        try:
            start.wait()
            res = m.measure([_mod() for _ in range(3)])
            assert [r.error for r in res] == [OK] * 3
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=tune, args=(m,)) for m in measurers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for m in measurers:
        m.close()
    assert not errors and len(intervals) == 6
    assert _overlap(intervals) == (not locked)


def test_lock_is_released_when_a_run_raises(tmp_path):
    lock = str(tmp_path / "device.lock")
    m = Measurer(TARGET, timeout=10, build_workers=1, device_lock=lock)
    m.builder, m.runner = _FakeBuilder(tmp_path), _SlowRunner(m.runner, [], fail=True)
    res = m.measure([_mod(), _mod()])
    assert [r.ok for r in res] == [False, False] and "device fell over" in res[0].message
    assert _lock_is_free(lock)
    m.close()


def _runner_input():
    return ms.runner.RunnerInput("/nonexistent/kernel.so", "cpu",
                                 ms.arg_info.ArgInfo.from_prim_func(_mod()["main"]))


def test_locked_runner_holds_the_lock_while_the_inner_runner_runs(tmp_path):
    path = str(tmp_path / "device.lock")
    seen = []

    class Inner:
        def run(self, inputs):
            seen.append(_lock_is_free(path))
            return [SimpleNamespace(result=lambda i=i: ms.runner.RunnerResult([1e-3 * (i + 1)], None))
                    for i in range(len(inputs))]

    runner = LockedRunner(Inner(), DeviceLock(path))
    futures = runner.run([_runner_input(), _runner_input()])   # through TVM's Runner interface, as MS calls it
    assert seen == [False]                                     # locked during the inner run
    assert _lock_is_free(path)                                 # and released after it
    assert all(f.done() for f in futures)
    assert [[float(s) for s in f.result().run_secs] for f in futures] == [[1e-3], [2e-3]]
    assert all(f.result().error_msg is None for f in futures)

    class Failing:
        def run(self, inputs):
            raise RuntimeError("boom")

    with pytest.raises(Exception, match="boom"):
        LockedRunner(Failing(), DeviceLock(path)).run([_runner_input()])
    assert _lock_is_free(path)


def test_real_kernels_run_under_the_lock_from_the_environment(tmp_path, monkeypatch):
    path = str(tmp_path / "device.lock")
    monkeypatch.setenv("ADAPTUNE_DEVICE_LOCK", path)
    m = Measurer(TARGET, timeout=20, build_workers=1)
    try:
        assert m.device_lock is not None and m.device_lock.path == path
        assert m.measure([_mod()])[0].ok
        # MetaSchedule's runner: the real LocalRunner, behind the lock
        runner = m.ms_runner
        assert runner is not m.runner
        built = m.builder.build([ms.builder.BuilderInput(_mod(), TARGET)])[0]
        assert built.error_msg is None
        res = runner.run([ms.runner.RunnerInput(built.artifact_path, "cpu",
                                                ms.arg_info.ArgInfo.from_entry_func(_mod()))])[0].result()
        assert res.error_msg is None and len(res.run_secs) == 3
        assert _lock_is_free(path)
    finally:
        m.close()
    monkeypatch.delenv("ADAPTUNE_DEVICE_LOCK")
    plain = Measurer(TARGET, build_workers=1)
    assert plain.device_lock is None and plain.ms_runner is plain.runner
    plain.close()


def test_rpc_runs_take_no_lock(tmp_path):
    m = Measurer(TARGET, rpc=RPCDevice("127.0.0.1", 9, "k"), device_lock=str(tmp_path / "device.lock"))
    assert m.device_lock is None and m.ms_runner is m.runner


def test_paper_bench_has_jobs_and_its_runs_pickle():
    out = subprocess.run([sys.executable, str(BENCH / "paper.py"), "--help"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "--jobs" in out.stdout
    with bench_on_path():                  # as paper.py's job processes import it
        from common import Run
        run = Run("rl+as", "L2", [(1, 0.5, 1e-3)], 1e-3, 2.0, 0.5, 1, True, [3], 0.1)
        assert pickle.loads(pickle.dumps(run)) == run


def test_paper_bench_resumes_a_finished_run_and_saves_each_as_it_ends(tmp_path, capsys):
    """A stopped paper.py keeps its finished runs (OUT/runs) and --resume reuses exactly those."""
    paper = bench_module("paper")
    Run = paper.Run
    run = Run("rl+as", "L2", [[1, 0.5, 1e-3]], 1e-3, 2.0, 0.5, 1, True, [3], 0.1)
    key = {"target": "T", "trials": 8, "batch": 4, "seed": 0}
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "L2-rl+as-seed0.json").write_text(json.dumps({"key": key, **dataclasses.asdict(run)}))
    assert paper.run_one(("L2", "rl+as"), "T", 8, 4, tmp_path, 0, resume=True) == run
    with pytest.raises(Exception):          # another budget: not reused, so it tunes (and "T" is no target)
        paper.run_one(("L2", "rl+as"), "T", 16, 4, tmp_path, 0, resume=True)
    (tmp_path / "runs" / "L2-rl+as-seed0.json").write_text('{"key": {"target": "T"')   # cut short
    capsys.readouterr()
    with pytest.raises(Exception) as e:     # unreadable: one line says so, then it tunes (no target "T")
        paper.run_one(("L2", "rl+as"), "T", 8, 4, tmp_path, 0, resume=True)
    assert not isinstance(e.value, json.JSONDecodeError)
    assert "cannot reuse" in capsys.readouterr().out
