"""LoopTune's evaluation (Figs. 8-10) on held-out matmuls of the paper's set (64..256, step 16).

For each matmul: the untuned nest, the shipped policy (its time to choose, then its nest
measured), numpy's BLAS, and on the first ``--search-count`` of them each classic search with its
time limit, and on the first ``--ms-count`` TVM MetaSchedule's stock evolutionary search at 16
and 64 trials; then the policy and numpy on the ten test sizes off the grid (``OFF_GRID_TEST``,
rows marked "off the grid").  The policy's nest and numpy are each the best of three timings,
alternated (``versus_numpy``); a search's nest is its own measurement.  Every nest was checked
against numpy when it was built.  Prints,
per method, how many matmuls it ran, the median and the 25-75 % spread of the speedup over the
untuned nest, median GFLOPS, median seconds to schedule, and the median ratio to numpy.  The paper's setting is ``--count 50 --time-limit 60``
(about six hours here on 2 cores); the defaults are a smaller sample.

    python bench/looptune.py                                    # 50 matmuls for the policy, 5 for searches
    python bench/looptune.py --search-count 50 --time-limit 60  # the paper's setting
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import run_ms_evolutionary  # noqa: E402

from adaptune.looptune.dataset import OFF_GRID_TEST, split  # noqa: E402
from adaptune.looptune.dqn import WEIGHTS, Policy  # noqa: E402
from adaptune.looptune.evaluate import Evaluator, versus_numpy  # noqa: E402
from adaptune.looptune.nest import LoopNest, matmul  # noqa: E402
from adaptune.looptune.search import SEARCHES  # noqa: E402
from adaptune.measure.target import host_target  # noqa: E402
from adaptune.model.workloads import get_workload  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=50, help="held-out matmuls for untuned, policy and numpy (of 50)")
    ap.add_argument("--search-count", type=int, default=5, help="of those, how many the searches and TVM run on")
    ap.add_argument("--policy", default=str(WEIGHTS), help="policy weights (default: the shipped ones)")
    ap.add_argument("--time-limit", type=float, default=10.0, help="seconds per search and matmul")
    ap.add_argument("--searches", default=",".join(SEARCHES))
    ap.add_argument("--ms-trials", type=int, nargs="*", default=[16, 64],
                    help="TVM evolutionary trial budgets per matmul (none: skip)")
    ap.add_argument("--ms-count", type=int, default=3, help="of the searches' matmuls, how many TVM runs on")
    ap.add_argument("--off-grid", type=int, default=len(OFF_GRID_TEST), help="off-grid test sizes to run (of 10)")
    ap.add_argument("--out", default="bench/out/looptune")
    args = ap.parse_args(argv)
    target, out = host_target(), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _, test = split()
    policy = Policy.load(args.policy)
    rows = []      # (matmul, method, gflops, seconds)
    for idx, con in enumerate(test[:args.count]):
        ev = Evaluator(con, target)
        start = LoopNest.initial(con)
        base = ev(start)
        choice = policy.schedule(con)
        gflops, npy = versus_numpy(ev, choice.nest)
        rows += [(con.name, "untuned", base, 0.0), (con.name, "numpy", npy, 0.0)]
        line = [f"{con.name}: untuned {base:.2f} GF, numpy {npy:.1f} GF"]
        rows.append((con.name, "policy", gflops, choice.seconds))
        line.append(f"policy {rows[-1][2]:.1f} ({' '.join(choice.actions)})")
        if idx < args.search_count < args.count:     # the policy on the searches' matmuls, side by side
            rows.append((con.name, f"policy, first {args.search_count}", rows[-1][2], rows[-1][3]))
        if idx >= args.search_count:
            print(", ".join(line), flush=True)
            continue
        for name in filter(None, args.searches.split(",")):
            ev.cache.clear()       # each search pays for its own evaluations
            res = SEARCHES[name](start, ev, time_limit=args.time_limit)
            rows.append((con.name, name, res.gflops, res.seconds))
            line.append(f"{name} {res.gflops:.1f}")
        for trials in args.ms_trials if idx < args.ms_count else []:
            (_, m), (_, n), (_, k) = con.sizes
            run = run_ms_evolutionary(get_workload(f"matmul:{m},{n},{k}"), target, trials, 8, out)
            if not run.numerics_ok:
                raise SystemExit(f"{con.name}: TVM's kernel failed the numerical check")
            rows.append((con.name, f"tvm-evolutionary-{trials}", con.flops / run.best / 1e9, run.wall))
            line.append(f"tvm-{trials} {rows[-1][2]:.1f}")
        print(", ".join(line), flush=True)
    for con in (matmul(*s) for s in OFF_GRID_TEST[:args.off_grid]):
        ev, tag = Evaluator(con, target), ", off the grid"
        choice = policy.schedule(con)
        gflops, npy = versus_numpy(ev, choice.nest)
        rows += [(con.name, "untuned" + tag, ev(LoopNest.initial(con)), 0.0),
                 (con.name, "numpy" + tag, npy, 0.0),
                 (con.name, "policy" + tag, gflops, choice.seconds)]
        print(f"{con.name}: untuned {rows[-3][2]:.2f} GF, numpy {rows[-2][2]:.1f} GF, policy {rows[-1][2]:.1f} "
              f"({' '.join(choice.actions)})", flush=True)
    (out / "results.json").write_text(json.dumps(rows))
    base = {c: g for c, m, g, _ in rows if m.startswith("untuned")}
    npy = {c: g for c, m, g, _ in rows if m.startswith("numpy")}
    print(f"\nheld-out matmuls (and the off-grid test sizes), target {target}, time limit {args.time_limit:g} s per search")
    print(f"{'method':24s} {'n':>3s} {'speedup median':>14s} {'p25-p75':>13s} {'GFLOPS med':>10s} {'s to schedule':>13s} {'/numpy':>7s}")
    for method in dict.fromkeys(m for _, m, _, _ in rows):
        sel = [(c, g, s) for c, m, g, s in rows if m == method]
        sp = np.array([g / base[c] for c, g, _ in sel])
        print(f"{method:24s} {len(sel):3d} {np.median(sp):13.2f}x {np.percentile(sp, 25):6.2f}-{np.percentile(sp, 75):5.2f}x "
              f"{np.median([g for _, g, _ in sel]):10.2f} {np.median([s for *_, s in sel]):13.3f} "
              f"{np.median([g / npy[c] for c, g, _ in sel]):6.2f}x")
    box_plot(rows, npy, out / "looptune.png")
    print(f"plot: {out / 'looptune.png'}")
    return 0


def box_plot(rows, npy, path: Path) -> None:
    """GFLOPS relative to numpy per method, one box each (the paper's Fig. 9 shows the same spread)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    methods = [m for m in dict.fromkeys(m for _, m, _, _ in rows) if not m.startswith("numpy")]
    data = [[g / npy[c] for c, m2, g, _ in rows if m2 == m] for m in methods]
    fig, ax = plt.subplots(figsize=(1.1 * len(methods) + 2, 4))
    ax.boxplot(data, showfliers=True)
    ax.set_xticks(range(1, len(methods) + 1), [f"{m}\n(n={len(d)})" for m, d in zip(methods, data)],
                  rotation=30, ha="right", fontsize=8)
    ax.axhline(1.0, color="gray", ls="--", lw=1)
    ax.set_ylabel("GFLOPS / numpy's")
    ax.set_title("LoopTune on held-out matmuls")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
