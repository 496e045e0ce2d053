"""Records and resume: a MetaSchedule JSONDatabase plus adaptune's knob vectors, in one work dir.

Every measured candidate is written the moment its result is known: successes go to TVM's
``database_tuning_record.json`` (so ``ms.database.JSONDatabase`` and TVM's compile-with-database
helpers use the work dir as-is), and every outcome, failures included, to
``adaptune_records.jsonl`` with its knob vector, flushed and fsync'ed.  Reopening the work dir
resumes: both files are read back (a truncated or corrupt line, e.g. from kill -9 mid-write, is
dropped with a warning), successes that reached TVM's file but not ours are recovered by encoding
their traces, and nothing already measured is measured again.  A single operator's store holds
the work dir's lock (``WorkDir.lock``) until it is closed.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from pathlib import Path

import numpy as np

import tvm_ffi

from .._tvm import ms
from .run import MeasureResult
from .workdir import META, RECORDS, WorkDir, WorkDirError, repair_jsonl, write_json  # noqa: F401 - re-exported

log = logging.getLogger("adaptune")

KNOB_ENCODING = 2      # 2: compute-location knobs hold TVM's raw decision (1: an index into the valid ones)


class RecordStore:
    """One workload's measured records in ``work_dir`` (one target per work dir)."""

    def __init__(self, work_dir, space, *, resume: bool = False, label: str = "", db=None, name: str | None = None):
        """``db`` and ``name`` let several tasks of a model share one TVM database in ``work_dir``:
        task ``name`` keeps its knob vectors in ``tasks/<name>.jsonl``."""
        self.dir = Path(work_dir)
        self.space = space
        wd = WorkDir(self.dir)
        self.records_path, meta_path = wd.records_path(name), wd.meta_path(name)
        meta = {"workload": label or "main", "target": str(space.target),
                "workload_hash": str(tvm_ffi.structural_hash(space.mod)), "knob_sizes": space.sizes.tolist(),
                "knob_encoding": KNOB_ENCODING}
        self._lock = contextlib.ExitStack()
        if name is None:        # a model's tasks share the lock ``tune_model`` holds
            wd.check_operator(resume and self.dir.exists())  # API: resuming a new dir starts it
            self._lock.enter_context(wd.lock())
        try:
            self._open(meta, meta_path, db)
        except BaseException:
            self._lock.close()
            raise

    def _open(self, meta: dict, meta_path: Path, db) -> None:
        """Check the work dir holds this workload, repair torn lines, read the records back."""
        if meta_path.exists() or self.records_path.exists():
            old = json.loads(meta_path.read_text()) if meta_path.exists() else meta
            if old.get("knob_encoding", 1) != KNOB_ENCODING and self.records_path.exists():
                self._set_aside_old_encoding(old)
                old["knob_sizes"] = meta["knob_sizes"]
            for key in ("workload_hash", "target", "knob_sizes"):
                if old.get(key) != meta[key]:
                    raise WorkDirError(f"work dir {self.dir} holds another {key.replace('_', ' ')} "
                                       f"({old.get(key)!r}); use a separate work dir")
        meta_path.parent.mkdir(parents=True, exist_ok=True)
        write_json(meta_path, meta)
        repair_jsonl(self.records_path)
        if db is None:
            WorkDir(self.dir).repair_database()
        self.db = db if db is not None else ms.database.JSONDatabase(work_dir=str(self.dir))
        self.workload = self.db.commit_workload(self.space.mod)
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
        self._lock.close()

    # -- views ------------------------------------------------------------------------------------
    def measured(self) -> tuple[np.ndarray, list]:
        """Configs and latencies (None for failures / invalid) in measurement order."""
        configs = np.array(self.order, dtype=np.int64).reshape(-1, self.space.ndim)
        return configs, [self.records[k].latency for k in self.order]
