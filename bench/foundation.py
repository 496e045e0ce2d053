"""Foundation benchmark: adaptune's `sa` and `random` vs TVM MetaSchedule's evolutionary search.

Same layers, same trial budget, same build function and runner, one run, side by side:

    python bench/foundation.py                 # L2 and L8 at 64 trials
    python bench/foundation.py --layers L6 L7 --trials 128

Prints the cost model's scoring speed, then per layer and strategy: best latency (checked against
numpy), GFLOPS, trials to reach its own best, wall time, and the ratio to MetaSchedule's best.
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from common import cost_model_speed, run_adaptune, run_ms_evolutionary  # noqa: E402

from adaptune.measure.target import host_target  # noqa: E402
from adaptune.model.workloads import get_workload  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", nargs="+", default=["L2", "L8"])
    ap.add_argument("--trials", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--out", default="bench/out/foundation")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    logging.getLogger("tvm").setLevel(logging.WARNING)
    target = host_target()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"target: {target}")
    med, fit = cost_model_speed(get_workload("L8"), target)
    print(f"cost model: score 10,000 configs in {med * 1e3:.1f} ms (median of 5); fit on 256 in {fit * 1e3:.0f} ms\n")
    rows = []
    for name in args.layers:
        wl = get_workload(name)
        runs = [run_adaptune(wl, target, s, args.trials, args.batch, out, args.seed) for s in ("sa", "random")]
        runs.append(run_ms_evolutionary(wl, target, args.trials, args.batch, out, args.seed))
        ref = runs[-1].best
        for r in runs:
            rows.append((name, r.strategy, r.best * 1e3, wl.flops / r.best / 1e9, r.trials_to(r.best), r.wall,
                         r.best / ref, "PASS" if r.numerics_ok else "FAIL"))
            print(f"{name:4s} {r.strategy:16s} done: best {r.best * 1e3:.3f} ms, wall {r.wall:.0f} s", flush=True)
    print(f"\n{'layer':5s} {'strategy':16s} {'best ms':>9s} {'GFLOPS':>7s} {'trials to best':>14s} {'wall s':>7s} "
          f"{'lat / ms-evo':>12s} numerics")
    for row in rows:
        print(f"{row[0]:5s} {row[1]:16s} {row[2]:9.3f} {row[3]:7.1f} {row[4]:14d} {row[5]:7.0f} {row[6]:12.2f} {row[7]}")


if __name__ == "__main__":
    main()
