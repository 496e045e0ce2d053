"""Compile a model with the tuning database into a Relax VM executable; run, check and time it.

A kernel with no record in the database falls back to TVM's untuned PrimFunc, and one warning line
names such kernels (``untuned_kernels``).  Every executable is checked against the model's reference
before any timing is reported.
"""
from __future__ import annotations

import os
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .._tvm import ms
from .graph import apply_database, fuse, gpu_default_schedule, kernel_records, kernels, optimise
from .inplace import inplace_residuals
from ..measure.verify import TOLERANCE, relative_error
from ..measure.pipeline import compile_module
from ..measure.target import is_cuda, parse_target
from ..measure.paired import paired_seconds, sample_alternately
from .timing import device_exclusive, kernel_flops, time_vm, virtual_machine, vm_device  # noqa: F401  (vm_device: part of this API)

import tvm


class NumericsError(RuntimeError):
    """The compiled model's output differs from the reference beyond tolerance."""


def open_database(work_dir):
    """The work dir's TVM database, read-only use (fails clearly when it is not a tuning log)."""
    d = Path(work_dir)
    if not (d / "database_tuning_record.json").is_file():
        raise FileNotFoundError(f"{d} is not an adaptune/MetaSchedule work dir (no database_tuning_record.json)")
    return ms.database.JSONDatabase(work_dir=str(d), allow_missing=False)


def build_untuned(model, target=None):
    """TVM's default build of the same optimised graph (on a GPU with TVM's default GPU schedules):
    our "untuned TVM" baseline."""
    target = parse_target(target)
    return tvm.compile(gpu_default_schedule(fuse(optimise(model.mod), target), target), target=target)


def untuned_kernels(fused, database, target) -> list[str]:
    """The kernels of ``fused`` that have no record in ``database``: they would run TVM's untuned code
    (a work dir tuned for another model, an older adaptune, or a CPU whose vector width pads the
    convolutions' channels otherwise: ``kernel_rewrites.pad_lanes``)."""
    return [name for name, _, mod in kernels(fused) if database.query_tuning_record(mod, target, name) is None]


#: what tunes the kernels ``warn_untuned`` names, for a model built from the CLI's work dir
TUNE_RESUME = "`adaptune tune` with --resume on its work dir tunes them"


def warn_untuned(fused, database, target, remedy: str = TUNE_RESUME) -> None:
    """One stderr line naming the kernels of ``fused`` that ``untuned_kernels`` finds, if any, and
    ``remedy``, what tunes them."""
    missing = untuned_kernels(fused, database, target)
    if missing:
        count = sum(1 for _ in kernels(fused))
        print(f"adaptune: warning: no record in the tuning database for {len(missing)} of the model's {count} "
              f"kernels ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}): they run TVM's untuned "
              f"code (a database tuned for another model, CPU or adaptune version; {remedy})", file=sys.stderr)


# ``build_best``'s race: one short sample per build per round, so a round of six builds stays under a
# second (inside a noisy machine's quick and slow phases), and 5x the rounds asked for.
RACE_SAMPLE_MS = 100
RACE_INTERLEAVE = 5

GLUE_FLOPS = 4e6       # a kernel below this many FLOPs is glue: serial in a ``serial_glue`` build


def serial_glue(fused, database, target) -> "ms.database.MemoryDatabase":
    """The best record of every kernel of ``fused``, with the ``Parallel`` steps dropped from the
    traces of its glue kernels (layer norms, head transposes, pooling: under ``GLUE_FLOPS``).

    Between two oneDNN calls a parallel TVM kernel wakes TVM's thread pool while OpenMP's threads
    still spin on the same cores, and a small kernel costs several times its own time.  Run
    serially on the calling thread it does not wake a second pool.  Kernels with no
    record keep TVM's plain (serial) code as before."""
    from tvm import s_tir
    from tvm.s_tir.analysis import estimate_tir_flops

    def record(name, func, mod):
        rec = database.query_tuning_record(mod, target, name)
        if rec is None or float(estimate_tir_flops(mod)) >= GLUE_FLOPS:
            return rec
        serial = [i for i in rec.trace.insts if i.kind.name != "Parallel"]
        trace = s_tir.schedule.Trace(serial, {i: d for i, d in rec.trace.decisions.items() if i.kind.name != "Parallel"})
        return ms.database.TuningRecord(trace, rec.workload, run_secs=rec.run_secs, target=target,
                                        args_info=rec.args_info)
    return kernel_records(fused, target, record)


def lower_tuned(model, database, target, library=None, serial=False, cold=None) -> "tvm.IRModule":
    """The model's module with the best record of every task from ``database`` applied.

    ``library``: chain signatures (``library.LibraryOp``) -> "onednn" | "winograd" |
    "winograd-generated" | "winograd-generated-f2", the chains to run on that implementation instead
    of the direct generated kernel (Woodpecker's per-operator choice; see ``library.plan``).
    ``serial``: glue kernels run serially (``serial_glue``).  ``cold``: a ``cold_weights.ColdChoice``
    that picks the records of the kernels with large weights by their time with the weights cold.
    On a CPU, residual adds whose residual dies with the call write over it (``inplace_residuals``)."""
    mod = optimise(model.mod)
    if library:
        from .library import offload
        mod = offload(mod, library)
    fused = fuse(mod, target)
    if cold is not None:
        database = cold.database_for(fused)
    mod = apply_database(fused, serial_glue(fused, database, target) if serial else database, target)
    if is_cuda(target):
        return gpu_default_schedule(mod, target)
    from .library import schedule_epilogues
    return inplace_residuals(schedule_epilogues(mod))


def build_tuned(model, database, target=None, library=None, serial=False):
    """``lower_tuned``, built."""
    target = parse_target(target)
    return compile_module(lower_tuned(model, database, target, library, serial), target)


@dataclass
class Build:
    """One build of the model: what it runs on the library, its check and its time."""
    name: str                           # "generated" | "library" | "choice" | "... serial glue"
    executable: object
    library: dict                       # chain signature -> "onednn" | "winograd" | "winograd-generated[-f2]"
    error: float
    seconds: float
    serial: bool = False                # glue kernels serial (``serial_glue``)
    flops: dict = field(default_factory=dict)   # operations per call of each TIR function (``kernel_flops``)

    @property
    def on_library(self) -> dict:
        """The chains this build runs on the vendor library (oneDNN calls, Winograd's oneDNN GEMMs)."""
        from .library import LIBRARY_IMPLS
        return {op: impl for op, impl in self.library.items() if impl in LIBRARY_IMPLS}

    def summary(self, chains: int | None = None) -> str:
        """What the build runs off the direct kernels: "5 of 16 chains as fused library calls,
        10 as Winograd, 2 as Winograd with generated GEMMs" (zero counts after the first left out)."""
        n = Counter(self.library.values())
        of = "" if chains is None else f" of {chains}"
        return (f"{n['onednn']}{of} chains as fused library calls"
                + (f", {n['winograd']} as Winograd" if n["winograd"] else "")
                + (f", {n['winograd-generated']} as Winograd with generated GEMMs" if n["winograd-generated"] else "")
                + (f", {n['winograd-generated-f2']} as Winograd F(2x2) with generated GEMMs"
                   if n["winograd-generated-f2"] else ""))


@dataclass
class BestBuild:
    """The fastest of the candidate builds, with the per-chain choices behind it."""
    best: Build
    builds: list[Build]
    choices: list

    @property
    def generated(self) -> Build:
        """The fastest build that calls no library (every kernel generated)."""
        return min((b for b in self.builds if not b.on_library), key=lambda b: b.seconds)


#: Winograd weights that fit together in the last-level cache of any x86 machine we met (Zen 1's L3
#: is 8 MB per core complex): below this, builds with less Winograd are not raced
SMALL_WEIGHTS = 8 * 2**20


def winograd_caps(choices) -> list[tuple[str, dict]]:
    """All-generated builds whose Winograd chains keep transformed weights up to each size, the largest
    dropped first: (build name, chains).  Each chain takes the first of its ``winograd_forms`` whose
    weight fits, F(4x4,3x3) then F(2x2,3x3) (16/9 of the direct weight rather than 4x), else its direct
    kernel.  A model whose 3x3 layers all run as F(4x4) may outgrow the last-level cache and stream
    every weight from DRAM on each inference, which the per-chain timings (each chain alone, its
    weights hot) cannot see; the whole-model race can (ResNet-18 on a VM whose L3 holds ~64 MB: 14.5 ms
    all F(4x4), 12.3 without the 512-channel chains' 113 MB; docs/decisions.md, session 60).  Caps stop
    at the first whose chains' weights (per call) fit ``SMALL_WEIGHTS``."""
    from .winograd import M, tile, weight_bytes
    forms = {c.op: [(impl, weight_bytes(c.op, tile(impl))) for impl in c.winograd_forms] for c in choices}
    calls = {c.op: max(c.calls, 1) for c in choices}

    def kept(cap: float) -> dict:
        return {op: next(i for i, b in fs if b <= cap) for op, fs in forms.items() if any(b <= cap for _, b in fs)}

    def total(chains: dict) -> int:
        return sum(calls[op] * weight_bytes(op, tile(impl)) for op, impl in chains.items())

    sizes = sorted({b for fs in forms.values() for _, b in fs}, reverse=True)
    if not sizes or total(kept(sizes[0])) <= SMALL_WEIGHTS:
        return []
    caps, seen = [], [kept(sizes[0])]
    for cap in sizes[1:]:
        chains = kept(cap)
        if chains in seen:
            continue
        seen.append(chains)
        small = sum(tile(i) != M for i in chains.values())
        caps.append((f"generated, Winograd up to {cap / 2**20:.1f} MB weights"
                     + (f" ({small} as F(2x2))" if small else ""), chains))
        if total(chains) <= SMALL_WEIGHTS:
            break
    return caps


def build_best(model, database, target=None, *, library: bool = True, inputs=None, rounds: int = 3,
               library_times: dict | None = None, remedy: str = TUNE_RESUME) -> BestBuild:
    """Build the model all generated (with Winograd's generated GEMMs where ``library.plan`` timed them
    faster than the direct kernel, with ``winograd_caps``' subsets of those, and without), with every
    chain oneDNN can run on oneDNN, and with the per-chain choice of ``library.plan`` (the last two
    also with their glue kernels serial); on a CPU whose last-level cache the model's constants
    outgrow, each all-generated Winograd build once more with the large kernels' records chosen by
    their time with the weights cold (``cold_weights``); check each against the reference; time them alternating,
    ``RACE_INTERLEAVE * rounds`` rounds of one short sample each, then the two fastest and the
    generated build twice as many rounds more; keep the fastest by ``paired_seconds`` (so the final
    model is no slower than either extreme, up to what a machine whose slow phases reorder the
    builds leaves: about 2% on a noisy VM, decisions.md).
    ``library_times``: the chains' library timings this run has measured already (``tune_model``'s),
    reused.  ``remedy``: what tunes the kernels with no record, in the warning that names them."""
    from .library import chosen, eligible, generated_choice, plan
    target = parse_target(target)
    inputs = inputs if inputs is not None else model.example_inputs()
    optimised = optimise(model.mod)
    choices = plan(optimised, database, target, library_times, library=library)
    fused = fuse(optimised, target)
    warn_untuned(fused, database, target, remedy)
    winograd = generated_choice(choices)
    all_generated = [("generated", winograd)] + winograd_caps(choices)
    variants = [(name, ops, False, None) for name, ops in all_generated]
    if not is_cuda(target):
        from .cold_weights import ColdChoice
        cold = ColdChoice(database, target)
        if cold.applies(optimised):
            variants += [(f"{name}, records timed with cold weights", ops, False, cold) for name, ops in all_generated]
    variants += [("generated, direct", {}, False, None)] if winograd else []
    if library and choices:
        variants += [("library", eligible(choices), False, None), ("choice", chosen(choices), False, None)]
        if not is_cuda(target):             # serial glue: TVM's CPU thread pool beside OpenMP's
            variants += [("library, serial glue", eligible(choices), True, None),
                         ("choice, serial glue", chosen(choices), True, None)]
    builds, seen = [], {}
    for name, ops, serial, cold in variants:
        key = (frozenset(ops.items()), serial, cold is not None)
        if key in seen or (serial and not ops):
            continue
        if serial:
            name = f"{seen[(frozenset(ops.items()), False, False)]}, serial glue"
        seen[key] = name
        try:
            mod = lower_tuned(model, database, target, ops, serial, cold)
            flops = kernel_flops(mod)
            ex = compile_module(mod, target)
            builds.append(Build(name, ex, ops, check(ex, model, inputs), float("inf"), serial, flops))
        except Exception as e:              # noqa: BLE001 - a library build that fails leaves the others
            if not ops and cold is None:
                raise
            print(f"adaptune: warning: the {name} build fails ({' '.join(str(e).split())[:160]}); left out",
                  file=sys.stderr)
    times = {b.name: [] for b in builds}
    generated = builds[0]

    def race(contenders, n):
        sample_alternately({b.name: (lambda b=b: time_vm(b.executable, inputs, repeat=1, min_repeat_ms=RACE_SAMPLE_MS))
                            for b in contenders}, n, times)
        seconds = paired_seconds(times, generated.name)
        for b in contenders:
            b.seconds = seconds[b.name]

    with device_exclusive():
        race(builds, RACE_INTERLEAVE * rounds)
        # A run-off between the two fastest and the all-generated build, twice as many rounds: on a
        # noisy machine a few rounds do not separate builds 10-20% apart, and the generated build,
        # which calls nothing beside TVM, stays in it (docs/decisions.md, 2026-11-27 night, 2026-11-28).
        if len(builds) > 1:
            final = sorted(builds, key=lambda b: b.seconds)[:2]
            if generated not in final:
                final.append(generated)
            race(final, 2 * RACE_INTERLEAVE * rounds)
    return BestBuild(min(builds, key=lambda b: b.seconds), builds, choices)


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
    """An exported model, loaded; on the CPU its parallel loops run on PyTorch's OpenMP pool
    (``openmp.share_pool``)."""
    from . import openmp
    return openmp.load(path)[0]


def vm_leaves(out) -> list:
    """The tensors of a Relax VM result (a tensor or nested tuples of them), in order."""
    if isinstance(out, tvm.runtime.Tensor):
        return [out]
    return [t for o in out for t in vm_leaves(o)]


def _flatten(out) -> list[np.ndarray]:
    return [t.numpy() for t in vm_leaves(out)]


def run_vm(executable, inputs: list[np.ndarray]) -> list[np.ndarray]:
    vm, dev = virtual_machine(executable)
    return _flatten(vm["main"](*[tvm.runtime.tensor(a, dev) for a in inputs]))


def check(executable, model, inputs=None) -> float:
    """Compare with the model's reference (``verify.relative_error``); returns the worst error."""
    inputs = inputs if inputs is not None else model.example_inputs()
    got, want = run_vm(executable, inputs), model.reference(inputs)
    if len(got) != len(want):
        raise NumericsError(f"compiled model returns {len(got)} outputs, reference {len(want)}")
    names = model.output_names if len(model.output_names) == len(want) else [f"#{i}" for i in range(len(want))]
    worst = 0.0
    for name, g, w in zip(names, got, want):
        if g.shape != w.shape:
            raise NumericsError(f"output {name}: shape {g.shape} differs from reference {w.shape}")
        err = relative_error(g, w)
        if err > TOLERANCE:
            raise NumericsError(f"output {name} differs from reference: max error {err:.2e} of output scale")
        worst = max(worst, err)
    return worst
