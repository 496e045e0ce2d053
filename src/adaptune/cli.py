"""The ``adaptune`` command line: a thin layer over the library API.

Bad input gets one line on stderr and exit code 2, before anything is written; an interrupted run
keeps every measured record and says how to resume.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

EXIT_BAD_INPUT = 2


class UsageError(Exception):
    """Input we refuse, reported as one line."""


def _fail(msg: str, code: int = EXIT_BAD_INPUT) -> int:
    msg = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(msg))   # one line, whatever was typed
    print(f"adaptune: error: {msg}", file=sys.stderr)
    return code


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse would print the usage too)
        raise UsageError(message)


def _tuning_args(p, trials: int, what: str) -> None:
    """The options tune-op and tune share."""
    from .strategies import STRATEGIES
    p.add_argument("--trials", type=int, default=trials,
                   help=f"measurement budget of the work dir, for the whole {what} (default {trials})")
    p.add_argument("--strategy", default="chameleon", choices=sorted(STRATEGIES),
                   help="search strategy (default chameleon = rl+as; sa is AutoTVM's baseline)")
    p.add_argument("--work-dir", default=None, help=f"where records go (default: runs/<{what}>-<strategy>-<time>)")
    p.add_argument("--resume", action="store_true", help="continue the records in --work-dir")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=None, help="configs measured per iteration (per task)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds allowed per build and per run")
    _rpc_args(p)


def run_guarded(console, work_dir, resume_hint: str, fn):
    """Run a tuning call; interruption, a lost device or a full disk become one line and an exit
    code (records stay on disk).  Returns (result, None) or (None, exit code)."""
    from .database import WorkDirError
    from .measure import RPCError
    try:
        return fn(), None
    except WorkDirError as e:
        return None, _fail(str(e))
    except KeyboardInterrupt:
        console.print(f"[yellow]interrupted[/]: measured records are saved in {work_dir}; continue with: {resume_hint}")
        return None, 130
    except (OSError, RPCError) as e:
        return None, _fail(stopped_message(e, work_dir), 1)


def _rpc_args(p) -> None:
    p.add_argument("--rpc", default=None, metavar="HOST:PORT",
                   help="measure on devices behind this TVM RPC tracker instead of locally")
    p.add_argument("--device-key", default=None, help="the key the RPC servers registered with (with --rpc)")


def stopped_message(e: Exception, work_dir) -> str:
    """One line for a run that had to stop (device gone, work dir not writable)."""
    from .measure import RPCError
    why = str(e) if isinstance(e, RPCError) else f"cannot write to the work dir ({e.strerror or e})"
    return f"tuning stopped: {why}; records measured so far are kept in {work_dir}, continue with --resume"


def _probe(rpc) -> None:
    """Fail at once, in one line, if nothing listens at the tracker's address (TVM's own connect
    retries for 60 s and logs a warning every 5 s)."""
    import socket

    from .measure import RPCError
    try:
        socket.create_connection((rpc.host, rpc.port), timeout=3).close()
    except OSError as e:
        raise RPCError(f"cannot reach the RPC tracker at {rpc.host}:{rpc.port} ({type(e).__name__})") from None


def make_measurer(args, target):
    """The Measurer the arguments ask for; remote devices are checked before any work starts."""
    from .measure import Measurer, RPCDevice, RPCError
    if args.timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {args.timeout}")
    rpc = None
    if args.rpc or args.device_key:
        try:
            rpc = RPCDevice.parse(args.rpc or "", args.device_key or "", session_timeout=int(args.timeout) + 30)
            _probe(rpc)
            rpc.check(wait=3.0)
        except RPCError as e:
            raise UsageError(str(e)) from None
    return Measurer(target, timeout=args.timeout, rpc=rpc)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="adaptune", description="Autotune deep-learning operators on Apache TVM.")
    p.add_argument("-v", "--verbose", action="store_true", help="show debug logging")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    t = sub.add_parser("tune-op", help="tune one operator workload")
    t.add_argument("workload", nargs="?", default=None,
                   help="L1..L8, resnet18-8, tiny-conv, tiny-dense, or kind:dims e.g. conv2d:1,64,56,56,64,3,3,1,1 "
                        "(default: L8, a ResNet-18 3x3 conv)")
    t.add_argument("--target", default="host", help='"host" (default: this CPU with its mcpu), "llvm", "cuda" (the visible '
                   'NVIDIA GPU), or a JSON dict such as {"kind": "cuda", "arch": "sm_80"}')
    _tuning_args(t, 64, "workload")
    sub.add_parser("workloads", help="list the built-in workloads")

    model_help = "zoo name (demo-cnn, alexnet, vgg16, resnet18, resnet50, mobilenetv2), an .onnx file, or module:attr of a PyTorch model"

    def model_args(q, default=None):
        q.add_argument("model", nargs="?" if default else None, default=default, help=model_help)
        q.add_argument("--input-shape", default=None, help="input shape, e.g. 1,3,224,224 (for ONNX files "
                       "with dynamic dims and PyTorch models without example_input_shape)")
        q.add_argument("--input", action="append", default=None, metavar="NAME:SHAPE:DTYPE[:LOW:HIGH]",
                       help="an input by name, e.g. input_ids:1,128:int64 (repeatable; keyword inputs of a "
                            "PyTorch model); LOW:HIGH draws its example values in [LOW, HIGH) (default: "
                            "embedding ids in [0, vocab), masks all ones, other integers in [0, 2), floats normal)")
        q.add_argument("--target", default="host", help='"host" (default: this CPU with its mcpu), or a JSON dict')
        q.add_argument("--no-library", action="store_true",
                       help="all generated kernels: run no conv/dense chain as a fused oneDNN call "
                            "(default: per chain, whichever measures faster, kept only if the model gets faster)")

    t = sub.add_parser("tune", help="tune every operator of a model, then compile, check and time it")
    model_args(t, default="demo-cnn")
    _tuning_args(t, 256, "model")
    c = sub.add_parser("compile", help="build a model with a tuning log into a shared library")
    model_args(c)
    c.add_argument("--db", required=True, help="work dir of `adaptune tune`")
    c.add_argument("-o", "--output", required=True, help="library file to write (.so)")
    b = sub.add_parser("bench", help="latency of untuned TVM, adaptune, PyTorch eager, torch.compile and ONNX Runtime")
    model_args(b)
    b.add_argument("--db", default=None, help="work dir of `adaptune tune` (omit to time untuned TVM only)")
    b.add_argument("--json", default=None, metavar="FILE", help="write the table as JSON")
    b.add_argument("--profile", action="store_true", help="time per kernel of adaptune's model, grouped")
    b.add_argument("--rounds", type=int, default=5, help="timing rounds, contenders alternated (default 5)")
    r = sub.add_parser("report", help="PNG plots and an HTML page for a model work dir")
    r.add_argument("work_dir")
    r.add_argument("-o", "--output", default=None, help="folder for the report (default: WORK_DIR/report)")
    sub.add_parser("models", help="list the built-in models")
    from . import cli_looptune
    cli_looptune.add_parser(sub)
    return p


def _progress():
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[best]}"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                    transient=False)


def check_numerics(workload, sch, target) -> tuple[bool, float]:
    """Run the tuned kernel on random inputs and compare with the numpy reference."""
    import numpy as np

    from ._tvm import tvm
    from .target import device

    inputs = workload.random_inputs()
    ref = workload.reference(inputs)
    dev = device(target)
    ex = tvm.compile(sch.mod, target=target)
    args = [tvm.runtime.tensor(x, dev) for x in inputs] + [tvm.runtime.empty(ref.shape, "float32", dev)]
    ex["main"](*args)
    out = args[-1].numpy().astype("float64")
    err = float(np.max(np.abs(out - ref)) / max(np.max(np.abs(ref)), 1e-12))
    return err <= 1e-4, err


def cmd_tune_op(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from .database import WorkDirError, check_work_dir
    from .target import TargetError, check_runnable, parse_target
    from .tuner import tune_tir
    from .workloads import DEFAULT_WORKLOAD, WorkloadError, get_workload

    try:
        workload = get_workload(args.workload or DEFAULT_WORKLOAD)
        target = parse_target(args.target)
    except (WorkloadError, TargetError) as e:
        return _fail(str(e))
    if args.trials <= 0:
        return _fail(f"--trials must be a positive number, got {args.trials}")
    if args.batch_size is not None and args.batch_size <= 0:
        return _fail(f"--batch-size must be positive, got {args.batch_size}")
    if target.kind.name not in ("llvm", "cuda"):
        return _fail(f"tune-op tunes for a CPU (llvm) or an NVIDIA GPU (cuda); target kind {target.kind.name!r} "
                     "is not supported")
    try:
        check_runnable(target, remote=bool(args.rpc))
    except TargetError as e:
        return _fail(f"{e}; measure on a remote one with --rpc HOST:PORT --device-key KEY")
    work_dir = Path(args.work_dir or f"runs/{workload.label.replace(':', '_')}-{args.strategy}-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        check_work_dir(work_dir, args.resume)
        measurer = make_measurer(args, target)
    except (WorkDirError, UsageError) as e:
        return _fail(str(e))

    console = Console(stderr=False)
    console.print(f"[bold]adaptune[/] tune-op {workload.label}  ({workload.flops / 1e6:.1f} MFLOP)  "
                  f"strategy={args.strategy}  trials={args.trials}  target={target}")
    with _progress() as progress:
        task = progress.add_task("tuning", total=args.trials, best="best: -")

        def on_progress(done, total, best):
            gf = f"best {best * 1e3:.3f} ms ({workload.flops / best / 1e9:.1f} GFLOPS)" if best else "best: -"
            progress.update(task, completed=done, best=gf)

        result, code = run_guarded(console, work_dir, f"adaptune tune-op {workload.label} --work-dir {work_dir} --resume",
                                   lambda: tune_tir(workload.mod(), target, strategy=args.strategy, trials=args.trials,
                                                    work_dir=work_dir, resume=args.resume, seed=args.seed,
                                                    batch_size=args.batch_size, measurer=measurer,
                                                    on_progress=on_progress, label=workload.label))
        if result is None:
            return code
    table = Table(title=f"{workload.label} with {args.strategy}", show_header=False)
    table.add_row("work dir", str(work_dir))
    table.add_row("trials measured", f"{result.trials} ({result.new_trials} in this run)")
    table.add_row("invalid configs skipped", str(result.invalid))
    table.add_row("failed candidates", ", ".join(f"{k}: {v}" for k, v in sorted(result.failures.items())) or "0")
    table.add_row("wall time", f"{result.wall_time:.1f} s (search overhead {result.overhead:.1f} s)")
    if result.best_latency is None:
        console.print(table)
        counts = ", ".join(f"{k} {v}" for k, v in sorted(result.failures.items())) or "none measured"
        print(f"adaptune: error: no candidate could be measured ({counts}); last error: {result.last_error}",
              file=sys.stderr)
        return 1
    ok, err = check_numerics(workload, result.best_schedule, target)
    table.add_row("best latency", f"{result.best_latency * 1e3:.4f} ms")
    table.add_row("best GFLOPS", f"{workload.flops / result.best_latency / 1e9:.1f}")
    table.add_row("numerical check vs numpy", f"{'PASS' if ok else 'FAIL'} (max rel. error {err:.2e})")
    console.print(table)
    return 0 if ok else 1


def cmd_workloads(_args) -> int:
    from .workloads import NAMED, PAPER_LAYERS

    for name, wl in NAMED.items():
        src = PAPER_LAYERS.get(name, (None, ""))[1]
        print(f"{name:12s} {wl.kind}:{','.join(map(str, wl.shape)):32s} {wl.flops / 1e6:9.1f} MFLOP  {src}")
    return 0


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except UsageError as e:
        return _fail(str(e))
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="adaptune: %(levelname)s: %(message)s")
    logging.getLogger("tvm").setLevel(logging.WARNING)
    from . import cli_looptune, cli_models
    commands = {"tune-op": cmd_tune_op, "workloads": cmd_workloads, "tune": cli_models.cmd_tune,
                "compile": cli_models.cmd_compile, "bench": cli_models.cmd_bench, "report": cli_models.cmd_report,
                "models": cli_models.cmd_models, "looptune": cli_looptune.cmd_looptune}
    return commands[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
