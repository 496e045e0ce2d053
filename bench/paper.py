"""Chameleon's evaluation, reproduced: sa, rl, sa+as, rl+as, random and TVM's evolutionary search
on the paper's layers L1-L8, same budget, same build function and runner, one run.

    python bench/paper.py                  # 256 trials per layer (batch 64, as Chameleon's b_GBT)
    python bench/paper.py --quick          # 64 trials per layer (batch 16)
    python bench/paper.py --quick --layers L2 L8
    python bench/paper.py --strategies rl+as --layers L2 L6   # a subset; ms-evolutionary always runs
    python bench/paper.py --strategies rl+as --seeds 3        # everything three times (seeds 0, 1, 2)
    python bench/paper.py --target '{"kind": "llvm", "mcpu": "haswell"}'   # AVX2 code on this host
    python bench/paper.py --target cuda --layers L1 L2 L7 L8 --trials 128  # the visible NVIDIA GPU
    python bench/paper.py --target cuda --jobs 8   # 8 runs at a time; kernel runs take turns on the GPU
    python bench/paper.py ... --resume     # after a stop: reuse the runs already finished (OUT/runs)

Writes one PNG per layer (best GFLOPS against measurements and against wall time, like the paper's
Fig. 9/12-14) to --out, and prints: per strategy and layer, measurements and wall time to reach
MetaSchedule evolutionary's final best, the best after half the budget and the final latency
relative to it, search overhead per iteration; geometric means; and the component figures
(Fig. 7a steps to converge SA vs RL, Fig. 7b measurements with vs without adaptive sampling).  Every best kernel is checked against
numpy before its numbers are printed.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from common import Run, geomean, run_adaptune, run_ms_evolutionary  # noqa: E402

from adaptune._tvm import tvm  # noqa: E402
from adaptune.measure.target import TargetError, check_runnable, is_cuda, parse_target  # noqa: E402
from adaptune.measure.workdir import write_json  # noqa: E402
from adaptune.model.workloads import get_workload  # noqa: E402

STRATEGIES = ["sa", "rl", "sa+as", "rl+as", "random"]


MS = "ms-evolutionary"


def run_one(job, target, trials, batch, out: Path, seed, build_workers=None, resume=False):
    """One run: ``job`` = (layer, strategy), the strategy an adaptune one or ``MS``.  Its result is
    saved as soon as it is in (``out/runs``), so a run stopped part way keeps the finished ones;
    ``resume`` reuses a saved result of the same run (target, trials, batch, seed) instead of tuning."""
    layer, strategy = job
    saved = out / "runs" / f"{layer}-{strategy}-seed{seed}.json"
    key = {"target": str(target), "trials": trials, "batch": batch, "seed": seed}
    if resume and saved.exists():
        try:
            data = json.loads(saved.read_text())
            if data.pop("key") == key:
                print(f"{layer} {strategy}: reusing {saved}", flush=True)
                return Run(**data)
        except (ValueError, KeyError, TypeError, AttributeError) as e:   # unreadable: tune it again
            print(f"{layer} {strategy}: cannot reuse {saved} ({type(e).__name__}: {e}); tuning it again", flush=True)
    wl = get_workload(layer)
    if strategy == MS:
        run = run_ms_evolutionary(wl, target, trials, batch, out, seed, build_workers=build_workers)
    else:
        run = run_adaptune(wl, target, strategy, trials, batch, out, seed, build_workers=build_workers,
                           on_progress=lambda done, n, best: done % 32 == 0 and print(
                               f"  {layer} {strategy}: {done}/{n} measured, best "
                               f"{best * 1e3 if best else float('nan'):.4f} ms", flush=True))
    saved.parent.mkdir(parents=True, exist_ok=True)
    write_json(saved, {"key": key, **dataclasses.asdict(run)})
    print(f"{layer} {strategy}: done, best {run.best * 1e3:.4f} ms, wall {run.wall:.0f} s", flush=True)
    return run


def _quiet_tvm() -> None:
    logging.getLogger("tvm").setLevel(logging.WARNING)


def plot(layer, wl, runs, out: Path):
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for r in runs:
        t = [c[0] for c in r.curve if c[2]]
        s = [c[1] for c in r.curve if c[2]]
        g = [wl.flops / c[2] / 1e9 for c in r.curve if c[2]]
        a.step(t, g, where="post", label=r.strategy)
        b.step(s, g, where="post", label=r.strategy)
    a.set_xlabel("hardware measurements"); b.set_xlabel("wall time (s)")
    for ax in (a, b):
        ax.set_ylabel("best GFLOPS"); ax.grid(alpha=0.3)
    a.legend()
    fig.suptitle(f"{layer}: {wl.label} {wl.shape}")
    fig.tight_layout()
    fig.savefig(out / f"{layer}.png", dpi=90)
    plt.close(fig)


def report(table, strategies, trials) -> dict:
    """Print the tables for one seed; returns per strategy (latency geomean, reach-ratio geomean,
    whether that ratio is an upper bound)."""
    names = strategies + ["ms-evolutionary"]
    print("\nMeasurements to reach MetaSchedule evolutionary's final best (- = not reached within the budget); "
          "in brackets: wall seconds to reach it")
    print(f"{'strategy':16s}" + "".join(f"{lay:>13s}" for lay in table) + f"{'geomean':>10s}  reached")
    reach = {}
    for n in names:
        cells, vals = [], []
        for lay, runs in table.items():
            ref = runs["ms-evolutionary"].best
            m, s = runs[n].trials_to(ref), runs[n].time_to(ref)
            vals.append(m)
            cells.append(f"{m} ({s:.0f}s)" if m else "-")
        reach[n] = vals
        g = geomean(vals)
        print(f"{n:16s}" + "".join(f"{c:>13s}" for c in cells) + (f"{'-':>10s}" if np.isnan(g) else f"{g:10.1f}")
              + f"  {sum(v is not None for v in vals)}/{len(vals)}")
    print("\nFewer measurements than ms-evolutionary to reach its final best (ms-evo's count / ours; "
          "where ours did not reach it, ms-evo's count / budget, an upper bound)")
    reach_ratio, latency = {}, {}
    for n in strategies:
        ratios = [m_ref / (m or trials) for m, m_ref in zip(reach[n], reach["ms-evolutionary"])]
        bound = "" if all(reach[n]) else "  (upper bound: not reached on some layers)"
        print(f"{n:16s}" + "".join(f"{r:13.2f}" for r in ratios) + f"{geomean(ratios):10.2f}x{bound}")
        reach_ratio[n] = geomean(ratios), bool(bound)
    half = trials // 2
    print(f"\nBest after half the budget ({half} measurements) relative to MetaSchedule evolutionary's final "
          f"best after {trials} (below 1.00: already faster with half the measurements; unlike the count "
          "above, missing by 1% shows as 1.01, not as 'not reached')")
    for n in names:
        vals = [(runs[n].best_at(half) or float("nan")) / runs["ms-evolutionary"].best for runs in table.values()]
        print(f"{n:16s}" + "".join(f"{v:13.2f}" for v in vals) + f"{geomean(vals):10.2f}")
    print("\nFinal latency relative to MetaSchedule evolutionary (lower is better)")
    for n in names:
        vals = [runs[n].best / runs["ms-evolutionary"].best for runs in table.values()]
        print(f"{n:16s}" + "".join(f"{v:13.2f}" for v in vals) + f"{geomean(vals):10.2f}")
        latency[n] = geomean(vals)
    print("\nSearch overhead per iteration in seconds (everything but build+run, after one-off setup), "
          "in brackets as a share of build+run time; ms-evolutionary's from its log (whole seconds)")
    for n in names:
        cells = [f"{(r.overhead - r.setup) / max(r.iterations, 1):7.2f} ({r.search_share:4.0%})"
                 for r in (runs[n] for runs in table.values())]
        total = sum(runs[n].overhead - runs[n].setup for runs in table.values())
        meas = sum(runs[n].wall - runs[n].overhead for runs in table.values())
        print(f"{n:16s}" + "".join(f"{c:>16s}" for c in cells) + f"   all layers {total / meas:4.0%}")
    setup = [runs[n].setup for runs in table.values() for n in strategies]
    print(f"one-off setup per run (design spaces, knobs, reference kernel): median {np.median(setup):.1f} s")
    # Component figures
    if {"sa", "rl"} <= set(strategies):
        sa_steps = [np.mean(runs["sa"].steps) for runs in table.values() if runs["sa"].steps]
        rl_steps = [np.mean(runs["rl"].steps) for runs in table.values() if runs["rl"].steps]
        print(f"\nFig. 7a: search steps until the best predicted fitness stops improving, mean per iteration: "
              f"SA {np.mean(sa_steps):.0f}, RL {np.mean(rl_steps):.0f} "
              f"(ratio {np.mean(sa_steps) / np.mean(rl_steps):.2f}x)")
    for base, with_as in (("sa", "sa+as"), ("rl", "rl+as")):
        if base not in reach or with_as not in reach:
            continue
        pairs = [(a, b) for a, b in zip(reach[base], reach[with_as]) if a and b]
        if not pairs:
            print(f"Fig. 7b: measurements to reach ms-evo's best, {base} / {with_as}: no layer where both reached it")
            continue
        print(f"Fig. 7b: measurements to reach ms-evo's best, {base} / {with_as}: "
              f"geomean {geomean([a / b for a, b in pairs]):.2f}x over {len(pairs)} layer(s) where both reached it")
    return {n: (latency[n], *reach_ratio[n]) for n in strategies}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", nargs="+", default=[f"L{i}" for i in range(1, 9)])
    ap.add_argument("--trials", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help="64 trials per layer, batch 16")
    ap.add_argument("--out", default="bench/out/paper")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=1, help="repeat everything with seeds --seed, --seed+1, ...")
    ap.add_argument("--target", default=None,
                    help="target as JSON (default: this host's CPU; an older mcpu runs that ISA's code here), "
                         "or cuda: the visible NVIDIA GPU")
    ap.add_argument("--strategies", nargs="+", default=STRATEGIES, choices=STRATEGIES,
                    help="adaptune strategies to run (default: all five)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="runs (a layer with one strategy) at once, in worker processes, the build workers shared "
                         "out among them; their kernel runs take turns on the device (a file lock, "
                         "ADAPTUNE_DEVICE_LOCK, default OUT/.device.lock)")
    ap.add_argument("--resume", action="store_true",
                    help="reuse the runs a stopped invocation finished (OUT/runs), tune only the others")
    args = ap.parse_args()
    trials = args.trials or (64 if args.quick else 256)
    batch = 16 if trials <= 64 else 64
    _quiet_tvm()
    target = parse_target(args.target)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if is_cuda(target):
        try:
            check_runnable(target)
        except TargetError as e:
            print(f"paper.py: error: {e}", file=sys.stderr)
            sys.exit(2)
        print(f"GPU: {tvm.cuda(0).device_name}", flush=True)
    print(f"target {target}; {trials} trials per layer, {batch} per iteration", flush=True)
    pool, workers = None, None
    if args.jobs > 1:
        os.environ.setdefault("ADAPTUNE_DEVICE_LOCK", str(out.resolve() / ".device.lock"))   # workers inherit it
        workers = max(2, len(os.sched_getaffinity(0)) // args.jobs)   # the cores this run may use
        # each job's own thread pools (TVM's, PyTorch's and XGBoost's OpenMP) get the same share: N
        # jobs each spinning up every core's worth of threads left the cores oversubscribed
        os.environ["TVM_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = str(workers)
        print(f"{args.jobs} jobs: the (layer, strategy) runs in parallel, {workers} build workers each, kernel runs "
              f"serialised with the lock {os.environ['ADAPTUNE_DEVICE_LOCK']} (wall times include waiting for it)",
              flush=True)
        pool = ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn"), initializer=_quiet_tvm)
    summary = {}
    try:
        for seed in range(args.seed, args.seed + args.seeds):
            if args.seeds > 1:
                print(f"\n=== seed {seed} ===", flush=True)
            table = {}
            one = partial(run_one, target=target, trials=trials, batch=batch, out=out, seed=seed,
                          build_workers=workers, resume=args.resume)
            names = args.strategies + [MS]
            jobs = [(layer, s) for layer in args.layers for s in names]
            done = iter((pool.map if pool else map)(one, jobs))
            # in layer order, each layer as soon as its runs and the ones before them are done
            for layer in args.layers:
                runs = [next(done) for _ in names]
                wl = get_workload(layer)
                plot(layer if seed == args.seed else f"{layer}-seed{seed}", wl, runs, out)
                table[layer] = {r.strategy: r for r in runs}
                ref = runs[-1].best
                for r in runs:
                    print(f"{layer} {r.strategy:16s} best {r.best * 1e3:8.3f} ms ({wl.flops / r.best / 1e9:6.1f} "
                          f"GFLOPS) x{r.best / ref:.2f} of ms-evo, wall {r.wall:5.0f} s, "
                          f"numerics {'PASS' if r.numerics_ok else 'FAIL'}", flush=True)
            summary[seed] = report(table, args.strategies, trials)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    if args.seeds > 1:
        print("\nPer seed: geomean final latency relative to ms-evolutionary | geomean fewer measurements to reach "
              "its final best (* = upper bound, not reached on some layers)")
        for n in args.strategies:
            per_seed = [summary[seed][n] for seed in summary]
            cells = [f"{lat:.2f} | {m:.2f}x{'*' if bound else ''}" for lat, m, bound in per_seed]
            lats = [lat for lat, _, _ in per_seed]
            print(f"{n:16s}" + "".join(f"{c:>18s}" for c in cells) + f"   median latency ratio {np.median(lats):.2f}")
    print(f"\nplots: {out}/L*.png")


if __name__ == "__main__":
    main()
