"""bench/pooled.py: the three measures of one run, read back from the work dirs paper.py leaves."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import BENCH, bench_module

pair = bench_module("pooled").pair


def _run(root: Path, layer: str, ours, theirs):
    """Write a finished paper.py run: our records (None = a failed candidate) and MetaSchedule's."""
    wd = root / f"{layer}-rl+as"
    wd.mkdir(parents=True)
    with open(wd / "adaptune_records.jsonl", "w") as f:
        for i, lat in enumerate(ours):
            f.write(json.dumps({"config": [i], "error": "ok" if lat else "run_error",
                                "run_secs": [lat] if lat else [], "message": "", "time": 100.0 + i}) + "\n")
    wd = root / f"{layer}-ms-evolutionary"
    wd.mkdir(parents=True)
    (wd / "database_tuning_record.json").write_text(
        "".join(json.dumps([0, [None, [str(lat)], None, None]]) + "\n" for lat in theirs))


def test_pair_reads_latency_reach_and_half_budget(tmp_path):
    _run(tmp_path, "L1", [None, 3.0, 1.5, 1.0], [4.0, 2.0, 2.0, 2.0])
    lat, reach, reached, half = pair(tmp_path, "L1", "rl+as", 4)
    assert (lat, reach, reached, half) == (0.5, 2 / 3, True, 1.5)     # ms-evo's best at 2, ours at 3
    _run(tmp_path, "L2", [5.0, 3.0, 2.0, 2.0], [4.0, 4.0, 4.0, 1.9])
    lat, reach, reached, half = pair(tmp_path, "L2", "rl+as", 4)
    assert not reached and reach == 1.0 and half == pytest.approx(3.0 / 1.9)   # bound: ms-evo's 4 / budget 4
    assert pair(tmp_path, "L2", "rl+as", 8) is None                             # an unfinished run is left out
    assert pair(tmp_path, "L3", "rl+as", 4) is None


def test_pooled_command_geomeans_layers_and_rejects_empty_folders(tmp_path):
    _run(tmp_path / "a", "L1", [2.0, 1.0], [2.0, 2.0])
    _run(tmp_path / "b", "L1", [2.0, 2.0], [4.0, 1.0])
    out = subprocess.run([sys.executable, str(BENCH / "pooled.py"), str(tmp_path / "a"), str(tmp_path / "b"),
                          "--trials", "2"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    # run a: latency 0.5, reach 1/1, half 2/2; run b: latency 2.0, reach 2/2 (not reached), half 2/1
    assert "L1: n=2  latency 1.00  reach 1.00  half 1.41" in out.stdout
    bad = subprocess.run([sys.executable, str(BENCH / "pooled.py"), str(tmp_path / "none")],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and bad.stderr.strip().startswith("error:") and not bad.stdout


def test_cross_pairs_each_run_with_every_ms_evo_run(tmp_path):
    _run(tmp_path / "a", "L1", [2.0, 1.0], [2.0, 2.0])
    _run(tmp_path / "b", "L1", [3.0, 3.0], [4.0, 1.0])
    cmd = [sys.executable, str(BENCH / "pooled.py"), str(tmp_path / "a"), str(tmp_path / "b"), "--trials", "2"]
    own, cross = (subprocess.run(cmd + extra, capture_output=True, text=True) for extra in ([], ["--cross"]))
    assert own.returncode == 0 and cross.returncode == 0, own.stderr + cross.stderr
    # beside its own: a reaches at once (1/1), b never (bound 2/2); crossed, b against a's ms-evo
    # (best 2.0 after 1) never gets there either: 1/2, so b's reach is sqrt(1/2 * 1)
    assert "reach 1.00" in own.stdout and "b: 3.00/1.00*/3.00" in own.stdout
    assert "L1: n=2  latency 1.22  reach 0.84  half 1.73" in cross.stdout
    assert "b: 2.12/0.71*/2.12" in cross.stdout
