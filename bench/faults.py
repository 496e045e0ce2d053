"""Fault-injection suite: each fault a long tuning run meets, injected into real runs on the
tiny-dense workload, and what came of it.

    python bench/faults.py            # ~10 min on 2 cores
    python bench/faults.py sigkill    # only the scenarios whose name contains a word given

For every fault: how many were injected, whether the run survived (finished, or stopped with one
clear line and a resumable work dir), and how many measured records were lost (must be 0):
a record is lost if it was on disk before the fault and is missing or changed after it, or if a
config was measured twice after resuming.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from adaptune.testing import faults
from adaptune import tune_tir
from adaptune.measure.workdir import WorkDir
from adaptune.measure.run import Measurer, RPCError
from adaptune.measure.target import host_target
from adaptune.model.workloads import get_workload

DENSE = get_workload("tiny-dense")
TARGET = host_target()


def records(wd: Path) -> list[dict]:
    return WorkDir(wd).records()


def lost(before: list[dict], after: list[dict]) -> int:
    """Records of ``before`` not kept verbatim in ``after``, plus configs measured twice."""
    keep = {json.dumps(r, sort_keys=True) for r in after}
    configs = [tuple(r["config"]) for r in after]
    return sum(json.dumps(r, sort_keys=True) not in keep for r in before) + len(configs) - len(set(configs))


def tune(wd, trials, measurer=None, resume=False, strategy="random", batch=4):
    return tune_tir(DENSE.mod(), TARGET, strategy=strategy, trials=trials, batch_size=batch, work_dir=wd,
                    resume=resume, seed=1, measurer=measurer or Measurer(TARGET, timeout=10))


def kernel_faults(name, bad, per_batch, batches, wd):
    m = faults.InjectingMeasurer(TARGET, {i: bad for i in range(per_batch)}, batches=batches, timeout=5)
    res = tune(wd, 12, m)
    kind = {"segfault": "crash", "hang": "timeout", "build failure": "build"}[name]
    return per_batch * batches, res.trials == 12 and res.failures.get(kind) == per_batch * batches, \
        lost([], records(wd)), f"{res.failures}"


def wrong_results(wd):
    with faults.wrong_first_candidate(DENSE.mod()):
        res = tune(wd, 8, strategy="sa")
    return 1, res.failures == {"wrong": 1}, lost([], records(wd)), "rejected before reaching the database"


def sigkill(wd, kills=3):
    cmd = [sys.executable, "-m", "adaptune.cli", "tune-op", "tiny-dense", "--trials", "40", "--batch-size", "4",
           "--strategy", "random", "--work-dir", str(wd)]
    rng = random.Random(0)
    total_lost, survived = 0, True
    for k in range(kills):
        records_before = records(wd)
        proc = subprocess.Popen(cmd + (["--resume"] if k else []), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        deadline = time.time() + 120       # start-up takes 5-10 s: kill while it measures
        while len(records(wd)) <= len(records_before) and proc.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        time.sleep(rng.uniform(0, 4))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        before = records(wd)
        out = subprocess.run(cmd + ["--resume", "--trials", str(len(before) + 2)], capture_output=True, text=True)
        survived &= out.returncode == 0
        total_lost += lost(before, records(wd))
    return kills, survived, total_lost, f"{len(records(wd))} records after {kills} kills"


def corrupt_line(wd):
    tune(wd, 4)
    before = records(wd)
    with open(WorkDir(wd).records_path(), "a") as f:
        f.write('{"config": [3, 1')                           # torn write
    with open(wd / "database_tuning_record.json", "a") as f:
        f.write("garbage\n")
    res = tune(wd, 8, resume=True)
    return 2, res.trials == 8, lost(before, records(wd)), "torn lines dropped with a warning"


def disk_full(wd):
    with faults.disk_full_after(5):
        try:
            tune(wd, 12)
            stopped = False
        except OSError:
            stopped = True
    before = records(wd)
    res = tune(wd, 12, resume=True)
    return 1, stopped and len(before) == 5 and res.trials == 12, lost(before, records(wd)), \
        "stopped with ENOSPC, resumed to 12"


def rpc_server_killed(wd):
    with faults.local_rpc_farm("adaptune-faults") as (device, procs):
        m = Measurer(TARGET, timeout=10, rpc=device)
        tune(wd, 4, m)
        before = records(wd)
        faults.kill_group(procs[1])
        try:
            tune(wd, 8, Measurer(TARGET, timeout=10, rpc=device), resume=True)
            stopped = False
        except RPCError:
            stopped = True
    res = tune(wd, 8, resume=True)           # the device is back (here: measure locally)
    return 1, stopped and res.trials == 8, lost(before, records(wd)), "RPCError, then resumed locally"


def nothing_measurable(wd):
    m = faults.InjectingMeasurer(TARGET, {i: faults.Segfault for i in range(4)}, batches=100, timeout=5)
    res = tune(wd, 8, m)
    return 8, res.best_latency is None and res.failures == {"crash": 8}, lost([], records(wd)), \
        "CLI exits 1: no candidate could be measured (crash 8)"


def main() -> int:
    scenarios = [
        ("segfault", lambda wd: kernel_faults("segfault", faults.Segfault, 2, 2, wd)),
        ("hang", lambda wd: kernel_faults("hang", faults.Hang, 1, 2, wd)),
        ("build failure", lambda wd: kernel_faults("build failure", faults.BuildFails, 2, 2, wd)),
        ("wrong result", wrong_results),
        ("SIGKILL + resume", sigkill),
        ("corrupt / torn db line", corrupt_line),
        ("disk full (ENOSPC)", disk_full),
        ("RPC server killed", rpc_server_killed),
        ("nothing measurable", nothing_measurable),
    ]
    only = sys.argv[1:]        # e.g. `python bench/faults.py SIGKILL`: scenarios whose name contains one
    scenarios = [sc for sc in scenarios if not only or any(o.lower() in sc[0].lower() for o in only)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, fn in scenarios:
            t = time.perf_counter()
            injected, survived, n_lost, note = fn(Path(tmp) / name.replace(" ", "_").replace("/", "_"))
            rows.append((name, injected, survived, n_lost, note, time.perf_counter() - t))
            print(f"  {name}: done in {rows[-1][5]:.0f} s", flush=True)
    print(f"\n{'fault':24s} {'injected':>8s} {'survived':>9s} {'records lost':>13s}  note")
    for name, injected, survived, n_lost, note, _ in rows:
        print(f"{name:24s} {injected:8d} {'yes' if survived else 'NO':>9s} {n_lost:13d}  {note}")
    return 0 if all(r[2] and r[3] == 0 for r in rows) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    sys.exit(main())
