"""What the command groups share: one-line failures (exit 2), the parser that reports usage
errors in one line, typed options, the tuning and RPC options, the measurer they ask for, and a
guarded run that holds the work dir's lock."""
from __future__ import annotations

import argparse
import re
import sys

EXIT_BAD_INPUT = 2


class UsageError(Exception):
    """Input we refuse, reported as one line."""


def fail(msg: str, code: int = EXIT_BAD_INPUT) -> int:
    msg = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(msg))   # one line, whatever was typed
    print(f"adaptune: error: {msg}", file=sys.stderr)
    return code


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse would print the usage too)
        raise UsageError(re.sub(r"^argument ([^:]+): must be", r"\1 must be", message))


def positive_int(text: str) -> int:
    """``type=`` of a count option: an integer above 0, else one line naming the option."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def tuning_args(p, trials: int, what: str) -> None:
    """The options tune-op and tune share."""
    from ..search.strategies import STRATEGIES
    p.add_argument("--trials", type=positive_int, default=trials,
                   help=f"measurement budget of the work dir, for the whole {what} (default {trials})")
    p.add_argument("--strategy", default="chameleon", choices=sorted(STRATEGIES),
                   help="search strategy (default chameleon = rl+as; sa is AutoTVM's baseline)")
    p.add_argument("--spaces", default="auto", choices=["auto", "expert", "generic", "both"],
                   help="design spaces: expert = the register-blocked x86 template where it covers the kernel "
                        "(NHWC conv, dense with packed weights), else MetaSchedule's generic ones; both = the "
                        "two, the design-space knob chooses (default auto = expert)")
    p.add_argument("--work-dir", default=None, help=f"where records go (default: runs/<{what}>-<strategy>-<time>)")
    p.add_argument("--resume", action="store_true", help="continue the records in --work-dir")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=positive_int, default=None, help="configs measured per iteration (per task)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds allowed per build and per run")
    rpc_args(p)


def run_guarded(console, work_dir, resume_hint: str, fn):
    """Run a tuning call holding the work dir's lock; another run in it, interruption, a lost device
    or a full disk become one line and an exit code (records stay on disk).  Returns (result, None)
    or (None, exit code)."""
    from ..measure.run import RPCError
    from ..measure.workdir import WorkDir, WorkDirError
    try:
        with WorkDir(work_dir).lock():
            return fn(), None
    except WorkDirError as e:
        return None, fail(str(e))
    except KeyboardInterrupt:
        console.print(f"[yellow]interrupted[/]: measured records are saved in {work_dir}; continue with: {resume_hint}")
        return None, 130
    except (OSError, RPCError) as e:
        return None, fail(stopped_message(e, work_dir), 1)


def rpc_args(p) -> None:
    p.add_argument("--rpc", default=None, metavar="HOST:PORT",
                   help="measure on devices behind this TVM RPC tracker instead of locally")
    p.add_argument("--device-key", default=None, help="the key the RPC servers registered with (with --rpc)")


def stopped_message(e: Exception, work_dir) -> str:
    """One line for a run that had to stop (device gone, work dir not writable)."""
    from ..measure.run import RPCError
    why = str(e) if isinstance(e, RPCError) else f"cannot write to the work dir ({e.strerror or e})"
    return f"tuning stopped: {why}; records measured so far are kept in {work_dir}, continue with --resume"


def _probe(rpc) -> None:
    """Fail at once, in one line, if nothing listens at the tracker's address (TVM's own connect
    retries for 60 s and logs a warning every 5 s)."""
    import socket

    from ..measure.run import RPCError
    try:
        socket.create_connection((rpc.host, rpc.port), timeout=3).close()
    except OSError as e:
        raise RPCError(f"cannot reach the RPC tracker at {rpc.host}:{rpc.port} ({type(e).__name__})") from None


def make_measurer(args, target):
    """The Measurer the arguments ask for; remote devices are checked before any work starts."""
    from ..measure.run import Measurer, RPCDevice, RPCError
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


def progress_bar():
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[best]}"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                    transient=False)
