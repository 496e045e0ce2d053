"""Build, check and time a model beside what its users run today, in one run.

The rows (``RUNTIMES``): TVM untuned, adaptune with every kernel generated, adaptune's final model
(``compile.build_best``: the per-chain library choice, kept only when the whole model got faster),
PyTorch eager, ``torch.compile`` (Inductor with ``freezing``: oneDNN fused convolutions with
pre-packed weights, its default mode) and ONNX Runtime (all graph optimisations, intra-op threads
= cores).  Every output is checked against the model's reference before anything is timed; the
contenders are then timed in short interleaved samples (``rounds`` rounds of five each), and each row
reports the median and min of its samples.  A runtime that cannot run the model is left out with the reason.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np

from . import compile as C
from ..measure.paired import paired_ratio, sample_alternately
from .timing import UNTUNED_CAP_S, device_exclusive, time_callable
from ..measure.target import is_cuda, parse_target
from ..measure.verify import TOLERANCE, max_relative_error

RUNTIMES = ("tvm-untuned", "adaptune-generated", "adaptune", "pytorch-eager", "torch-compile", "onnxruntime")


@dataclass
class Row:
    runtime: str
    latency_ms: float                   # median of the samples
    min_ms: float
    max_error: float | None
    note: str = ""

    def as_dict(self) -> dict:
        return {"runtime": self.runtime, "latency_ms": self.latency_ms, "min_ms": self.min_ms,
                "max_error": self.max_error, "note": self.note}


@dataclass
class Evaluation:
    model: str
    rows: list[Row]
    skipped: dict[str, str] = field(default_factory=dict)   # runtime -> why it has no row
    best: object = None                                     # compile.BestBuild (None without a database)
    samples: dict[str, list[float]] = field(default_factory=dict)   # runtime -> its timed samples, s, in order

    def row(self, runtime: str) -> Row | None:
        return next((r for r in self.rows if r.runtime == runtime), None)

    def paired(self, runtime: str, reference: str) -> float | None:
        """``runtime``'s latency over ``reference``'s as the median of their per-round ratios (samples
        taken side by side, so a slow phase of the machine slows both); None without both full series."""
        own, ref = self.samples.get(runtime, []), self.samples.get(reference, [])
        return paired_ratio(own, ref) if own and len(own) == len(ref) else None

    def as_dict(self) -> dict:
        out = {"model": self.model, "rows": [r.as_dict() for r in self.rows], "skipped": self.skipped}
        if self.row("onnxruntime"):
            out["paired_vs_onnxruntime"] = {r.runtime: self.paired(r.runtime, "onnxruntime") for r in self.rows}
        return out


def _torch_runtimes(model, inputs, compile_torch: bool, skipped, cuda: bool = False) -> dict:
    """PyTorch eager and torch.compile (freezing) as (callable, error, note), checked; ``cuda``: on
    the GPU (a copy of the module; each call waits for the GPU to finish)."""
    out = {}
    if model.torch_module is None:
        skipped["pytorch-eager"] = skipped["torch-compile"] = "not a PyTorch model"
        return out
    import torch
    want = model.reference(inputs)
    module = model.torch_module
    if cuda:
        if not torch.cuda.is_available():
            skipped["pytorch-eager"] = skipped["torch-compile"] = "this PyTorch has no CUDA"
            return out
        import copy
        module = copy.deepcopy(module).cuda()
    args, kwargs = model.torch_args([torch.from_numpy(a).cuda() if cuda else torch.from_numpy(a) for a in inputs])

    def runner(fn):
        def run():
            with torch.no_grad():
                got = fn(*args, **kwargs)
            if cuda:
                torch.cuda.synchronize()
            return got
        return run

    def numpy_leaves(got):
        return [o.detach().cpu().numpy() for o in torch.utils._pytree.tree_leaves(got)]
    eager = runner(module)
    if cuda:
        out["pytorch-eager"] = (eager, max_relative_error(numpy_leaves(eager()), want), torch.cuda.get_device_name())
    else:
        out["pytorch-eager"] = (eager, 0.0, f"{torch.get_num_threads()} threads")
    if not compile_torch:
        skipped["torch-compile"] = "not asked for"
        return out
    import torch._inductor.config as inductor
    try:
        inductor.freezing = True
        torch._dynamo.reset()
        t = time.perf_counter()
        compiled = runner(torch.compile(module))
        got = numpy_leaves(compiled())
        seconds = time.perf_counter() - t
        out["torch-compile"] = (compiled, max_relative_error(got, want), f"compile {seconds:.0f} s")
    except Exception as e:                  # noqa: BLE001 - Inductor can fail on a model for many reasons
        skipped["torch-compile"] = f"torch.compile failed: {' '.join(str(e).split())[:160]}"
    return out


def _onnxruntime(model, inputs, skipped) -> dict:
    from .frontends import ort_session
    try:
        proto = model.onnx_proto()
    except Exception as e:                  # noqa: BLE001 - the exporter fails on some models
        skipped["onnxruntime"] = f"ONNX export failed: {' '.join(str(e).split())[:160]}"
        return {}
    if proto is None:
        skipped["onnxruntime"] = "no ONNX form of this model"
        return {}
    sess = ort_session(proto)
    feed = {i.name: a for i, a in zip(sess.get_inputs(), inputs)}
    err = max_relative_error(sess.run(None, feed), model.reference(inputs))
    return {"onnxruntime": (lambda: sess.run(None, feed), err, f"{sess.get_session_options().intra_op_num_threads} threads")}


def _vm_runner(executable, inputs):
    """One inference of the compiled model per call, waiting for the device to finish."""
    import tvm
    vm, dev = C.virtual_machine(executable)
    args = [tvm.runtime.tensor(a, dev) for a in inputs]

    def run():
        out = vm["main"](*args)
        dev.sync()
        return out
    return run


def evaluate(model, target=None, database=None, *, library: bool = True, anchors: bool = True,
             compile_torch: bool = True, rounds: int = 5, race_rounds: int = 3, library_times: dict | None = None,
             on_stage=None) -> Evaluation:
    """Build, check and time ``model``: the table of the module docstring (adaptune rows only with a
    ``database``; PyTorch and ONNX Runtime rows only with ``anchors``).  ``race_rounds`` and
    ``library_times``: ``rounds`` and ``library_times`` of ``compile.build_best``."""
    stage = on_stage or (lambda s: None)
    target = parse_target(target)
    inputs = model.example_inputs()
    skipped: dict[str, str] = {}
    contenders = {}                     # runtime -> (callable, max error, note)
    stage("building untuned TVM")
    ex0 = C.build_untuned(model, target)
    contenders["tvm-untuned"] = (_vm_runner(ex0, inputs), C.check(ex0, model, inputs), "")
    best = None
    if database is not None:
        stage("building the tuned model several ways (generated with Winograd, with less of it and without, "
              "with records chosen with cold weights where the model outgrows the cache, library, per-chain "
              "choice, both with serial glue)")
        best = C.build_best(model, database, target, library=library, inputs=inputs, rounds=race_rounds,
                            library_times=library_times)
        gen = best.generated
        contenders["adaptune-generated"] = (_vm_runner(gen.executable, inputs), gen.error, f"{gen.name} build")
        contenders["adaptune"] = (_vm_runner(best.best.executable, inputs), best.best.error,
                                  f"{best.best.name} build; {best.best.summary(len(best.choices))}")
    else:
        skipped["adaptune-generated"] = skipped["adaptune"] = "no tuning database (--db)"
    if anchors:
        stage("preparing PyTorch eager, torch.compile and ONNX Runtime")
        cuda = is_cuda(target)
        contenders.update(_torch_runtimes(model, inputs, compile_torch, skipped, cuda))
        if cuda:
            skipped["onnxruntime"] = "ONNX Runtime runs on the CPU here; the target is the GPU"
        else:
            contenders.update(_onnxruntime(model, inputs, skipped))
    for name, (_, err, _) in contenders.items():
        if err > TOLERANCE:
            raise C.NumericsError(f"{name} output differs from the reference (max error {err:.1e})")
    samples: dict[str, list[float]] = {n: [] for n in contenders}
    with device_exclusive():
        _time_alternately(contenders, samples, rounds, stage)
    rows = [Row(n, float(np.median(samples[n])) * 1e3, float(min(samples[n])) * 1e3, err, note)
            for n, (_, err, note) in sorted(contenders.items(), key=lambda kv: RUNTIMES.index(kv[0]))]
    return Evaluation(model.name, rows, skipped, best, samples)


SAMPLES_PER_ROUND = 5  # one 0.2 s sample of each contender at a time, order reversed each time: six
                       # contenders take about a second, inside the quick and slow phases of a noisy VM


def _time_alternately(contenders, samples, rounds, stage) -> None:
    """``rounds`` rounds of ``SAMPLES_PER_ROUND`` short samples of each contender, alternated
    (``paired.sample_alternately``); the untuned model once if it is slow (it is the baseline only)."""
    def sampler(name):
        fn = contenders[name][0]
        if name != "tvm-untuned":
            return lambda: time_callable(fn, repeat=1)
        return lambda: (None if samples[name] and samples[name][0] > 0.5
                        else time_callable(fn, repeat=1, cap_s=UNTUNED_CAP_S))
    samplers = {name: sampler(name) for name in contenders}
    for r in range(rounds):
        stage(f"timing, round {r + 1} of {rounds}")
        sample_alternately(samplers, SAMPLES_PER_ROUND, samples)


def thread_settings() -> dict:
    """The thread-pool settings in force (they decide how PyTorch's and TVM's pools share cores)."""
    import torch
    return {"OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY"), "GOMP_SPINCOUNT": os.environ.get("GOMP_SPINCOUNT"),
            "TVM_THREAD_POOL_SPIN_COUNT": os.environ.get("TVM_THREAD_POOL_SPIN_COUNT"),
            "torch_threads": torch.get_num_threads(), "cores": os.cpu_count()}
