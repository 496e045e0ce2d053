"""Records and resume: a MetaSchedule JSONDatabase plus adaptune's knob vectors, in one work dir.

Every measured candidate is written the moment its result is known: successes go to TVM's
``database_tuning_record.json`` (so ``ms.database.JSONDatabase`` and TVM's compile-with-database
helpers use the work dir as-is), and every outcome, failures included, to
``adaptune_records.jsonl`` with its knob vector, flushed and fsync'ed.  Reopening the work dir
resumes: both files are read back (a truncated or corrupt line, e.g. from kill -9 mid-write, is
dropped with a warning), successes that reached TVM's file but not ours are recovered by encoding
their traces, and nothing already measured is measured again.
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import numpy as np

import tvm_ffi

from .._tvm import ms
from .run import MeasureResult

log = logging.getLogger("adaptune")

RECORDS = "adaptune_records.jsonl"
META = "adaptune.json"
KNOB_ENCODING = 2      # 2: compute-location knobs hold TVM's raw decision (1: an index into the valid ones)
TVM_FILES = ("database_workload.json", "database_tuning_record.json")


class WorkDirError(ValueError):
    """A work dir that cannot be used as asked (records present without resume, other workload)."""


def repair_jsonl(path: Path) -> int:
    """Drop lines that are not valid JSON (a torn last write); returns how many were dropped."""
    if not path.exists():
        return 0
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    good, bad = [], 0
    for ln in lines:
        if not ln.strip():
            continue
        try:
            json.loads(ln)
            good.append(ln)
        except ValueError:
            bad += 1
    if bad:
        log.warning("%s: dropped %d unreadable line(s) (interrupted write?)", path, bad)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_bytes(b"".join(g + b"\n" for g in good))
        os.replace(tmp, path)
    return bad


def check_work_dir(work_dir, resume: bool) -> None:
    """Refuse early (before any tuning work) a work dir that has records unless resuming."""
    d = Path(work_dir)
    has = (d / META).exists() or (d / RECORDS).exists()
    if has and not resume:
        raise WorkDirError(f"work dir {d} already has tuning records; pass --resume to continue it "
                           "or choose another --work-dir")
    if resume and not d.exists():
        raise WorkDirError(f"--resume: work dir {d} does not exist")


class RecordStore:
    """One workload's measured records in ``work_dir`` (one target per work dir)."""

    def __init__(self, work_dir, space, *, resume: bool = False, label: str = "", db=None, name: str | None = None):
        """``db`` and ``name`` let several tasks of a model share one TVM database in ``work_dir``:
        task ``name`` keeps its knob vectors in ``tasks/<name>.jsonl``."""
        self.dir = Path(work_dir)
        self.space = space
        sub = self.dir / "tasks" if name else self.dir
        self.records_path = sub / (f"{name}.jsonl" if name else RECORDS)
        meta_path = sub / (f"{name}.json" if name else META)
        meta = {"workload": label or "main", "target": str(space.target),
                "workload_hash": str(tvm_ffi.structural_hash(space.mod)), "knob_sizes": space.sizes.tolist(),
                "knob_encoding": KNOB_ENCODING}
        if name is None:
            check_work_dir(self.dir, resume and self.dir.exists())  # API: resuming a new dir starts it
        if meta_path.exists() or self.records_path.exists():
            old = json.loads(meta_path.read_text()) if meta_path.exists() else meta
            if old.get("knob_encoding", 1) != KNOB_ENCODING and self.records_path.exists():
                self._set_aside_old_encoding(old)
                old["knob_sizes"] = meta["knob_sizes"]
            for key in ("workload_hash", "target", "knob_sizes"):
                if old.get(key) != meta[key]:
                    raise WorkDirError(f"work dir {self.dir} holds another {key.replace('_', ' ')} "
                                       f"({old.get(key)!r}); use a separate work dir")
        sub.mkdir(parents=True, exist_ok=True)
        meta_path.write_text(json.dumps(meta, indent=1))
        for path in [self.records_path] + ([] if db is not None else [self.dir / f for f in TVM_FILES]):
            repair_jsonl(path)
        self.db = db if db is not None else ms.database.JSONDatabase(work_dir=str(self.dir))
        self.workload = self.db.commit_workload(space.mod)
        self.records: dict[tuple, MeasureResult] = {}
        self.order: list[tuple] = []
        self._load()
        self._file = open(self.records_path, "a", encoding="utf-8")

    def _set_aside_old_encoding(self, old: dict) -> None:
        """Knob vectors written by an older encoding cannot be read as today's: keep the file
        beside (nothing is deleted) and rebuild the records from TVM's database, whose traces
        re-encode.  Failed candidates are only in the old file, so they may be measured again."""
        kept = self.records_path.with_suffix(f".v{old.get('knob_encoding', 1)}.jsonl")
        os.replace(self.records_path, kept)
        log.warning("%s: knob vectors of an older encoding moved to %s; records rebuilt from TVM's "
                    "database", self.records_path, kept.name)

    def _load(self) -> None:
        path = self.records_path
        if path.exists():
            for ln in path.read_text().splitlines():
                if ln.strip():
                    r = json.loads(ln)
                    self._remember(tuple(r["config"]), MeasureResult(r["error"], r.get("run_secs", []), r.get("message", "")))
        recovered = []
        for rec in self.db.get_top_k(self.workload, 1 << 30):
            config = self.space.encode(rec.trace)
            if config is not None and tuple(config) not in self.records:
                res = MeasureResult("ok", [float(x) for x in rec.run_secs])
                self._remember(tuple(int(x) for x in config), res)
                recovered.append((config, res))
        if recovered:
            log.warning("recovered %d record(s) found only in TVM's database", len(recovered))
            with open(path, "a", encoding="utf-8") as f:
                for config, res in recovered:
                    f.write(self._line(config, res))

    def _remember(self, key: tuple, res: MeasureResult) -> None:
        if key not in self.records:
            self.order.append(key)
        self.records[key] = res

    @staticmethod
    def _line(config, res: MeasureResult) -> str:
        return json.dumps({"config": [int(x) for x in config], "error": res.error,
                           "run_secs": res.run_secs, "message": res.message,
                           "time": round(time.time(), 3)}) + "\n"

    def add(self, config, sch, res: MeasureResult) -> None:
        """Persist one outcome now: TVM's database first (successes), then the knob-vector log."""
        if res.ok:
            self.db.commit_tuning_record(ms.database.TuningRecord(
                sch.trace, self.workload, run_secs=res.run_secs, target=self.space.target,
                args_info=ms.arg_info.ArgInfo.from_entry_func(sch.mod, remove_preproc=True)))
        self._file.write(self._line(config, res))
        self._file.flush()
        os.fsync(self._file.fileno())
        self._remember(tuple(int(x) for x in config), res)

    def close(self) -> None:
        self._file.close()

    # -- views ------------------------------------------------------------------------------------
    def measured(self) -> tuple[np.ndarray, list]:
        """Configs and latencies (None for failures / invalid) in measurement order."""
        configs = np.array(self.order, dtype=np.int64).reshape(-1, self.space.ndim)
        return configs, [self.records[k].latency for k in self.order]
