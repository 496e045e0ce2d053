"""Pool runs of bench/paper.py: every layer over every --out folder given, then over the layers.

    python bench/pooled.py bench/out/paper /tmp/seed1 /tmp/seed2
    python bench/pooled.py bench/out/paper --strategy rl+as --trials 256

One run of either search on a layer moves by 10-30% between seeds (L6 with seeds 0 and 1: rl+as
4.04 and 5.58 ms, ms-evo 6.24 and 5.52 ms), so one run per layer says little about the targets.
This reads the work dirs that paper.py leaves (``{layer}-{strategy}`` beside
``{layer}-ms-evolutionary``; ours from ``adaptune_records.jsonl``, MetaSchedule's from its record
file), so runs from different seeds or sessions can be combined.  For each run it prints the same
three measures as paper.py: the final latency ratio, the reach ratio (ms-evo's measurements to its
final best / ours; where ours never reached it, ms-evo's / the budget, an upper bound, marked *)
and the best after half the budget relative to ms-evo's final best.  Per layer it takes the
geometric mean over runs, then over layers, so a layer run three times weighs as much as one
run once.  Only complete runs (both searches measured ``--trials``) are used.

``--cross`` compares each of our runs with every complete ms-evo run of the layer under any of
the folders, not only the one beside it (geometric mean over those pairs): ms-evo's own runs
differ by seed as much as ours (L8, ten runs: its final best spans 21%, the measurements it took
to get there 72 to 251), so one pairing per run adds ms-evo's luck to ours.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from common import adaptune_curve, geomean, ms_curve  # noqa: E402


def pair(root: Path, layer: str, strategy: str, trials: int, ms_root: Path | None = None):
    """(final latency ratio, reach ratio, reached?, half-budget ratio) of one run against the ms-evo
    run beside it (or under ``ms_root``), or None."""
    ours_dir, ms_dir = root / f"{layer}-{strategy}", (ms_root or root) / f"{layer}-ms-evolutionary"
    if not (ours_dir.is_dir() and ms_dir.is_dir()):
        return None
    ours, theirs = adaptune_curve(ours_dir), ms_curve(ms_dir, 0.0)
    if len(ours) < trials or len(theirs) < trials:
        return None
    ours, theirs = ours[:trials], theirs[:trials]
    ref = theirs[-1][2]

    def reach(curve):
        return next((t for t, _, b in curve if b is not None and b <= ref * (1 + 1e-9)), None)
    m, m_ref = reach(ours), reach(theirs)
    half = next(b for t, _, b in reversed(ours) if t <= trials // 2)
    return ours[-1][2] / ref, m_ref / (m or trials), m is not None, (half or float("nan")) / ref


def against(root: Path, layer: str, args):
    """``pair`` of one of our runs, or with ``--cross`` its geometric mean over every ms-evo run of
    the layer (reached: in all of those pairs)."""
    if not args.cross:
        return pair(root, layer, args.strategy, args.trials)
    runs = [r for ms_root in args.roots if (r := pair(root, layer, args.strategy, args.trials, ms_root))]
    if not runs:
        return None
    lat, reach, half = (geomean([r[i] for r in runs]) for i in (0, 1, 3))
    return lat, reach, all(r[2] for r in runs), half


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("roots", nargs="+", type=Path, help="--out folders of bench/paper.py")
    ap.add_argument("--strategy", default="rl+as")
    ap.add_argument("--trials", type=int, default=256)
    ap.add_argument("--layers", nargs="+", default=[f"L{i}" for i in range(1, 9)])
    ap.add_argument("--cross", action="store_true",
                    help="compare each of our runs with every ms-evo run of the layer, from any folder")
    args = ap.parse_args()
    found = {layer: [(root, r) for root in args.roots if (r := against(root, layer, args))] for layer in args.layers}
    found = {layer: runs for layer, runs in found.items() if runs}
    if not found:
        sys.exit(f"error: no complete {args.strategy} / ms-evolutionary pair under {[str(r) for r in args.roots]}")
    print(f"{args.strategy} against {'every' if args.cross else 'its'} ms-evolutionary run, "
          f"{args.trials} measurements per run; per run: "
          "latency ratio / reach ratio (* = not reached, an upper bound) / best after half the budget")
    per_layer = []
    for layer, runs in found.items():
        cells = "  ".join(f"{root.name}: {lat:.2f}/{reach:.2f}{'' if ok else '*'}/{half:.2f}"
                          for root, (lat, reach, ok, half) in runs)
        stats = [geomean([r[i] for _, r in runs]) for i in (0, 1, 3)]
        per_layer.append(stats)
        print(f"{layer}: n={len(runs)}  latency {stats[0]:.2f}  reach {stats[1]:.2f}  half {stats[2]:.2f}   {cells}")
    lat, reach, half = (geomean([s[i] for s in per_layer]) for i in range(3))
    print(f"geomean over {len(per_layer)} layer(s): latency ratio {lat:.2f}, reach ratio {reach:.2f}x, "
          f"best after half the budget {half:.2f} of ms-evo's final")


if __name__ == "__main__":
    main()
