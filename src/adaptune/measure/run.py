"""Measurement: build and run candidate kernels through MetaSchedule's builder and runner.

Both run in worker processes (TVM's PopenPool), so a kernel that segfaults or hangs kills or
times out a worker, never the tuning process.  Every candidate comes back as a ``MeasureResult``:
a latency, or an error kind (build / run / timeout / crash) with a message; nothing raises out of
a batch.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from .._tvm import ms, tvm
from .build import build_export
from tvm.ir.utils import derived_object  # noqa: E402 - after _tvm's import setup
from tvm.support.popen_pool import PopenPoolExecutor, StatusKind  # noqa: E402
from .target import device_type
from .verify import packs_arguments

OK, BUILD_ERROR, RUN_ERROR, TIMEOUT, CRASH = "ok", "build", "run", "timeout", "crash"
WRONG = "wrong"     # ran, but its output differs from the untuned kernel's (see verify.py)


def latency(run_secs) -> float:
    """A kernel's latency from its measured repeats: the median, in seconds (one rule everywhere)."""
    return statistics.median(float(s) for s in run_secs)


@dataclass
class MeasureResult:
    error: str                      # OK or one of the error kinds
    run_secs: list[float] = field(default_factory=list)
    message: str = ""
    # while on_result runs (local runs): the built kernel that was timed (``paired`` times it again)
    artifact: str | None = field(default=None, compare=False, repr=False)
    # whether it takes the PrimFunc's own arguments (checks run it; with weights in a rewritten
    # layout it takes others, and checks compile instead)
    own_args: bool = field(default=False, compare=False, repr=False)

    @property
    def ok(self) -> bool:
        return self.error == OK

    @property
    def latency(self) -> float | None:
        """Median over repeats, in seconds (None when the candidate failed)."""
        return latency(self.run_secs) if self.ok else None


def _classify(message: str) -> str:
    low = message.lower()
    if "timeout" in low or "timed out" in low:
        return TIMEOUT
    if "childprocesserror" in low or "died" in low or "signal" in low or "terminated" in low or "crash" in low:
        return CRASH
    return RUN_ERROR


def _short(message: str, limit: int = 300) -> str:
    lines = [ln for ln in str(message).strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else "")[:limit]


class RPCError(RuntimeError):
    """The RPC tracker cannot be reached or has no device under the key."""


@dataclass(frozen=True)
class RPCDevice:
    """A device farm behind TVM's RPC tracker (``python -m tvm.exec.rpc_tracker``)."""
    host: str
    port: int
    key: str
    session_timeout: int = 60       # seconds one remote measurement may take, upload to result

    @classmethod
    def parse(cls, address: str, key: str, session_timeout: int = 60) -> "RPCDevice":
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise RPCError(f"--rpc must be HOST:PORT of an RPC tracker, got {address!r}")
        if not key:
            raise RPCError("--rpc needs --device-key, the key the RPC servers registered with")
        return cls(host, int(port), key, session_timeout)

    def check(self, wait: float = 10.0) -> int:
        """Number of RPC servers registered under our key (free or busy); fails with one clear line
        if none shows up within ``wait`` seconds (a server re-registers after each session)."""
        deadline = time.monotonic() + wait
        while True:
            try:
                summary = tvm.rpc.connect_tracker(self.host, self.port).summary()
            except Exception as e:  # noqa: BLE001
                raise RPCError(f"cannot reach the RPC tracker at {self.host}:{self.port} ({type(e).__name__})") from None
            servers = [s for s in summary.get("server_info", []) if str(s.get("key", "")).split(":")[-1] == self.key]
            if servers:
                return len(servers)
            if time.monotonic() > deadline:
                keys = ", ".join(sorted({str(s.get("key", "")).split(":")[-1]
                                         for s in summary.get("server_info", [])})) or "none"
                raise RPCError(f"no RPC server with key {self.key!r} at {self.host}:{self.port} "
                               f"(servers' keys: {keys})")
            time.sleep(0.5)


class GcSafePool(PopenPoolExecutor):
    """TVM's process pool, except that garbage collection never waits for its threads.

    ``PopenPoolExecutor.__del__`` joins them, and a collection that happens while Python starts a
    thread runs inside ``threading``'s bookkeeping lock, which the join takes again: the process
    hangs in ``Thread.start`` for ever (TVM's docstring warns of it).  A pool that was not closed explicitly only has its workers killed."""

    def __del__(self):
        if not self._shutdown:
            self.shutdown(wait=False)


class WarmBuilder:
    """Builds in worker processes that outlive a batch.

    MetaSchedule's ``LocalBuilder`` starts a fresh process pool for every batch (and one more at
    construction, to check itself).  A worker takes seconds to start and import TVM, more than a
    small batch's builds.  TVM restarts its pools because long-lived
    workers leak memory, so ours are recycled after ``recycle`` builds each; a worker that
    times out or dies is killed and restarted by the pool, and its candidate reported."""

    def __init__(self, *, max_workers: int | None = None, timeout: float = 30.0, recycle: int = 64,
                 linked: bool = False):
        self.max_workers = max_workers or len(os.sched_getaffinity(0))   # the cores this process may use
        self.timeout, self.recycle, self.linked = timeout, recycle, linked
        self._pool: GcSafePool | None = None

    def build(self, inputs: Sequence["ms.builder.BuilderInput"]) -> list["ms.builder.BuilderResult"]:
        if self._pool is None:
            self._pool = GcSafePool(max_workers=self.max_workers, timeout=self.timeout,
                                    maximum_process_uses=self.recycle)
        out = []
        for r in self._pool.map_with_error_catching(lambda x: build_export(*x),
                                                   [(i.mod, i.target, self.linked) for i in inputs]):
            if r.status == StatusKind.COMPLETE:
                out.append(ms.builder.BuilderResult(r.value, None))
            elif r.status == StatusKind.TIMEOUT:
                out.append(ms.builder.BuilderResult(None, f"build timeout: killed after {self.timeout} seconds"))
            else:
                out.append(ms.builder.BuilderResult(None, f"build failed: {r.value}"))
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


class DeviceLock:
    """An exclusive ``fcntl.flock`` on ``path``, held inside ``with``; other processes (or other
    ``DeviceLock``s on the same path) wait for it.  The file is opened once, here."""

    def __init__(self, path: str):
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)

    def __enter__(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)

    def close(self) -> None:
        os.close(self.fd)


@derived_object
class _DoneFuture(ms.runner.PyRunnerFuture):
    """A runner future whose result is already known."""

    def __init__(self, result: "ms.runner.RunnerResult"):
        super().__init__()
        self._result = result

    def done(self) -> bool:
        return True

    def result(self) -> "ms.runner.RunnerResult":
        return self._result


@derived_object
class LockedRunner(ms.runner.PyRunner):
    """A MetaSchedule runner that holds ``lock`` while ``inner`` runs a batch, until its last result is in."""

    def __init__(self, inner: "ms.runner.Runner", lock: DeviceLock):
        super().__init__()
        self.inner, self.lock = inner, lock

    def run(self, runner_inputs) -> list:
        with self.lock:
            results = [f.result() for f in self.inner.run(runner_inputs)]
        return [_DoneFuture(r) for r in results]


class Measurer:
    """Builds in parallel warm workers (``WarmBuilder``), runs one candidate at a time.

    ``timeout`` bounds each build and each run; the runner reports the median of ``repeat``
    timings, each the mean of at least ``number`` runs and ``min_repeat_ms`` milliseconds.
    With ``rpc`` the kernels run on a device behind TVM's RPC tracker instead of locally.
    Several tuning processes sharing one local device set ``device_lock`` (default: the
    ``ADAPTUNE_DEVICE_LOCK`` environment variable) to the same file path, and each candidate's run then
    holds an exclusive ``fcntl.flock`` on that file, so runs never overlap while builds and searches do."""

    def __init__(self, target, *, timeout: float = 30.0, number: int = 2, repeat: int = 3,
                 min_repeat_ms: int = 20, build_workers: int | None = None, rpc: RPCDevice | None = None,
                 device_lock: str | None = None):
        self.target = target
        self.timeout = timeout
        self.rpc = rpc
        device_lock = device_lock or os.environ.get("ADAPTUNE_DEVICE_LOCK")
        self.device_lock = DeviceLock(device_lock) if device_lock and rpc is None else None
        # local runs load a shared library linked by the builders (see build_export)
        self.builder = WarmBuilder(max_workers=build_workers, timeout=timeout, linked=rpc is None)
        evaluator = ms.runner.EvaluatorConfig(number=number, repeat=repeat, min_repeat_ms=min_repeat_ms,
                                              enable_cpu_cache_flush=False)
        if rpc is None:
            self.runner = ms.runner.LocalRunner(timeout_sec=timeout, evaluator_config=evaluator)
            self.runner.pool.__class__ = GcSafePool     # TVM makes the pool; only its __del__ differs
        else:
            self.runner = ms.runner.RPCRunner(
                rpc_config=ms.runner.RPCConfig(tracker_host=rpc.host, tracker_port=rpc.port, tracker_key=rpc.key,
                                               session_timeout_sec=rpc.session_timeout),
                evaluator_config=evaluator, max_workers=1)

    @property
    def ms_runner(self) -> "ms.runner.Runner":
        """The runner to give MetaSchedule's own tuning: ``self.runner``, holding the device lock
        around each batch's runs if there is one."""
        return self.runner if self.device_lock is None else LockedRunner(self.runner, self.device_lock)

    def close(self) -> None:
        """Stop the build and run workers (they also exit with this process)."""
        self.builder.close()
        if self.rpc is None and not self.runner.pool._shutdown:
            self.runner.pool.shutdown()
        if self.device_lock is not None:
            self.device_lock.close()
            self.device_lock = None

    def measure(self, mods: Sequence["tvm.IRModule"],
                on_result: Callable[[int, MeasureResult], None] | None = None) -> list[MeasureResult]:
        """Measure scheduled modules; ``on_result(i, result)`` fires as soon as each is known (the
        built kernel's file is still there then; it is removed afterwards)."""
        results: list[MeasureResult | None] = [None] * len(mods)

        def done(i: int, res: MeasureResult) -> None:
            results[i] = res
            if on_result is not None:
                on_result(i, res)

        try:
            built = self.builder.build([ms.builder.BuilderInput(m, self.target) for m in mods])
        except Exception as e:  # noqa: BLE001 - a broken builder pool fails the batch, not the run
            built = [ms.builder.BuilderResult(None, f"builder failed: {e}")] * len(mods)
        pending = []
        for i, (mod, b) in enumerate(zip(mods, built)):
            if b.error_msg is not None:
                done(i, MeasureResult(TIMEOUT if "timeout" in b.error_msg.lower() else BUILD_ERROR,
                                      message=_short(b.error_msg)))
                continue
            try:
                args = ms.arg_info.ArgInfo.from_entry_func(mod, remove_preproc=True)
                own_args = not packs_arguments(mod)                         # the file takes mod's own arguments
                pending.append((i, b.artifact_path, own_args,
                                ms.runner.RunnerInput(b.artifact_path, device_type(self.target), args)))
            except Exception as e:  # noqa: BLE001
                done(i, MeasureResult(BUILD_ERROR, message=_short(str(e))))
        for i, path, own_args, runner_input in pending:   # one at a time, so each result is saved at once
            if self.rpc is not None:
                # TVM's RPC runner waits forever for a server that is gone: stop with RPCError instead
                self.rpc.check()
            try:
                with self.device_lock or contextlib.nullcontext():
                    r = self.runner.run([runner_input])[0].result()
                if r.error_msg is not None:
                    res = MeasureResult(_classify(r.error_msg), message=_short(r.error_msg))
                else:
                    res = MeasureResult(OK, [float(x) for x in r.run_secs], artifact=path if self.rpc is None else None,
                                        own_args=own_args)
            except Exception as e:  # noqa: BLE001
                res = MeasureResult(_classify(f"{type(e).__name__}: {e}"), message=_short(f"{type(e).__name__}: {e}"))
            done(i, res)
            res.artifact = None
            try:
                ms.utils.remove_build_dir(path)
            except Exception:  # noqa: BLE001 - a left-over temp dir is harmless
                pass
        return results
