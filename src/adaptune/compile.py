"""Compile a model with the tuning database into a Relax VM executable; run, check and time it.

A kernel with no record in the database falls back to TVM's untuned PrimFunc (TVM warns).  Every
executable is checked against the model's reference before any timing is reported.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from ._tvm import ms
from .graph import apply_database, fuse, optimise
from .target import parse_target

import tvm
from tvm import relax


class NumericsError(RuntimeError):
    """The compiled model's output differs from the reference beyond tolerance."""


def open_database(work_dir):
    """The work dir's TVM database, read-only use (fails clearly when it is not a tuning log)."""
    d = Path(work_dir)
    if not (d / "database_tuning_record.json").is_file():
        raise FileNotFoundError(f"{d} is not an adaptune/MetaSchedule work dir (no database_tuning_record.json)")
    return ms.database.JSONDatabase(work_dir=str(d), allow_missing=False)


def build_untuned(model, target=None):
    """TVM's default CPU build of the same optimised graph: our "untuned TVM" baseline."""
    target = parse_target(target)
    return tvm.compile(fuse(optimise(model.mod), target), target=target)


def lower_tuned(model, database, target, library=()) -> "tvm.IRModule":
    """The model's module with the best record of every task from ``database`` applied.

    ``library``: operator signatures (``library.LibraryOp``) to run with PyTorch's kernel instead
    of the generated one (Woodpecker's per-operator choice; see ``library.plan``)."""
    mod = optimise(model.mod)
    if library:
        from .library import offload, schedule_epilogues
        mod = offload(mod, library)
    mod = apply_database(fuse(mod, target), database, target)
    return schedule_epilogues(mod) if library else mod


def build_tuned(model, database, target=None, library=()):
    """``lower_tuned``, built."""
    target = parse_target(target)
    return tvm.compile(lower_tuned(model, database, target, library), target=target)


def export(executable, path) -> Path:
    """Write the executable as a shared library, atomically (never a half-written file)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}.so")
    try:
        executable.export_library(str(tmp))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def load(path):
    from . import library  # noqa: F401  (registers the PyTorch kernels a compiled model may call)
    return tvm.runtime.load_module(str(path))


def _flatten(out) -> list[np.ndarray]:
    if isinstance(out, tvm.runtime.Tensor):
        return [out.numpy()]
    res = []
    for o in out:
        res += _flatten(o)
    return res


def run_vm(executable, inputs: list[np.ndarray]) -> list[np.ndarray]:
    dev = tvm.cpu()
    vm = relax.VirtualMachine(executable, dev)
    return _flatten(vm["main"](*[tvm.runtime.tensor(a, dev) for a in inputs]))


def check(executable, model, inputs=None, *, rtol=1e-3, atol=1e-4) -> float:
    """Compare with the model's reference; returns the max error relative to the output scale."""
    inputs = inputs if inputs is not None else model.example_inputs()
    got, want = run_vm(executable, inputs), model.reference(inputs)
    if len(got) != len(want):
        raise NumericsError(f"compiled model returns {len(got)} outputs, reference {len(want)}")
    worst = 0.0
    for g, w in zip(got, want):
        if g.shape != w.shape:
            raise NumericsError(f"output shape {g.shape} differs from reference {w.shape}")
        scale = max(float(np.abs(w).max()), 1e-6)
        err = float(np.abs(g.astype(np.float64) - w).max()) / scale
        if not np.allclose(g, w, rtol=rtol, atol=atol * scale):
            raise NumericsError(f"output differs from reference: max error {err:.2e} of output scale")
        worst = max(worst, err)
    return worst


def time_vm(executable, inputs, *, repeat: int = 10, min_repeat_ms: int = 200) -> float:
    """Median seconds per inference (TVM's time_evaluator, after a warm-up)."""
    dev = tvm.cpu()
    vm = relax.VirtualMachine(executable, dev)
    args = [tvm.runtime.tensor(a, dev) for a in inputs]
    vm["main"](*args)
    res = vm.time_evaluator("main", dev, number=1, repeat=repeat, min_repeat_ms=min_repeat_ms)(*args)
    return float(np.median(res.results))


def time_callable(fn, *, repeat: int = 10, min_repeat_ms: int = 200) -> float:
    """Median seconds per call of ``fn`` in the same style as TVM's evaluator (for PyTorch / ORT)."""
    fn()
    t = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t, 1e-6)
    number = max(1, int(min_repeat_ms / 1e3 / one))
    samples = []
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - t) / number)
    return float(np.median(samples))
