"""The model commands of the CLI: ``tune``, ``compile``, ``bench``, ``report``, ``models``.

Same contract as ``tune-op``: bad input is one line and exit 2 before anything is written; every
compiled model is checked against its reference before a latency is printed.
"""
from __future__ import annotations

import contextlib
import math
import sys
import time
from pathlib import Path

from .common import UsageError, fail, make_measurer, progress_bar, run_guarded, stopped_message


def _dims(text, what: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(x) for x in text.replace("x", ",").split(","))
    except ValueError:
        raise UsageError(f"{what} must be comma-separated integers, got {text!r}") from None
    if not dims or any(d <= 0 for d in dims):
        raise UsageError(f"{what} must be positive integers, got {text!r}")
    return dims


def _shape(text):
    return None if text is None else _dims(text, "--input-shape")


_DTYPES = ("float32", "float16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")


def _input(text: str):
    """``NAME:SHAPE:DTYPE[:LOW:HIGH]`` (SHAPE like 1,128 or 1x128) as an ``InputSpec``."""
    from ..model.frontends import InputSpec
    parts = text.split(":")
    if len(parts) not in (3, 5) or not parts[0]:
        raise UsageError(f"--input must be NAME:SHAPE:DTYPE or NAME:SHAPE:DTYPE:LOW:HIGH, got {text!r}")
    name, shape, dtype = parts[0], _dims(parts[1], f"--input {parts[0]}: the shape"), parts[2]
    if dtype not in _DTYPES:
        raise UsageError(f"--input {name}: unknown dtype {dtype!r} (one of {', '.join(_DTYPES)})")
    if len(parts) == 3:
        return InputSpec(name, shape, dtype)
    try:
        low, high = (float(v) if dtype.startswith("float") else int(v) for v in parts[3:])
    except ValueError:
        kind = "numbers" if dtype.startswith("float") else "integers"
        raise UsageError(f"--input {name}: LOW and HIGH must be {kind}, got {parts[3]!r} and {parts[4]!r}") from None
    if not low < high or not all(map(math.isfinite, (low, high))):
        raise UsageError(f"--input {name}: the range [{parts[3]}, {parts[4]}) is empty or not finite")
    return InputSpec(name, shape, dtype, (low, high))


def _load(args):
    """(model, target) from the common arguments, or ``UsageError`` with one line."""
    from ..model.frontends import ModelError, load_model
    from ..measure.target import TargetError, check_runnable, parse_target
    try:
        target = parse_target(args.target)
    except TargetError as e:
        raise UsageError(str(e)) from None
    if target.kind.name not in ("llvm", "cuda"):
        raise UsageError(f"models run on a CPU (llvm) or an NVIDIA GPU (cuda); target kind {target.kind.name!r} "
                         "is not supported")
    try:
        check_runnable(target)          # cuda without a visible GPU: one line, exit 2
    except TargetError as e:
        raise UsageError(str(e)) from None
    shape = _shape(args.input_shape)
    inputs = [_input(t) for t in args.input or ()]
    try:
        with _spinner(f"loading {args.model}"):
            return load_model(args.model, input_shape=shape, inputs=inputs), target
    except ModelError as e:
        raise UsageError(str(e)) from None


@contextlib.contextmanager
def _spinner(text: str):
    from rich.console import Console
    with Console(stderr=True).status(text) as status:
        yield status


def _ms(sec) -> str:
    return "-" if sec is None else f"{sec * 1e3:.3f} ms"


def _choice_table(best, gpu: bool = False, console=None) -> None:
    """The per-chain choice (the library's fused call or our kernel) and the whole-model builds behind
    it, printed on ``console`` (a new one if none)."""
    from rich.console import Console
    from rich.table import Table
    console = console or Console()
    if best.choices:
        vendors = "cuDNN / cuBLAS" if gpu else "oneDNN"
        table = Table(title=f"per chain: the library's fused call ({vendors}; PyTorch for batched matmuls, softmax "
                            "and layer norm), Winograd (our transforms + oneDNN's or our tuned GEMM) or our tuned "
                            "kernel (--no-library: ours everywhere)")
        for col in ("chain", "calls", "library", "Winograd", "Winograd (gen.)", "F(2x2) (gen.)", "tuned (fused)",
                    "fastest"):
            table.add_column(col, justify="left" if col in ("chain", "fastest") else "right")
        for c in best.choices:
            fastest = {"onednn": c.op.vendor(gpu), "winograd": "Winograd", "winograd-generated": "Winograd (gen.)",
                       "winograd-generated-f2": "F(2x2) (gen.)"}.get(c.impl, c.impl)
            table.add_row(c.op.label, str(c.calls), _ms(c.library_s), _ms(c.winograd_s), _ms(c.winograd_generated_s),
                          _ms(c.winograd2_generated_s), _ms(c.generated_s) if c.own_kernel else "in a larger kernel",
                          fastest)
        console.print(table)
    console.print("whole model: " + ", ".join(f"{b.name} {_ms(b.seconds)}" for b in best.builds) +
                  f"  ->  keeps the {best.best.name} build")


def _build_best(args, model, target, db):
    from ..measure.target import is_cuda
    from ..model.compile import build_best
    with _spinner("building and timing the tuned model (all generated, all library, per-chain choice, serial glue)"):
        best = build_best(model, db, target, library=not args.no_library, rounds=args.rounds)
    _choice_table(best, is_cuda(target))
    return best


class _Phases:
    """Wall time per phase of a run, so the user sees what each costs (the untuned baseline of a
    transformer once took most of a run)."""

    def __init__(self):
        self.done: dict[str, float] = {}
        self.current, self.since = None, time.perf_counter()

    def start(self, text: str | None) -> None:
        now = time.perf_counter()
        if self.current is not None:
            key = self.current.split(" (")[0] if not self.current.startswith("tuning") else "tuning"
            self.done[key] = self.done.get(key, 0.0) + now - self.since
        self.current, self.since = text, now

    def __str__(self) -> str:
        return " · ".join(f"{k} {v:.0f} s" for k, v in self.done.items())


def cmd_tune(args) -> int:
    from ..measure.workdir import WorkDir, WorkDirBusy, WorkDirError
    try:
        work_dir = Path(args.work_dir or f"runs/{Path(args.model).stem.replace(':', '_')}-{args.strategy}-"
                                         f"{time.strftime('%Y%m%d-%H%M%S')}")
        WorkDir(work_dir).check_model(args.resume)
        model, target = _load(args)
        measurer = make_measurer(args, target)
    except (WorkDirError, UsageError) as e:
        return fail(str(e))
    with contextlib.ExitStack() as held:      # tuning and the compiled model's summary: one writer
        try:
            held.enter_context(WorkDir(work_dir).lock())
        except WorkDirBusy as e:
            return fail(str(e))
        except OSError as e:
            return fail(stopped_message(e, work_dir), 1)
        return _tune(args, model, target, measurer, work_dir)


def _tune(args, model, target, measurer, work_dir: Path) -> int:
    """``tune`` once its input is checked: tune, then build, check and time the model (``evaluate``)."""
    from ..measure.target import is_cuda
    from rich.console import Console
    from rich.table import Table

    from ..measure.workdir import WorkDir
    from ..model import compile as C
    from ..model.compile import NumericsError
    from ..model.evaluate import evaluate
    from ..scheduler import tune_model

    console = Console()
    phases = _Phases()
    console.print(f"[bold]adaptune[/] tune {model.name}  strategy={args.strategy}  trials={args.trials}  "
                  f"target={target}\nwork dir: {work_dir}")
    with progress_bar() as progress:
        bar = progress.add_task("preparing", total=args.trials, best="")

        def on_stage(text):
            phases.start(text)
            progress.update(bar, description=text)

        def on_progress(done, total, task, est):
            progress.update(bar, completed=done, description=f"tuning {task[:28]}",
                            best=f"model kernels ~{est * 1e3:.3f} ms")
        result, code = run_guarded(console, work_dir, f"adaptune tune {args.model} --work-dir {work_dir} --resume",
                                   lambda: tune_model(model, target, trials=args.trials, strategy=args.strategy,
                                                      work_dir=work_dir, resume=args.resume, seed=args.seed,
                                                      batch_size=args.batch_size, measurer=measurer,
                                                      spaces=args.spaces, on_progress=on_progress,
                                                      on_stage=on_stage))
        if result is None:
            return code
    p = result.passes
    console.print(f"graph: {p['ops_before']} ops -> {p['ops_after']} after folding "
                  f"({', '.join(f'{k} {v}' for k, v in p['before'].items() if k not in p['after'])} removed) "
                  f"-> {p['kernel_calls']} fused kernels, {p['tasks']} distinct tasks")
    table = Table(title=f"{model.name}: {result.trials} trials ({result.new_trials} in this run), "
                        f"{result.wall_time:.0f} s")
    for col in ("task", "weight", "trials", "untuned", "tuned", "speedup"):
        table.add_column(col, justify="left" if col == "task" else "right")
    for t in result.tasks:
        sp = f"{t.baseline / t.current:.1f}x" if t.baseline and t.current else "-"
        table.add_row(t.name, str(t.weight), str(t.trials), _ms(t.baseline), _ms(t.current), sp)
    console.print(table)
    if not any(t.best for t in result.tasks):
        print("adaptune: error: no candidate could be measured; see the log in the work dir", file=sys.stderr)
        return 1
    try:
        with _spinner("building untuned TVM") as status:
            def stage(text):
                phases.start(text)
                status.update(text)
            ev = evaluate(model, target, C.open_database(work_dir), library=not args.no_library, anchors=False,
                          rounds=1, library_times=result.library_times, on_stage=stage)
    except NumericsError as e:
        return fail(f"tuned model fails the numerical check: {e}", 1)
    phases.start(None)
    best = ev.best
    _choice_table(best, is_cuda(target))
    gen = best.generated
    t0 = ev.row("tvm-untuned").latency_ms / 1e3
    WorkDir(work_dir).update_model(
        compiled={"untuned_s": t0, "tuned_s": gen.seconds, "max_rel_error": best.best.error,
                  "final_s": best.best.seconds, "final_build": best.best.name},
        library=[c.as_dict() for c in best.choices])
    console.print(f"numerics vs {'PyTorch' if model.torch_module is not None else 'reference'}: PASS "
                  f"(max error {max(b.error for b in best.builds):.1e} of output scale)")
    console.print(f"[bold]{model.name}: untuned TVM {_ms(t0)}  ->  tuned {_ms(gen.seconds)}   "
                  f"speedup {t0 / gen.seconds:.1f}x[/]")
    if best.best.name != "generated":
        console.print(f"[bold]with {best.best.summary(len(best.choices))}: "
                      f"{_ms(best.best.seconds)}   speedup {t0 / best.best.seconds:.1f}x[/]")
    console.print(f"time per phase: {phases}")
    console.print(f"next: adaptune bench {args.model} --db {work_dir}   |   adaptune report {work_dir}")
    return 0


def cmd_compile(args) -> int:
    from ..measure.target import is_cuda
    from ..model import compile as C
    from ..model.compile import NumericsError
    try:
        model, target = _load(args)
        out = Path(args.output)
        if not out.parent.is_dir():
            raise UsageError(f"output folder {out.parent} does not exist")
        db = C.open_database(args.db)
        best = _build_best(args, model, target, db)
    except (UsageError, FileNotFoundError) as e:
        return fail(str(e))
    except NumericsError as e:
        return fail(f"compiled model fails the numerical check, nothing written: {e}", 1)
    C.export(best.best.executable, out)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB); numerics PASS (max error {best.best.error:.1e}); "
          f"{best.best.summary()}. Load with "
          f"tvm.relax.VirtualMachine(adaptune.model.compile.load(path), {'tvm.cuda()' if is_cuda(target) else 'tvm.cpu()'})")
    return 0


def cmd_bench(args) -> int:
    from ..measure.target import is_cuda
    from rich.console import Console
    from rich.table import Table

    from ..model import compile as C
    from ..model.compile import NumericsError
    from ..measure.workdir import WorkDir, WorkDirBusy, write_json
    from ..model.evaluate import evaluate
    try:
        if args.json is not None and not Path(args.json).resolve().parent.is_dir():
            raise UsageError(f"--json: folder {Path(args.json).parent} does not exist")
        model, target = _load(args)
        db = C.open_database(args.db) if args.db else None
    except (UsageError, FileNotFoundError) as e:
        return fail(str(e))
    console = Console()
    if not console.is_terminal:     # into a file or a pipe: wide enough that kernel names and shapes are not cut
        console.width = max(console.width, 150)
    try:
        with _spinner("preparing") as status:
            ev = evaluate(model, target, db, library=not args.no_library, rounds=args.rounds,
                          race_rounds=min(3, args.rounds), on_stage=lambda text: status.update(text))
    except NumericsError as e:
        return fail(f"numerical check failed: {e}", 1)
    if ev.best is not None:
        _choice_table(ev.best, is_cuda(target), console)
        if args.db:     # the per-chain choice, for ``report``
            try:
                WorkDir(args.db).update_model(library=[c.as_dict() for c in ev.best.choices])
            except WorkDirBusy as e:
                print(f"adaptune: warning: the per-chain choice is not saved to {args.db}: {e}", file=sys.stderr)
    base = ev.row("pytorch-eager") or ev.rows[0]
    table = Table(title=f"{model.name}, input {' '.join(str(list(s)) for _, s, _ in model.inputs)}: "
                        f"latency over {args.rounds} rounds of interleaved samples (outputs checked first)")
    ort = ev.row("onnxruntime")
    for col in ("runtime", "median", "min", f"vs {base.runtime}", *(["/ onnxruntime, paired"] if ort else []),
                "max error", "note"):
        table.add_column(col, justify="left" if col in ("runtime", "note") else "right")
    for r in ev.rows:
        paired = ev.paired(r.runtime, "onnxruntime")
        table.add_row(r.runtime, f"{r.latency_ms:.3f} ms", f"{r.min_ms:.3f} ms", f"{base.latency_ms / r.latency_ms:.2f}x",
                      *([f"{paired:.3f}x" if paired else "-"] if ort else []),
                      "-" if r.max_error is None else f"{r.max_error:.1e}", r.note)
    console.print(table)
    for runtime, why in ev.skipped.items():
        console.print(f"no {runtime} row: {why}")
    if args.profile and ev.best is not None:
        _profile_table(console, ev.best.best, model, target)
    if args.json:
        write_json(args.json, ev.as_dict())
        console.print(f"wrote {args.json}")
    return 0


def _shapes(shapes: list[tuple[int, ...]]) -> str:
    """A call's tensor shapes as ``first input -> output`` (``1x14x14x256 -> 1x14x14x1024``): which
    layer a kernel is, where its name (``fused_conv2d11_add10...``) does not say."""
    dims = ["x".join(map(str, s)) or "scalar" for s in shapes]
    return "" if not dims else dims[0] if len(dims) == 1 else f"{dims[0]} -> {dims[-1]}"


def _profile_table(console, build, model, target) -> None:
    """``--profile``: time per kernel of the final model, grouped (tuned, library, layout, glue), as
    the model runs it and with each call's data hot (``timing.profile``), each generated kernel's
    GFLOP/s hot, and on a CPU the FMA peak measured now, so the time of the model's arithmetic at that
    peak (its floor) stands beside the kernels' own; on ``cmd_bench``'s console."""
    from rich.table import Table

    from ..measure.target import is_cuda
    from ..model.timing import fma_peak_gflops, profile
    rows = profile(build.executable, model.example_inputs(), flops=build.flops)
    total = sum(r["ms"] for r in rows) or 1.0
    hot = sum(r["hot_ms"] for r in rows)
    groups: dict[str, list[float]] = {}
    for r in rows:
        g = groups.setdefault(r["group"], [0.0, 0.0])
        g[0], g[1] = g[0] + r["ms"], g[1] + r["hot_ms"]
    rate = lambda flops, ms: f"{flops / ms / 1e6:.0f}" if flops and ms > 0 else "-"     # noqa: E731
    table = Table(title=f"where adaptune's model spends its time: {total:.3f} ms in VM calls per inference, "
                        f"{hot:.3f} ms with each call's data hot")
    for i, col in enumerate(("call", "shapes (input -> output)", "group", "calls", "ms", "hot ms", "GFLOP/s hot", "share")):
        table.add_column(col, justify="left" if i < 3 else "right")
    for g, (ms, hot_ms) in sorted(groups.items(), key=lambda kv: -kv[1][0]):
        table.add_row(f"[bold]{g}[/]", "", "", "", f"{ms:.3f}", f"{hot_ms:.3f}", "", f"{100 * ms / total:.1f}%")
    for r in rows[:25]:
        table.add_row(r["call"].removesuffix("_prepacked"), _shapes(r["shapes"]), r["group"], str(r["calls"]),
                      f"{r['ms']:.3f}", f"{r['hot_ms']:.3f}", rate(r["flops"], r["hot_ms"]), f"{100 * r['ms'] / total:.1f}%")
    console.print(table)
    clocked = sum(r["ms"] for r in rows if r["clock"] == "regions")
    console.print(f"waiting for data (in the model minus hot): {total - hot:.3f} ms; {clocked:.3f} ms of the calls "
                  "timed by the OpenMP launcher's clock of their parallel regions, the rest (library calls, "
                  "serial kernels, the VM's builtins) by instrumentation callbacks, which add their overhead")
    counted = [r for r in rows if r["flops"]]
    flops, counted_hot = sum(r["flops"] for r in counted), sum(r["hot_ms"] for r in counted)
    if not flops:
        return
    line = (f"arithmetic of the generated kernels: {flops / 1e9:.3f} GFLOP per inference, {counted_hot:.3f} ms hot "
            f"({rate(flops, counted_hot)} GFLOP/s)")
    if not is_cuda(target):
        peak = fma_peak_gflops(target)
        line += (f"; this CPU's FMA peak, measured now: {peak:.0f} GFLOP/s, at which that arithmetic takes "
                 f"{flops / peak / 1e6:.3f} ms (the kernels run at {100 * flops / peak / 1e6 / counted_hot:.0f}% of it)")
    console.print(line)


def cmd_report(args) -> int:
    from ..model.report import write_report
    try:
        with _spinner("writing report"):
            path = write_report(args.work_dir, args.output)
    except FileNotFoundError as e:
        return fail(str(e))
    print(f"wrote {path}")
    return 0


def cmd_models(_args) -> int:
    from ..model.zoo import MODELS
    for name, (ctor, shape) in MODELS.items():
        given = (", ".join(f"{n} {d}{list(s)}" for n, (s, d) in shape.items()) if isinstance(shape, dict)
                 else f"float32{list(shape)}")
        print(f"{name:12s} input {given}  {(ctor.__doc__ or ctor.__name__).splitlines()[0]}")
    return 0
