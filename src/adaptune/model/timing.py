"""Timing a compiled model or any callable the way TVM's evaluator does (median of repeats after a
warm-up), profiling a model per VM call, and the arithmetic that a profile's times are set against
(each kernel's floating-point operations, the CPU's FMA peak)."""
from __future__ import annotations

import contextlib
import os
import time

import numpy as np
import tvm
from tvm import relax

UNTUNED_CAP_S = 5.0     # the untuned baseline is timed once where its repeats would take longer


@contextlib.contextmanager
def device_exclusive():
    """Hold the device lock of ``ADAPTUNE_DEVICE_LOCK`` (see ``measure.run.Measurer``), where one is
    set, while a model is timed: tuning processes sharing the device then measure nothing meanwhile."""
    path = os.environ.get("ADAPTUNE_DEVICE_LOCK")
    if not path:
        yield
        return
    from ..measure.run import DeviceLock
    lock = DeviceLock(path)
    try:
        with lock:
            yield
    finally:
        lock.close()


def vm_device(executable) -> "tvm.runtime.Device":
    """Where a compiled model runs: the GPU when it holds CUDA kernels, else the CPU."""
    def kinds(m):
        yield m.kind
        for sub in m.imports:
            yield from kinds(sub)
    mod = executable.mod if hasattr(executable, "mod") else executable
    return tvm.cuda(0) if "cuda" in set(kinds(mod)) else tvm.cpu()


def virtual_machine(executable):
    """(Relax VM, device) for running ``executable``; on the CPU its parallel loops run on the OpenMP
    pool PyTorch's library calls use (``openmp.load_shared``)."""
    dev = vm_device(executable)
    if str(dev) == str(tvm.cpu()) and isinstance(executable, relax.VMExecutable):
        from .openmp import load_shared
        executable = load_shared(executable)
    return relax.VirtualMachine(executable, dev), dev


def time_vm(executable, inputs, *, repeat: int = 10, min_repeat_ms: int = 200, cap_s: float | None = None) -> float:
    """Median seconds per inference (TVM's time_evaluator, after a warm-up).  ``cap_s``: when the
    repeats would take longer, the timed warm-up run is the answer (an untuned BERT takes ~25 s)."""
    vm, dev = virtual_machine(executable)
    args = [tvm.runtime.tensor(a, dev) for a in inputs]
    t = time.perf_counter()
    vm["main"](*args)
    dev.sync()
    one = time.perf_counter() - t
    if cap_s is not None and one * repeat > cap_s:
        return one
    res = vm.time_evaluator("main", dev, number=1, repeat=repeat, min_repeat_ms=min_repeat_ms)(*args)
    return float(np.median(res.results))


def time_callable(fn, *, repeat: int = 10, min_repeat_ms: int = 200, cap_s: float | None = None) -> float:
    """Median seconds per call of ``fn`` in the same style as TVM's evaluator (for PyTorch / ORT);
    ``cap_s`` as in ``time_vm``."""
    fn()
    t = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t, 1e-6)
    if cap_s is not None and one * repeat > cap_s:
        return one
    number = max(1, int(min_repeat_ms / 1e3 / one))
    samples = []
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - t) / number)
    return float(np.median(samples))


def _kind(symbol: str) -> str:
    """Which group a VM call belongs to in ``profile``."""
    if symbol.startswith(("adaptune.onednn", "adaptune.torch")):
        return "library calls"
    if any(k in symbol for k in ("transpose", "permute_dims", "layout_transform")):
        return "layout transforms"
    if symbol.startswith("vm.") or "reshape" in symbol or symbol.startswith("relax."):
        return "other glue"
    return "tuned kernels"


def kernel_flops(mod) -> dict[str, float]:
    """Floating-point operations per call of each TIR function of a lowered model, by name (TVM's
    ``estimate_tir_flops``: what its loop nests compute, padding and transforms included), so that a
    profile can say how near each kernel runs to the machine's peak."""
    from tvm import s_tir
    return {gv.name_hint: float(s_tir.analysis.estimate_tir_flops(tvm.IRModule({"main": f})))
            for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}


def fma_peak_gflops(target, seconds: float = 0.2, lanes: int | None = None, best_of: int = 1) -> float:
    """The FMA peak of this CPU on every core TVM uses, GFLOP/s: per thread, independent vector
    accumulators (the register file less a few) updated by fused multiply-adds, nothing loaded in
    the loop; vectors of ``lanes`` float32 (the target's full width by default), the best of
    ``best_of`` measurements of the one kernel."""
    from tvm.script import tirx as T

    from ..search.expert import vector_isa
    full, regs = vector_isa(target)
    lanes = lanes or full
    threads = tvm.get_global_func("runtime.NumThreads")()
    acc_n, steps = regs - 8, 1 << 18

    @T.prim_func
    def fma(x: T.Buffer((threads, acc_n, lanes), "float32"), y: T.Buffer((2,), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        for p in T.parallel(threads):
            acc = T.alloc_buffer((acc_n, lanes), "float32", scope="local")
            for j in T.unroll(acc_n):
                for v in T.vectorized(lanes):
                    acc[j, v] = x[p, j, v]
            for _ in range(steps):
                for j in T.unroll(acc_n):
                    for v in T.vectorized(lanes):
                        acc[j, v] = acc[j, v] * y[0] + y[1]
            for j in T.unroll(acc_n):
                for v in T.vectorized(lanes):
                    x[p, j, v] = acc[j, v]

    f = tvm.compile(tvm.IRModule({"main": fma}), target=target)["main"]
    x = tvm.runtime.tensor(np.ones((threads, acc_n, lanes), "float32"))
    y = tvm.runtime.tensor(np.array([0.999, 0.001], "float32"))
    t = min(time_callable(lambda: f(x, y), repeat=7, min_repeat_ms=int(seconds * 1e3)) for _ in range(best_of))
    return 2.0 * threads * acc_n * lanes * steps / t / 1e9


_best_peaks: dict[tuple[str, int | None], float] = {}


def best_fma_peak_gflops(target, lanes: int | None = None) -> float:
    """``fma_peak_gflops`` as the best of five short measurements, once per target, width and
    process: what a slow phase of the host must not lower (the tuner's floor, the padding width)."""
    key = (str(target), lanes)
    if key not in _best_peaks:
        _best_peaks[key] = fma_peak_gflops(target, seconds=0.02, lanes=lanes, best_of=5)
    return _best_peaks[key]


def profile(executable, inputs, *, runs: int = 20, flops: dict | None = None) -> list[dict]:
    """Time per VM call of one inference (Relax VM instrumentation), grouped: each call of a function
    in the inference (its first, second, ... call) is timed in ``runs`` runs and counts with its
    median, so that a run the host interrupts moves no row (a mean put such spikes, on a noisy VM, on
    whichever short kernel they hit).

    Returns rows ``{"call", "group", "calls", "ms", "hot_ms", "shapes", "flops", "clock"}`` sorted by
    time; ``shapes`` are those of the call's tensor arguments at its first call (outputs last, as the
    VM passes them).  ``ms`` is the call as the model runs it; ``hot_ms`` is the same call run once
    more just before it is timed, so that its weights and inputs are in cache.  The two kinds of
    runs alternate.  Where ``ms`` is far above ``hot_ms``, the kernel waits for its data (weights
    that do not stay cached between inferences, inputs the previous kernel left in the other core's
    cache); where they agree, the kernel's own speed sets the time.  The VM's builtins (allocation,
    reshapes) are timed but never run twice.  ``flops``: each function's operations per call
    (``kernel_flops``); a row's ``flops`` is its calls' per inference, None for a call not in it.

    A kernel whose parallel loops run on adaptune's OpenMP launcher is timed by the launcher's own
    clock (``clock`` "regions": its parallel regions, no Python between the calls and no serial code
    outside them); every other call (library calls, serial kernels, builtins, a GPU's kernels) from
    the instrumentation's callbacks (``clock`` "callback", which adds their overhead)."""
    from .openmp import region_clock
    vm, dev = virtual_machine(executable)
    args = [tvm.runtime.tensor(a, dev) for a in inputs]
    gpu = str(dev) != str(tvm.cpu())
    clock = None if gpu else region_clock()
    samples: dict[tuple[str, int], dict[bool, list[float]]] = {}     # (function, its k-th call) -> times
    regioned: set[str] = set()
    nth: dict[str, int] = {}            # calls of each function so far in this run
    shapes: dict[str, list[tuple[int, ...]]] = {}
    started: dict[str, tuple[float, int]] = {}
    hot = [False]

    def instrument(func, symbol, before, ret, *call_args):
        if before:
            shapes.setdefault(symbol, [tuple(int(d) for d in a.shape) for a in call_args
                                       if isinstance(a, tvm.runtime.Tensor)])
            if hot[0] and not symbol.startswith("vm."):
                func(*call_args)
                if gpu:
                    dev.sync()
            started[symbol] = (time.perf_counter(), clock.count() if clock else 0)
        else:
            if gpu:
                dev.sync()              # a GPU kernel's launch returns at once: wait for it to finish
            t0, r0 = started.pop(symbol)
            seconds = time.perf_counter() - t0
            r1 = clock.count() if clock else 0
            if r1 > r0:                 # its parallel regions, as the launcher clocked them
                seconds = clock.seconds(r0, r1)
                regioned.add(symbol)
            k = nth[symbol] = nth.get(symbol, -1) + 1
            samples.setdefault((symbol, k), {False: [], True: []})[hot[0]].append(seconds)

    vm["main"](*args)
    vm.set_instrument(instrument)
    try:
        for i in range(2 * runs):
            hot[0] = bool(i % 2)
            nth.clear()
            if clock:
                clock.start()
            vm["main"](*args)
    finally:
        vm.set_instrument(None)
        if clock:
            clock.stop()
    per_call: dict[str, list[tuple[float, float]]] = {}
    for (symbol, _), v in samples.items():
        per_call.setdefault(symbol, []).append((float(np.median(v[False])), float(np.median(v[True]))))
    rows = [{"call": k, "group": _kind(k), "calls": len(v), "ms": sum(m for m, _ in v) * 1e3,
             "hot_ms": sum(h for _, h in v) * 1e3, "shapes": shapes.get(k, []),
             "flops": flops[k] * len(v) if flops and k in flops else None,
             "clock": "regions" if k in regioned else "callback"} for k, v in per_call.items()]
    return sorted(rows, key=lambda r: -r["ms"])
