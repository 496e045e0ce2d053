"""Tuning a whole model: one trial budget shared across its tasks, one database, resumable.

Allocation rule (ours, simpler and steadier than TVM's gradient task scheduler):

1. *Warm-up*: every task, heaviest (FLOPs x weight) first, gets one round of
   ``max(1, min(batch, trials // (2 * n_tasks)))`` trials, so no kernel stays untuned and the
   warm-up never spends more than half the budget; a task under 1% of the untuned model's time
   gets a single trial (its untuned kernel is a candidate too, see below).
2. *Then* each round of ``batch`` trials goes to the task with the most model time per trial
   spent on it so far, ``weight x current_latency / trials``: trials follow each task's share of
   the model's time, and as a task gets faster its share, and so its claim, shrinks.  A task
   whose space is exhausted is skipped.
3. *The library's time* (``library=True``): a task whose chain oneDNN runs as one fused call
   (``library.task_floors``) is worth tuning only where a kernel can beat that call, so while the
   library is faster its claim is scaled by ``(library / current)^2`` (a task 3x slower than oneDNN
   gets a ninth of its claim), and the model estimate counts the faster of the two.  Trials go to
   the kernels generated code can win.  The scaling starts after ``LIBRARY_GRACE`` trials: in the
   expert design space a kernel 3-7x slower than oneDNN after one trial is often faster after ten
   (MobileNetV2's depthwise layers stayed at their one warm-up trial without it).

Work dir: the model layout of ``measure.workdir`` (TVM's JSONDatabase, usable as-is by
``ms.relax_integration``; ``tasks/<task>.jsonl``; ``model.json`` with the tasks' weight, FLOPs and
untuned latency and the graph-pass summary), locked while the run writes it.  Each task's seed is
the run's seed plus its workload's structural hash (``task_seed``), not its place in the task list,
so a model whose passes add or reorder tasks resumes every task it kept with its own design space.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

import tvm_ffi

from ._tvm import ms
from .measure.workdir import WorkDir, WorkDirError
from .model.frontends import Model
from .model.graph import extract_tasks, gpu_kernel_schedule, optimise, pass_report
from .measure.run import Measurer
from .measure.target import is_cuda, parse_target
from .tuner import TaskTuner

log = logging.getLogger("adaptune")

SMALL_SHARE = 0.01
LIBRARY_GRACE = 8        # trials a task gets before the library's time scales its claim (rule 3)


@dataclass
class TaskSummary:
    name: str
    weight: int
    flops: float
    baseline: float | None          # untuned kernel, seconds
    best: float | None = None       # best tuned kernel, seconds
    trials: int = 0
    exhausted: bool = False
    small: bool = False             # under 1% of the untuned model's time: one warm-up trial
    library: float | None = None    # the fused oneDNN call for this task's chain, seconds
    alternative: bool = False       # another way to compute chains other tasks compute (Winograd's GEMM)

    @property
    def current(self) -> float | None:
        """What this kernel costs in the compiled model now: the faster of tuned and untuned
        (the untuned kernel is in the database too, so compilation picks the same)."""
        known = [x for x in (self.best, self.baseline) if x is not None]
        return min(known) if known else None

    @property
    def in_model(self) -> float:
        """What the task costs the final model: the faster of our kernel and the library's call."""
        known = [x for x in (self.current, self.library) if x is not None]
        return min(known) if known else 0.0

    @property
    def claim(self) -> float:
        """Model time per trial spent (rule 2), scaled down while the library is faster (rule 3)."""
        c = self.weight * (self.current or 0.0) / max(self.trials, 1)
        if self.library is not None and self.current and self.current > self.library and \
                self.trials >= LIBRARY_GRACE:
            c *= (self.library / self.current) ** 2
        return c


@dataclass
class ModelTuneResult:
    model: str
    work_dir: str
    tasks: list[TaskSummary]
    trials: int
    new_trials: int
    wall_time: float
    passes: dict = field(default_factory=dict)
    library_times: dict = field(default_factory=dict)   # (LibraryOp, impl) -> s | None measured in this run (see library_time)

    def estimated_latency(self, tuned: bool = True) -> float:
        """Sum over tasks of weight x kernel latency (the model's kernel time, without VM overhead)."""
        return sum(t.weight * ((t.in_model if tuned else t.baseline) or 0.0) for t in self.tasks if not t.alternative)


def next_task(tasks: list[TaskSummary]) -> int | None:
    """The allocation rule of the module docstring: index of the task that gets the next round."""
    for i, t in enumerate(tasks):
        if t.trials == 0 and not t.exhausted:
            return i
    live = [(t.claim, -i) for i, t in enumerate(tasks) if not t.exhausted]
    return -max(live)[1] if live else None


def _commit_untuned(db, tasks, baselines, target) -> None:
    """Record each untuned kernel as a candidate: a tiny op that only gets slower when
    parallelised keeps TVM's plain code, because compilation applies the fastest record."""
    for t in tasks:
        if baselines[t.name] is not None:
            db.commit_tuning_record(ms.database.TuningRecord(
                untuned_schedule(t.mod, target).trace, db.commit_workload(t.mod), run_secs=[baselines[t.name]],
                target=target, args_info=ms.arg_info.ArgInfo.from_prim_func(t.mod["main"])))


def untuned_schedule(mod, target):
    """The untuned kernel as a schedule whose trace the database can hold and return.

    On a CPU: ``mod`` as it is, its trace one no-op instruction (a block lookup; TVM's
    ``JSONDatabase.get_top_k`` skips records whose trace is empty).  On a GPU, where loops bound to
    no thread do not build: TVM's default GPU schedule (``graph.gpu_default_schedule``'s rules)."""
    from tvm import s_tir
    if is_cuda(target):
        return gpu_kernel_schedule(mod, target)
    sch = s_tir.Schedule(mod)
    sch.get_child_blocks(sch.get_sblock("root"))
    return sch


def tune_model(model: Model, target=None, *, trials: int = 256, strategy: str = "chameleon", work_dir,
               resume: bool = False, seed: int = 0, batch_size: int | None = None,
               measurer: Measurer | None = None, library: bool = True, spaces: str = "auto",
               on_progress: Callable[[int, int, str, float], None] | None = None,
               on_stage: Callable[[str], None] | None = None) -> ModelTuneResult:
    """Tune every task of ``model`` within ``trials`` measurements in total (resumable).

    ``spaces`` picks each task's design spaces (``knobs.space_generator``).
    ``on_progress(done, trials, task_name, estimated_model_seconds)`` is called after each
    measurement; ``on_stage(text)`` when a long preparatory step starts."""
    if trials <= 0:
        raise ValueError("trials must be positive")
    wd = WorkDir(work_dir)
    wd.check_model(resume)
    with wd.lock():
        return _tune_locked(model, parse_target(target), wd, trials=trials, strategy=strategy, resume=resume,
                            seed=seed, batch_size=batch_size, measurer=measurer, library=library,
                            spaces=spaces, on_progress=on_progress, stage=on_stage or (lambda s: None))


def task_seed(seed: int, mod) -> int:
    """A task's seed, fixed by its workload: a generic design space's knob sizes depend on the
    seed, so a seed taken from the task's position broke ``--resume`` once a task was added."""
    return (seed + tvm_ffi.structural_hash(mod)) % (1 << 31)


def _tune_locked(model, target, wd: WorkDir, *, trials, strategy, resume, seed, batch_size, measurer, library,
                 spaces, on_progress, stage) -> ModelTuneResult:
    """``tune_model`` while it holds the work dir's lock."""
    t0 = time.perf_counter()
    stage("graph passes and task extraction")
    optimised = optimise(model.mod)
    tasks, fuse_summary = extract_tasks(optimised, target)
    from .model.library import gemm_tasks
    alternatives = gemm_tasks(optimised, target)    # Winograd's GEMMs, for the all-generated model
    tasks += alternatives
    passes = {**pass_report(model.mod, optimised), **fuse_summary}
    old = wd.model() if resume else None
    if old is not None and (old["target"] != str(target) or old["model"] != model.source):
        raise WorkDirError(f"work dir {wd} was tuned for {old['model']} on {old['target']}; use a separate work dir")
    owns_measurer = measurer is None
    measurer = measurer or Measurer(target)
    if old is not None and {t["name"] for t in old["tasks"]} == {t.name for t in tasks}:
        baselines = {t["name"]: t["baseline"] for t in old["tasks"]}
        floors = {t["name"]: t["library"] for t in old["tasks"] if t.get("library") is not None}
    else:
        stage(f"measuring the {len(tasks)} untuned kernels")
        res = measurer.measure([untuned_schedule(t.mod, target).mod for t in tasks])
        baselines = {t.name: r.latency for t, r in zip(tasks, res)}
        floors = None
    library_times: dict = {}
    if library and floors is None:
        from .model.library import task_floors
        stage("timing oneDNN's fused calls for the tasks it covers")
        floors = task_floors(optimised, tasks, target, library_times)
    floors = floors if library else {}
    wd.repair_database()
    db = ms.database.JSONDatabase(work_dir=str(wd))
    if old is None:
        _commit_untuned(db, tasks, baselines, target)
    meta = {"model": model.source, "name": model.name, "target": str(target), "strategy": strategy, "spaces": spaces,
            "trials": trials, "inputs": [[n, list(s), d] for n, s, d in model.inputs], "passes": passes,
            "tasks": [{"name": t.name, "weight": t.weight, "flops": t.flops, "baseline": baselines[t.name],
                       "library": floors.get(t.name)} for t in tasks]}
    wd.write_model(meta)
    summaries = [TaskSummary(t.name, t.weight, t.flops, baselines[t.name], library=floors.get(t.name),
                             alternative=any(t is a for a in alternatives)) for t in tasks]
    untuned_total = sum(s.weight * (s.baseline or 0.0) for s in summaries if not s.alternative)
    for s in summaries:
        s.small = s.baseline is not None and s.weight * s.baseline < SMALL_SHARE * untuned_total
    tuners: list[TaskTuner | None] = [None] * len(tasks)
    n = len(tasks)
    batch = batch_size or max(4, min(16, trials // (2 * n)))
    warm = max(1, min(batch, trials // (2 * n)))
    used = 0

    def estimate() -> float:
        return sum(s.weight * s.in_model for s in summaries if not s.alternative)

    def tuner(i: int) -> TaskTuner:
        if tuners[i] is None:
            def progress(tt: TaskTuner, i=i) -> None:
                summaries[i].best, summaries[i].trials = tt.state.best_latency, tt.trials
                if on_progress is not None:
                    on_progress(sum(s.trials for s in summaries), trials, summaries[i].name, estimate())
            tuners[i] = TaskTuner(tasks[i].mod, target, strategy=strategy, seed=task_seed(seed, tasks[i].mod),
                                  measurer=measurer, label=tasks[i].name, on_result=progress, spaces=spaces,
                                  store_args={"work_dir": wd.path, "db": db, "name": tasks[i].name})
            summaries[i].trials, summaries[i].best = tuners[i].trials, tuners[i].state.best_latency
        return tuners[i]

    stage("tuning")
    try:
        if resume:       # open every task that has records so the budget counts them
            for i, t in enumerate(tasks):
                if wd.records_path(t.name).exists():
                    tuner(i)
        done0 = sum(s.trials for s in summaries)
        used = done0
        while used < trials:
            i = next_task(summaries)
            if i is None:
                log.info("every task's design space is exhausted")
                break
            tt = tuner(i)
            size = (1 if summaries[i].small else warm) if tt.trials == 0 else batch
            got = tt.step(min(size, trials - used))
            s = summaries[i]
            s.trials, s.best = tt.trials, tt.state.best_latency
            if got == 0:
                s.exhausted = True
            used = sum(x.trials for x in summaries)
    finally:
        for tt in tuners:
            if tt is not None:
                tt.close()
        if owns_measurer:
            measurer.close()
    meta["tasks"] = [{**m, "best": s.best, "trials": s.trials} for m, s in zip(meta["tasks"], summaries)]
    wd.write_model(meta)
    untuned = [s.name for s in summaries if s.trials == 0]
    if untuned:
        log.warning("%d task(s) got no trials (budget too small): %s", len(untuned), ", ".join(untuned))
    return ModelTuneResult(model.name, str(wd), summaries, used, used - done0, time.perf_counter() - t0, passes,
                           library_times)
