"""Measurement: build and run candidate kernels through MetaSchedule's builder and runner.

Both run in worker processes (TVM's PopenPool), so a kernel that segfaults or hangs kills or
times out a worker, never the tuning process.  Every candidate comes back as a ``MeasureResult``:
a latency, or an error kind (build / run / timeout / crash) with a message; nothing raises out of
a batch.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ._tvm import ms, tvm
from ._build import fast_build
from .target import device_type

OK, BUILD_ERROR, RUN_ERROR, TIMEOUT, CRASH = "ok", "build", "run", "timeout", "crash"


@dataclass
class MeasureResult:
    error: str                      # OK or one of the error kinds
    run_secs: list[float] = field(default_factory=list)
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.error == OK

    @property
    def latency(self) -> float | None:
        """Median over repeats, in seconds (None when the candidate failed)."""
        return statistics.median(self.run_secs) if self.ok else None


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


class Measurer:
    """Builds with ``fast_build`` in parallel workers, runs one candidate at a time.

    ``timeout`` bounds each build and each run; the runner reports the median of ``repeat``
    timings, each the mean of at least ``number`` runs and ``min_repeat_ms`` milliseconds."""

    def __init__(self, target, *, timeout: float = 30.0, number: int = 2, repeat: int = 3,
                 min_repeat_ms: int = 20, build_workers: int | None = None):
        self.target = target
        self.timeout = timeout
        self.builder = ms.builder.LocalBuilder(max_workers=build_workers, timeout_sec=timeout, f_build=fast_build)
        self.runner = ms.runner.LocalRunner(
            timeout_sec=timeout,
            evaluator_config=ms.runner.EvaluatorConfig(number=number, repeat=repeat, min_repeat_ms=min_repeat_ms,
                                                       enable_cpu_cache_flush=False))

    def measure(self, mods: Sequence["tvm.IRModule"],
                on_result: Callable[[int, MeasureResult], None] | None = None) -> list[MeasureResult]:
        """Measure scheduled modules; ``on_result(i, result)`` fires as soon as each is known."""
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
                pending.append((i, b.artifact_path, ms.runner.RunnerInput(b.artifact_path, device_type(self.target), args)))
            except Exception as e:  # noqa: BLE001
                done(i, MeasureResult(BUILD_ERROR, message=_short(str(e))))
        for i, path, runner_input in pending:   # one at a time, so each result is saved at once
            try:
                r = self.runner.run([runner_input])[0].result()
                if r.error_msg is not None:
                    res = MeasureResult(_classify(r.error_msg), message=_short(r.error_msg))
                else:
                    res = MeasureResult(OK, [float(x) for x in r.run_secs])
            except Exception as e:  # noqa: BLE001
                res = MeasureResult(_classify(f"{type(e).__name__}: {e}"), message=_short(f"{type(e).__name__}: {e}"))
            done(i, res)
            try:
                ms.utils.remove_build_dir(path)
            except Exception:  # noqa: BLE001 - a left-over temp dir is harmless
                pass
        return results
