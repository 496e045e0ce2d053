"""Fault injection: kernels and wrappers that misbehave on purpose, for the reliability tests and
``bench/faults.py``.  Each fault is one a real tuning run meets: a kernel that segfaults, hangs,
fails to build, or computes the wrong thing; a device that disappears; a disk that fills up."""
from __future__ import annotations

import contextlib
import errno
import socket
import subprocess
import sys
import time

from tvm.script import ir as I
from tvm.script import tirx as T

from .._tvm import tvm
from ..measure.run import Measurer


@I.ir_module
class Segfault:
    @T.prim_func
    def main(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        for i in range(16):
            # a write 2^42 floats past the buffer: the worker is killed by SIGSEGV
            B[T.int64(i) + T.int64(4398046511104)] = A[i]


@I.ir_module
class Hang:
    @T.prim_func
    def main(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        for i in range(T.int64(1) << T.int64(50)):  # ~10^15 dependent steps: runs for days
            B[0] = B[0] * A[i % T.int64(16)] + A[(i + T.int64(1)) % T.int64(16)]


@I.ir_module
class BuildFails:
    @T.prim_func
    def main(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        for i in T.thread_binding(16, thread="threadIdx.x"):   # a GPU binding sent to the CPU backend
            B[i] = A[i]


def wrong_kernel(mod) -> "tvm.IRModule":
    """A fast kernel with ``mod``'s signature that writes zeros to the last argument (the output)."""
    from tvm import te

    from ..measure.verify import signature
    sig = signature(mod)
    ins = [te.placeholder(shape, dtype, name=f"in{i}") for i, (shape, dtype) in enumerate(sig[:-1])]
    out = te.compute(sig[-1][0], lambda *idx: tvm.tirx.const(0, sig[-1][1]), name="zeros")
    prim = te.create_prim_func(ins + [out]).with_attr("global_symbol", "main")
    return tvm.IRModule({"main": prim})


class WrongSchedule:
    """Stands in for a decoded schedule whose kernel computes the wrong result."""

    def __init__(self, sch, mod):
        self.trace, self.mod = sch.trace, mod


class InjectingMeasurer(Measurer):
    """Replaces the candidates at the given positions of the first ``batches`` batches."""

    def __init__(self, target, faults: dict[int, object], batches: int = 1, **kw):
        super().__init__(target, **kw)
        self.faults, self.batches = faults, batches

    def measure(self, mods, on_result=None):
        mods = list(mods)
        if self.batches > 0:
            self.batches -= 1
            for i, bad in self.faults.items():
                if i < len(mods):
                    mods[i] = bad
        return super().measure(mods, on_result)


@contextlib.contextmanager
def disk_full_after(n: int):
    """Record writes fail with ENOSPC after ``n`` records (``RecordStore.add`` patched)."""
    from ..measure.records import RecordStore
    original, count = RecordStore.add, [0]

    def add(store, config, sch, res):
        count[0] += 1
        if count[0] > n:
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(store, config, sch, res)
    RecordStore.add = add
    try:
        yield
    finally:
        RecordStore.add = original


@contextlib.contextmanager
def wrong_first_candidate(mod):
    """The first candidate of the first batch computes zeros (``TuneState.prepare`` patched);
    yields a list that receives that candidate's config."""
    from ..search.state import TuneState
    original, injected = TuneState.prepare, []

    def prepare(self, strategy, n, attempts=3):
        batch = original(self, strategy, n, attempts)
        if not injected and batch:
            config, sch = batch[0]
            batch[0] = (config, WrongSchedule(sch, wrong_kernel(mod)))
            injected.append(tuple(int(x) for x in config))
        return batch
    TuneState.prepare = prepare
    try:
        yield injected
    finally:
        TuneState.prepare = original


@contextlib.contextmanager
def local_rpc_farm(key: str = "adaptune-local", timeout: float = 60.0):
    """TVM's RPC tracker and one RPC server on 127.0.0.1; yields (RPCDevice, [tracker, server])."""
    from ..measure.run import RPCDevice, RPCError
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "start_new_session": True}
    procs = [subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1",
                               "--port", str(port), "--port-end", str(port + 1)], **quiet)]
    try:
        time.sleep(1.0)
        if procs[0].poll() is not None:
            raise RuntimeError("TVM's RPC tracker exited at start (it needs the tornado package)")
        procs.append(subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_server", "--tracker",
                                       f"127.0.0.1:{port}", "--key", key, "--host", "127.0.0.1"], **quiet))
        device = RPCDevice("127.0.0.1", port, key, session_timeout=30)
        deadline = time.time() + timeout
        while True:
            try:
                device.check()
                break
            except RPCError:
                if time.time() > deadline:
                    raise
                time.sleep(0.5)
        yield device, procs
    finally:
        for p in procs:
            kill_group(p)


def kill_group(proc) -> None:
    """SIGKILL a process started by ``local_rpc_farm`` and its children (the RPC server forks)."""
    import os
    import signal
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
