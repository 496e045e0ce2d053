"""The model commands of the CLI: ``tune``, ``compile``, ``bench``, ``report``, ``models``.

Same contract as ``tune-op``: bad input is one line and exit 2 before anything is written; every
compiled model is checked against its reference before a latency is printed.
"""
from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from pathlib import Path

from .cli import UsageError, _fail, _progress, make_measurer, run_guarded
from .library import chosen


class _Bad(Exception):
    """Bad input found while preparing a command."""


def _dims(text, what: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(x) for x in text.replace("x", ",").split(","))
    except ValueError:
        raise _Bad(f"{what} must be comma-separated integers, got {text!r}") from None
    if not dims or any(d <= 0 for d in dims):
        raise _Bad(f"{what} must be positive integers, got {text!r}")
    return dims


def _shape(text):
    return None if text is None else _dims(text, "--input-shape")


_DTYPES = ("float32", "float16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")


def _input(text: str):
    """``NAME:SHAPE:DTYPE[:LOW:HIGH]`` (SHAPE like 1,128 or 1x128) as an ``InputSpec``."""
    from .frontends import InputSpec
    parts = text.split(":")
    if len(parts) not in (3, 5) or not parts[0]:
        raise _Bad(f"--input must be NAME:SHAPE:DTYPE or NAME:SHAPE:DTYPE:LOW:HIGH, got {text!r}")
    name, shape, dtype = parts[0], _dims(parts[1], f"--input {parts[0]}: the shape"), parts[2]
    if dtype not in _DTYPES:
        raise _Bad(f"--input {name}: unknown dtype {dtype!r} (one of {', '.join(_DTYPES)})")
    if len(parts) == 3:
        return InputSpec(name, shape, dtype)
    try:
        low, high = (float(v) if dtype.startswith("float") else int(v) for v in parts[3:])
    except ValueError:
        raise _Bad(f"--input {name}: LOW and HIGH must be {'numbers' if dtype.startswith('float') else 'integers'}, "
                   f"got {parts[3]!r} and {parts[4]!r}") from None
    if not low < high or not all(map(math.isfinite, (low, high))):
        raise _Bad(f"--input {name}: the range [{parts[3]}, {parts[4]}) is empty or not finite")
    return InputSpec(name, shape, dtype, (low, high))


def _load(args):
    """(model, target) from the common arguments, or _Bad with one line."""
    from .frontends import ModelError, load_model
    from .target import TargetError, parse_target
    try:
        target = parse_target(args.target)
    except TargetError as e:
        raise _Bad(str(e)) from None
    if target.kind.name != "llvm":
        raise _Bad(f"models are measured and run on this machine's CPU; target kind {target.kind.name!r} "
                   "is not supported here")
    shape = _shape(args.input_shape)
    inputs = [_input(t) for t in args.input or ()]
    try:
        with _spinner(f"loading {args.model}"):
            return load_model(args.model, input_shape=shape, inputs=inputs), target
    except ModelError as e:
        raise _Bad(str(e)) from None


@contextlib.contextmanager
def _spinner(text: str):
    from rich.console import Console
    with Console(stderr=True).status(text):
        yield


def _ms(sec) -> str:
    return "-" if sec is None else f"{sec * 1e3:.3f} ms"


def _compile_checked(model, target, db=None, library=()):
    """Build (tuned when ``db`` is given, with ``library`` ops on PyTorch), check against the
    reference; returns (executable, error)."""
    from . import compile as C
    what = "untuned" if db is None else "tuned + library" if library else "tuned"
    with _spinner(f"compiling {what} {model.name}"):
        ex = C.build_tuned(model, db, target, library) if db is not None else C.build_untuned(model, target)
    with _spinner("checking numerics against the reference"):
        err = C.check(ex, model)
    return ex, err


def _library_plan(args, model, target, db) -> list:
    """Woodpecker's per-operator choice (empty with --no-library), shown as a table."""
    if args.no_library:
        return []
    from rich.console import Console
    from rich.table import Table

    from .library import plan_model
    with _spinner("timing PyTorch's conv/matmul kernels against the tuned ones"):
        choices = plan_model(model, db, target)
    if choices:
        table = Table(title="per-operator choice: PyTorch's kernel or ours (--no-library: ours everywhere)")
        for col in ("operator", "calls", "PyTorch", "tuned (fused)", "uses"):
            table.add_column(col, justify="left" if col in ("operator", "uses") else "right")
        for c in choices:
            table.add_row(c.op.label, str(c.calls), _ms(c.library_s), _ms(c.generated_s),
                          "PyTorch" if c.use_library else "generated")
        Console().print(table)
    return choices


def cmd_tune(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from . import compile as C
    from .compile import NumericsError
    from .database import WorkDirError
    from .scheduler import MODEL_META, check_model_work_dir, tune_model

    try:
        if args.trials <= 0:
            raise _Bad(f"--trials must be a positive number, got {args.trials}")
        if args.batch_size is not None and args.batch_size <= 0:
            raise _Bad(f"--batch-size must be positive, got {args.batch_size}")
        work_dir = Path(args.work_dir or f"runs/{Path(args.model).stem.replace(':', '_')}-{args.strategy}-"
                                         f"{time.strftime('%Y%m%d-%H%M%S')}")
        check_model_work_dir(work_dir, args.resume)
        model, target = _load(args)
        measurer = make_measurer(args, target)
    except (_Bad, WorkDirError, UsageError) as e:
        return _fail(str(e))
    console = Console()
    console.print(f"[bold]adaptune[/] tune {model.name}  strategy={args.strategy}  trials={args.trials}  "
                  f"target={target}\nwork dir: {work_dir}")
    with _progress() as progress:
        bar = progress.add_task("preparing", total=args.trials, best="")

        def on_stage(text):
            progress.update(bar, description=text)

        def on_progress(done, total, task, est):
            progress.update(bar, completed=done, description=f"tuning {task[:28]}",
                            best=f"model kernels ~{est * 1e3:.3f} ms")
        result, code = run_guarded(console, work_dir, f"adaptune tune {args.model} --work-dir {work_dir} --resume",
                                   lambda: tune_model(model, target, trials=args.trials, strategy=args.strategy,
                                                      work_dir=work_dir, resume=args.resume, seed=args.seed,
                                                      batch_size=args.batch_size, measurer=measurer,
                                                      on_progress=on_progress, on_stage=on_stage))
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
        db = C.open_database(work_dir)
        ex0, _ = _compile_checked(model, target)
        ex1, err = _compile_checked(model, target, db)
        choices = _library_plan(args, model, target, db)
        lib_ops = chosen(choices)
        ex2, err2 = _compile_checked(model, target, db, lib_ops) if lib_ops else (None, None)
    except NumericsError as e:
        return _fail(f"tuned model fails the numerical check: {e}", 1)
    x = model.example_inputs()
    with _spinner("timing untuned and tuned models"):
        t0, t1 = C.time_vm(ex0, x), C.time_vm(ex1, x)
        t2 = C.time_vm(ex2, x) if ex2 is not None else None
    meta_path = work_dir / MODEL_META
    meta = json.loads(meta_path.read_text())
    meta["compiled"] = {"untuned_s": t0, "tuned_s": t1, "max_rel_error": err, "with_library_s": t2}
    meta["library"] = [c.as_dict() for c in choices]
    meta_path.write_text(json.dumps(meta, indent=1))
    console.print(f"numerics vs {'PyTorch' if model.torch_module is not None else 'reference'}: PASS "
                  f"(max error {max(err, err2 or 0):.1e} of output scale)")
    console.print(f"[bold]{model.name}: untuned TVM {_ms(t0)}  ->  tuned {_ms(t1)}   speedup {t0 / t1:.1f}x[/]")
    if t2 is not None:
        console.print(f"[bold]with PyTorch's kernel for {len(lib_ops)} of {len(choices)} conv/matmul signatures: "
                      f"{_ms(t2)}   speedup {t0 / t2:.1f}x[/]")
    console.print(f"next: adaptune bench {args.model} --db {work_dir}   |   adaptune report {work_dir}")
    return 0


def cmd_compile(args) -> int:
    from . import compile as C
    from .compile import NumericsError
    try:
        model, target = _load(args)
        out = Path(args.output)
        if not out.parent.is_dir():
            raise _Bad(f"output folder {out.parent} does not exist")
        db = C.open_database(args.db)
        lib_ops = chosen(_library_plan(args, model, target, db))
        ex, err = _compile_checked(model, target, db, lib_ops)
    except (_Bad, FileNotFoundError) as e:
        return _fail(str(e))
    except NumericsError as e:
        return _fail(f"compiled model fails the numerical check, nothing written: {e}", 1)
    C.export(ex, out)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB); numerics PASS (max error {err:.1e}); "
          f"{len(lib_ops)} conv/matmul signatures on PyTorch's kernel. Load with "
          "tvm.relax.VirtualMachine(adaptune.compile.load(path), tvm.cpu())")
    return 0


def cmd_bench(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from . import compile as C
    from .compile import NumericsError
    from .frontends import ort_session
    try:
        model, target = _load(args)
        db = C.open_database(args.db) if args.db else None
    except (_Bad, FileNotFoundError) as e:
        return _fail(str(e))
    x = model.example_inputs()
    rows = []          # (name, seconds or None, note)
    try:
        ex0, e0 = _compile_checked(model, target)
        with _spinner("timing untuned TVM"):
            rows.append(("TVM untuned", C.time_vm(ex0, x), f"max err {e0:.1e}"))
        if db is not None:
            ex1, e1 = _compile_checked(model, target, db)
            with _spinner("timing tuned TVM"):
                rows.append(("TVM tuned (adaptune)", C.time_vm(ex1, x), f"max err {e1:.1e}"))
            choices = _library_plan(args, model, target, db)
            if choices:
                lib_ops = chosen(choices)
                ex2, e2 = _compile_checked(model, target, db, lib_ops)
                with _spinner("timing tuned TVM with library choice"):
                    rows.append(("TVM tuned + library choice", C.time_vm(ex2, x),
                                 f"max err {e2:.1e}; {len(lib_ops)}/{len(choices)} on PyTorch"))
                _save_library(args.db, choices)
    except NumericsError as e:
        return _fail(f"numerical check failed: {e}", 1)
    if model.torch_module is not None:
        import torch
        args_t = [torch.from_numpy(a) for a in x]

        def eager():
            with torch.no_grad():
                model.torch_module(*args_t)
        with _spinner("timing PyTorch eager"):
            rows.append(("PyTorch eager", C.time_callable(eager), f"{torch.get_num_threads()} threads"))
    else:
        rows.append(("PyTorch eager", None, "not a PyTorch model"))
    with _spinner("exporting to ONNX and timing ONNX Runtime"):
        proto = model.onnx_proto()
        if proto is None:
            rows.append(("ONNX Runtime", None, "no ONNX form of this model"))
        else:
            sess = ort_session(proto)
            feed = {i.name: a for i, a in zip(sess.get_inputs(), x)}
            import numpy as np
            got, want = sess.run(None, feed)[0], model.reference(x)[0]
            scale = max(float(np.abs(want).max()), 1e-6)
            err = float(np.abs(got - want).max()) / scale
            if err > 1e-3:
                return _fail(f"ONNX Runtime output differs from the reference (max error {err:.1e})", 1)
            rows.append(("ONNX Runtime", C.time_callable(lambda: sess.run(None, feed)), f"max err {err:.1e}"))
    base = next((s for n, s, _ in rows if n == "PyTorch eager" and s), None) or rows[0][1]
    base_name = "PyTorch eager" if model.torch_module is not None else "TVM untuned"
    table = Table(title=f"{model.name}, input {' '.join(str(list(s)) for _, s, _ in model.inputs)}, "
                        "median latency (outputs checked first)")
    for col in ("runtime", "latency", f"speedup vs {base_name}", "note"):
        table.add_column(col, justify="left" if col in ("runtime", "note") else "right")
    for name, sec, note in rows:
        table.add_row(name, _ms(sec), f"{base / sec:.2f}x" if sec else "-", note)
    Console().print(table)
    return 0


def _save_library(work_dir, choices) -> None:
    """Keep the per-operator choice in the work dir's model.json for ``report``."""
    from .scheduler import MODEL_META
    path = Path(work_dir) / MODEL_META
    if path.is_file():
        meta = json.loads(path.read_text())
        meta["library"] = [c.as_dict() for c in choices]
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(meta, indent=1))
        tmp.replace(path)


def cmd_report(args) -> int:
    from .report import write_report
    try:
        with _spinner("writing report"):
            path = write_report(args.work_dir, args.output)
    except FileNotFoundError as e:
        return _fail(str(e))
    print(f"wrote {path}")
    return 0


def cmd_models(_args) -> int:
    from .zoo import MODELS
    for name, (ctor, shape) in MODELS.items():
        print(f"{name:12s} input {list(shape)}  {(ctor.__doc__ or ctor.__name__).splitlines()[0]}")
    return 0
