"""rl-direct's network: two layers of 64 against Woodpecker-DL's 512-1024-1024-512.

No hardware: the strategy runs as the tuner drives it, on synthetic latency surfaces over a real
knob space (tiny-dense), a random convex bowl per seed, so the two networks see exactly the same
tasks.  Prints, per network, the geomean over seeds of the best latency found (relative to the
surface's optimum, 1.0 is perfect) after each quarter of the budget, and the search's seconds.

    python bench/rl_net.py                     # 8 seeds x 256 measurements
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import replace

import numpy as np

from adaptune.search.space import KnobSpace
from adaptune.search.strategies import make_strategy
from adaptune.search.strategies.ppo import WOODPECKER
from adaptune.measure.target import host_target
from adaptune.tuner import TuneState
from adaptune.model.workloads import get_workload


def run(space, hidden, seed, budget, batch=8):
    rng = np.random.default_rng(1000 + seed)
    opt, w = rng.random(space.ndim), rng.uniform(0.5, 4.0, space.ndim)
    state = TuneState(space, seed=seed)
    strat = make_strategy("rl-direct", ppo=replace(WOODPECKER, hidden=hidden))
    strat.setup(state)
    best, curve, t0 = math.inf, [], time.perf_counter()
    while len(state.measured_keys()) < budget:
        out = strat.propose(batch)
        lat = list(1e-3 * (1 + (w * (space.normalized(out) - opt) ** 2).sum(1)))
        state.record(out, lat)
        strat.update(out, lat)
        best = min(best, *lat)
        curve.append((len(state.measured_keys()), best))
    return curve, time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--budget", type=int, default=256)
    args = ap.parse_args(argv)
    space = KnobSpace(get_workload("tiny-dense").mod(), host_target(), seed=1)
    space.is_valid = lambda c: True           # the surface, not TVM, decides here
    marks = [args.budget * q // 4 for q in (1, 2, 3, 4)]
    print(f"rl-direct on synthetic surfaces, {space.ndim} knobs, {args.seeds} seeds, budget {args.budget}")
    print(f"{'network':34s} " + " ".join(f"best@{m:<4d}" for m in marks) + "  seconds")
    for name, hidden in (("2x64", 64), ("512-1024-1024-512 (paper, default)", WOODPECKER.hidden)):
        rows, secs = [], 0.0
        for seed in range(args.seeds):
            curve, s = run(space, hidden, seed, args.budget)
            secs += s
            rows.append([next(b for n, b in curve if n >= m) / 1e-3 for m in marks])
        gm = np.exp(np.log(np.array(rows)).mean(0))
        print(f"{name:34s} " + " ".join(f"{g:9.3f}" for g in gm) + f"  {secs:7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
