"""A work dir's files, read and written in one place, and the lock a run holds while it writes.

Two layouts share TVM's JSONDatabase files at the top (``database_workload.json``,
``database_tuning_record.json``): a single operator's adds ``adaptune_records.jsonl`` (every
outcome with its knob vector) and ``adaptune.json`` (what the records are of); a model's adds
``model.json`` (model, target, tasks) and ``tasks/<task>.jsonl``.  JSON files are replaced
atomically; record logs tolerate a torn last line.  One run at a time may write a work dir: it
holds an ``flock`` on ``.adaptune.lock``, which the kernel releases when the process ends, so a
crashed run leaves no stale lock.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from pathlib import Path

log = logging.getLogger("adaptune")

RECORDS = "adaptune_records.jsonl"
META = "adaptune.json"
MODEL_META = "model.json"
LOCK = ".adaptune.lock"
TVM_FILES = ("database_workload.json", "database_tuning_record.json")

_held: dict[Path, list] = {}        # lock file -> [open file, depth]: this process's locks (re-entrant)


class WorkDirError(ValueError):
    """A work dir that cannot be used as asked (records present without resume, other workload)."""


class WorkDirBusy(WorkDirError):
    """Another run is writing the work dir."""


def write_json(path, data) -> None:
    """Write ``data`` as JSON, atomically: readers see the old file or the new one, never half."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def _json_lines(raw: bytes) -> tuple[list[dict], list[bytes], int]:
    """A record log's rows, the raw lines they came from, and how many lines were not JSON (a torn
    last write); blank lines are neither."""
    rows, good, bad = [], [], 0
    for ln in raw.split(b"\n"):
        if not ln.strip():
            continue
        try:
            rows.append(json.loads(ln))
            good.append(ln)
        except ValueError:
            bad += 1
    return rows, good, bad


def read_jsonl(path) -> list[dict]:
    """A record log's rows in order; a line that is not JSON (a torn last write) is skipped."""
    path = Path(path)
    return _json_lines(path.read_bytes())[0] if path.exists() else []


def repair_jsonl(path: Path) -> int:
    """Drop lines that are not valid JSON (a torn last write); returns how many were dropped."""
    if not path.exists():
        return 0
    _, good, bad = _json_lines(path.read_bytes())
    if bad:
        log.warning("%s: dropped %d unreadable line(s) (interrupted write?)", path, bad)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_bytes(b"".join(g + b"\n" for g in good))
        os.replace(tmp, path)
    return bad


class WorkDir:
    """The files of one work dir (see the module doc); creates nothing until something is written."""

    def __init__(self, path):
        self.path = Path(path)

    def __str__(self) -> str:
        return str(self.path)

    # -- the run lock -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self):
        """Hold the work dir's write lock (re-entrant within a process); ``WorkDirBusy`` if another
        process holds it."""
        self.path.mkdir(parents=True, exist_ok=True)
        key = (self.path / LOCK).resolve()
        if key in _held:
            _held[key][1] += 1
        else:
            f = open(key, "a")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                raise WorkDirBusy(f"work dir {self.path} is in use by another adaptune run; wait for it to "
                                  "finish or choose another --work-dir") from None
            _held[key] = [f, 1]
        try:
            yield self
        finally:
            _held[key][1] -= 1
            if not _held[key][1]:
                _held.pop(key)[0].close()

    # -- single-operator layout -------------------------------------------------------------------
    def check_operator(self, resume: bool) -> None:
        """Refuse early (before any tuning work) a work dir that has records unless resuming."""
        has = (self.path / META).exists() or (self.path / RECORDS).exists()
        if has and not resume:
            raise WorkDirError(f"work dir {self.path} already has tuning records; pass --resume to continue "
                               "it or choose another --work-dir")
        if resume and not self.path.exists():
            raise WorkDirError(f"--resume: work dir {self.path} does not exist")

    def records(self, task: str | None = None) -> list[dict]:
        """The knob-vector log in measurement order: the operator's, or model task ``task``'s."""
        return read_jsonl(self.records_path(task))

    def records_path(self, task: str | None = None) -> Path:
        return self.path / "tasks" / f"{task}.jsonl" if task else self.path / RECORDS

    def meta_path(self, task: str | None = None) -> Path:
        return self.path / "tasks" / f"{task}.json" if task else self.path / META

    def repair_database(self) -> None:
        """Drop torn lines from TVM's database files before TVM reads them."""
        for name in TVM_FILES:
            repair_jsonl(self.path / name)

    # -- model layout -----------------------------------------------------------------------------
    def is_model(self) -> bool:
        return (self.path / MODEL_META).is_file()

    def check_model(self, resume: bool) -> None:
        """Refuse early a model work dir that has records unless resuming, or resuming a non-model one."""
        if self.is_model() and not resume:
            raise WorkDirError(f"work dir {self.path} already has tuning records; pass --resume to continue "
                               "it or choose another --work-dir")
        if resume and not self.is_model():
            raise WorkDirError(f"--resume: {self.path} is not a model work dir (no {MODEL_META})")

    def model(self) -> dict:
        """``model.json`` (``FileNotFoundError`` with one line when this is no model work dir)."""
        if not self.is_model():
            raise FileNotFoundError(f"{self.path} is not a model work dir of `adaptune tune` (no {MODEL_META})")
        return json.loads((self.path / MODEL_META).read_text())

    def write_model(self, meta: dict) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        write_json(self.path / MODEL_META, meta)

    def update_model(self, **fields) -> None:
        """Set top-level fields of ``model.json``, if this is a model work dir (else nothing), under
        the work dir's lock (a read-modify-write; ``WorkDirBusy`` while another run writes it)."""
        if self.is_model():
            with self.lock():
                self.write_model({**self.model(), **fields})
