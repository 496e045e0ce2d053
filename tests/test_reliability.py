"""Reliability: measurement through TVM's RPC tracker, injected faults (wrong results, build
failures, a device that disappears, a full disk, nothing measurable), and determinism."""
from __future__ import annotations

import json

import numpy as np
import pytest
import tvm_ffi

from adaptune.testing import faults
from adaptune import tune_tir
from adaptune.cli import main
from adaptune.measure.records import RECORDS
from adaptune.measure.run import Measurer, MeasureResult, RPCError
from adaptune.model.workloads import get_workload
from adaptune._tvm import ms

DENSE = get_workload("tiny-dense")


def _records(wd):
    return [json.loads(ln) for ln in (wd / RECORDS).read_text().splitlines() if ln.strip()]


@pytest.fixture
def rpc_farm():
    with faults.local_rpc_farm("adaptune-test") as farm:
        yield farm


@pytest.mark.slow
def test_tuning_through_an_rpc_tracker_and_losing_the_device(rpc_farm, tmp_path, target):
    device, procs = rpc_farm
    res = tune_tir(DENSE.mod(), target, strategy="random", trials=4, batch_size=4, work_dir=tmp_path, seed=1,
                   measurer=Measurer(target, timeout=20, rpc=device))
    assert res.trials == 4 and res.failures == {} and res.best_latency > 0
    # the server dies mid-run: the run stops with RPCError, everything measured stays on disk
    faults.kill_group(procs[1])
    with pytest.raises(RPCError, match="no RPC server"):
        tune_tir(DENSE.mod(), target, strategy="random", trials=8, batch_size=4, work_dir=tmp_path, seed=1,
                 resume=True, measurer=Measurer(target, timeout=20, rpc=device))
    recs = _records(tmp_path)
    assert [r["error"] for r in recs[:4]] == ["ok"] * 4 and len(recs) <= 5


def test_cli_refuses_an_rpc_key_without_servers(rpc_farm, tmp_path, capsys):
    device, _ = rpc_farm
    code = main(["tune-op", "tiny-dense", "--work-dir", str(tmp_path / "wd"), "--rpc",
                 f"127.0.0.1:{device.port}", "--device-key", "no-such-key"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "no RPC server with key 'no-such-key'" in err[0]
    assert not (tmp_path / "wd").exists()


@pytest.mark.parametrize("linked", [True, False], ids=["shared-library", "tar"])
def test_the_check_runs_the_measured_binary(target, linked):
    """The checker loads the file the runner timed (a linked library for local runs, a tar for
    RPC ones); a wrong binary fails even beside a right module."""
    from adaptune.measure.build import build_export
    from adaptune.measure.verify import KernelChecker
    checker = KernelChecker(DENSE.mod(), target)
    right, wrong = (build_export(m, target, linked) for m in (DENSE.mod(), faults.wrong_kernel(DENSE.mod())))
    assert right.endswith(".so" if linked else ".tar")
    assert checker.check(DENSE.mod(), right) == (True, "")
    assert checker.check(DENSE.mod(), wrong)[0] is False
    assert checker.check(faults.wrong_kernel(DENSE.mod()))[0] is False      # no file: compiled here


def test_a_private_prim_func_is_checked_not_taken_for_wrong(target):
    """A PrimFunc without a ``global_symbol`` (``te.create_prim_func(...).without_attr(...)``, as
    Winograd's GEMM is built) tunes like any other: before, its reference and every check failed to
    compile and all 48 trials of a GEMM were recorded as wrong results."""
    import tvm
    from adaptune.measure.verify import KernelChecker
    from adaptune.model.winograd import gemm
    mod = tvm.IRModule({"main": gemm(4, 16, 32)})
    assert mod["main"].attrs.get("global_symbol") is None
    assert KernelChecker(mod, target).check(mod) == (True, "")
    assert KernelChecker(mod, target).check(faults.wrong_kernel(mod))[0] is False
    res = tune_tir(mod, target, trials=4, seed=0)
    assert res.best_latency is not None and not res.failures, res.failures


def test_non_finite_outputs_must_match_exactly():
    """A NaN where the reference is finite (or the other way round) is a wrong kernel; the same
    infinities (an attention mask times float32's minimum overflows on random inputs) are not."""
    from adaptune.measure.verify import TOLERANCE, relative_error

    def differs(got):
        return relative_error(np.array(got, dtype="float32"), want) > TOLERANCE
    want = np.array([1.0, -np.inf, np.nan, 2.0], dtype="float32")
    assert not differs(want.copy())
    assert differs([1.0, -np.inf, np.nan, np.nan])
    assert differs([1.0, np.inf, np.nan, 2.0])
    assert differs([1.0, -np.inf, 0.0, 2.0])
    assert differs([1.5, -np.inf, np.nan, 2.0])
    assert not differs([1.0001, -np.inf, np.nan, 2.0])


def test_a_fast_wrong_kernel_is_rejected_and_never_reaches_the_database(tmp_path, target):
    with faults.wrong_first_candidate(DENSE.mod()) as injected:
        res = tune_tir(DENSE.mod(), target, strategy="sa", trials=6, batch_size=3, work_dir=tmp_path, seed=2)
    recs = {tuple(r["config"]): r for r in _records(tmp_path)}
    assert recs[injected[0]]["error"] == "wrong" and res.failures == {"wrong": 1}
    db = ms.database.JSONDatabase(work_dir=str(tmp_path))
    assert len(db) == 5                                    # the wrong kernel is not a tuning record
    # JSONDatabase ranks by mean run time, adaptune by median: close kernels can swap, so compare
    # adaptune's best with the fastest median among the database's records
    recs = db.get_top_k(db.commit_workload(DENSE.mod()), len(db))
    assert min(np.median([float(x) for x in r.run_secs]) for r in recs) == pytest.approx(res.best_latency)


def test_build_failures_are_records_and_the_run_goes_on(tmp_path, target):
    m = faults.InjectingMeasurer(target, {0: faults.BuildFails}, timeout=10)
    res = tune_tir(DENSE.mod(), target, strategy="random", trials=4, batch_size=4, work_dir=tmp_path, seed=3,
                   measurer=m)
    assert res.trials == 4 and res.failures == {"build": 1} and res.best_latency > 0


def test_full_disk_stops_the_run_with_one_line_and_keeps_records(tmp_path, capsys):
    wd = tmp_path / "wd"
    with faults.disk_full_after(3):
        code = main(["tune-op", "tiny-dense", "--trials", "8", "--batch-size", "4", "--strategy", "random",
                     "--work-dir", str(wd)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and "No space left on device" in err[-1] and "--resume" in err[-1]
    assert len(_records(wd)) == 3
    assert main(["tune-op", "tiny-dense", "--trials", "5", "--strategy", "random", "--work-dir", str(wd),
                 "--resume"]) == 0
    recs = _records(wd)
    assert len(recs) == 5 and len({tuple(r["config"]) for r in recs}) == 5


def test_a_run_that_measures_nothing_exits_non_zero_and_says_why(tmp_path, monkeypatch, capsys, target):
    import adaptune.cli.ops as cli_ops
    everything_crashes = faults.InjectingMeasurer(target, {i: faults.Segfault for i in range(4)}, batches=10,
                                                  timeout=10)
    monkeypatch.setattr(cli_ops, "make_measurer", lambda args, t: everything_crashes)
    code = main(["tune-op", "tiny-dense", "--trials", "4", "--batch-size", "4", "--work-dir", str(tmp_path / "wd")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and "no candidate could be measured (crash 4)" in err[-1]


class _FakeMeasurer:
    """Deterministic 'measurements' without hardware: latency is a function of the kernel's IR."""

    def measure(self, mods, on_result=None):
        out = []
        for i, mod in enumerate(mods):
            h = int(tvm_ffi.structural_hash(mod)) % 1000
            out.append(MeasureResult("ok", [1e-4 * (1 + h / 100)]))
            if on_result is not None:
                on_result(i, out[-1])
        return out


@pytest.mark.parametrize("strategy", ["random", "sa", "chameleon"])
def test_same_seed_and_measurements_give_the_same_candidates(strategy, tmp_path, target):
    runs = []
    for rep in range(2):
        tune_tir(DENSE.mod(), target, strategy=strategy, trials=12, batch_size=4, work_dir=tmp_path / str(rep),
                 seed=7, measurer=_FakeMeasurer(), strategy_options={"episodes": 16, "max_steps": 20}
                 if strategy == "chameleon" else None)
        runs.append([r["config"] for r in _records(tmp_path / str(rep))])
    assert runs[0] == runs[1] and len(runs[0]) == 12


def _hold_lock(wd):
    """Take the work dir's lock as another process would (a separate open file), for the test."""
    import fcntl

    from adaptune.measure.workdir import LOCK
    wd.mkdir(parents=True, exist_ok=True)
    f = open(wd / LOCK, "a")
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return f


@pytest.mark.parametrize("argv", [["tune-op", "tiny-dense", "--trials", "2"], ["tune", "demo-cnn", "--trials", "2"]])
def test_a_second_run_on_a_busy_work_dir_is_refused_with_one_line(tmp_path, capsys, argv):
    wd = tmp_path / "wd"
    held = _hold_lock(wd)
    try:
        code = main([*argv, "--work-dir", str(wd)])
    finally:
        held.close()
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "in use by another adaptune run" in err[0]
    assert sorted(p.name for p in wd.iterdir()) == [".adaptune.lock"]        # nothing written


def test_the_work_dir_lock_is_released_when_a_run_ends(tmp_path):
    wd = tmp_path / "wd"
    assert main(["tune-op", "tiny-dense", "--trials", "2", "--strategy", "random", "--work-dir", str(wd)]) == 0
    _hold_lock(wd).close()                     # free again; the same after a refused start
    assert main(["tune-op", "tiny-dense", "--trials", "2", "--work-dir", str(wd)]) == 2
    _hold_lock(wd).close()


def test_model_json_updates_take_the_lock_and_torn_log_lines_are_dropped(tmp_path):
    from adaptune.measure.workdir import WorkDir, WorkDirBusy, read_jsonl, repair_jsonl
    wd = WorkDir(tmp_path / "wd")
    wd.write_model({"model": "m", "tasks": []})
    held = _hold_lock(tmp_path / "wd")
    try:
        with pytest.raises(WorkDirBusy):            # `bench` saving its choice while a run writes the dir
            wd.update_model(library=[])
    finally:
        held.close()
    assert "library" not in wd.model()
    wd.update_model(library=[1])
    assert wd.model() == {"model": "m", "tasks": [], "library": [1]}
    log = tmp_path / "r.jsonl"
    log.write_bytes(b'{"a": 1}\n\n{"b": 2}\n{"c": ')
    assert read_jsonl(log) == [{"a": 1}, {"b": 2}]
    assert repair_jsonl(log) == 1 and log.read_bytes() == b'{"a": 1}\n{"b": 2}\n'
    assert repair_jsonl(log) == 0 and read_jsonl(tmp_path / "missing.jsonl") == []
