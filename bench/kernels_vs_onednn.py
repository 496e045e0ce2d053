"""Generated kernels against oneDNN, per layer, in the layout models run (issue 33).

Per layer: tune with Chameleon (rl+as) in MetaSchedule's generic design spaces and in the expert
x86 template (``search/expert.py``), 64 trials and then on to 256 in the same work dir; check each
best kernel against numpy; then time the best kernels at 64 and at 256 trials beside oneDNN's fused
call on the same shape (pre-packed weights, NHWC activations, as the model's library path calls it;
its output checked against numpy too) in short samples, alternated, with the same timer
(``timing.time_callable``), each kernel's time paired with oneDNN's sample of the same round.  The
machine's peak is an FMA loop measured in the same run.

Layers: Chameleon's L1-L8, the distinct convolutions of ResNet-18 and ResNet-50 (NHWC, OHWI
weights packed once), BERT-base's three dense shapes (128 tokens).  Issue 33's targets: the expert
space's geomean >= 1.0x oneDNN at 256 trials and >= 0.9x at 64.

    python bench/kernels_vs_onednn.py                    # 37 layers, both spaces: ~3.5 h on 2 cores (~4 min a layer generic, ~1.7 expert)
    python bench/kernels_vs_onednn.py --spaces expert    # issue 33's targets alone: ~1 h
    python bench/kernels_vs_onednn.py --layers paper bert --spaces expert
    python bench/kernels_vs_onednn.py --layers L2 resnet18 --trials 32 128
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import geomean  # noqa: E402

from adaptune._tvm import tvm  # noqa: E402
from adaptune.cli.common import positive_int  # noqa: E402
from adaptune.cli.ops import check_numerics  # noqa: E402
from adaptune.measure.build import fast_build  # noqa: E402
from adaptune.measure.run import Measurer  # noqa: E402
from adaptune.measure.target import parse_target  # noqa: E402
from adaptune.measure.verify import TOLERANCE, relative_error  # noqa: E402
from adaptune.model.library.op import workload_call  # noqa: E402
from adaptune.measure.paired import paired_seconds, sample_alternately  # noqa: E402
from adaptune.model.timing import fma_peak_gflops, time_callable  # noqa: E402
from adaptune.model.workloads import NAMED, Workload, get_workload  # noqa: E402
from adaptune.tuner import tune_tir  # noqa: E402


def _convs(rows):
    """Workloads from (C, HW, K, kernel, stride) rows, padding kernel // 2."""
    return {f"{c}->{k} {r}x{r}/{s} @{hw}": Workload("conv2d_nhwc", (1, c, hw, hw, k, r, r, s, r // 2))
            for c, hw, k, r, s in rows}


GROUPS = {
    "paper": {name: NAMED[name].as_nhwc() for name in ("L1", "L2", "L3", "L4", "L5", "L6", "L7", "L8")},
    "resnet18": _convs([(3, 224, 64, 7, 2), (64, 56, 64, 3, 1), (64, 56, 128, 3, 2), (64, 56, 128, 1, 2),
                        (128, 28, 128, 3, 1), (128, 28, 256, 3, 2), (128, 28, 256, 1, 2), (256, 14, 256, 3, 1),
                        (256, 14, 512, 3, 2), (256, 14, 512, 1, 2), (512, 7, 512, 3, 1)]),
    "resnet50": _convs([(3, 224, 64, 7, 2), (64, 56, 64, 1, 1), (64, 56, 64, 3, 1), (64, 56, 256, 1, 1), (256, 56, 64, 1, 1), (256, 56, 128, 1, 1),
                        (128, 56, 128, 3, 2), (128, 28, 512, 1, 1), (256, 56, 512, 1, 2), (512, 28, 128, 1, 1),
                        (128, 28, 128, 3, 1), (512, 28, 256, 1, 1), (256, 28, 256, 3, 2), (256, 14, 1024, 1, 1),
                        (512, 28, 1024, 1, 2), (1024, 14, 256, 1, 1), (256, 14, 256, 3, 1), (1024, 14, 512, 1, 1),
                        (512, 14, 512, 3, 2), (512, 7, 2048, 1, 1), (1024, 14, 2048, 1, 2), (2048, 7, 512, 1, 1),
                        (512, 7, 512, 3, 1)]),
    "bert": {f"dense 128x{k}->{n}": get_workload(f"linear:128,{n},{k}") for n, k in
             ((768, 768), (3072, 768), (768, 3072))},
}


def layers(names) -> dict[str, Workload]:
    """The named layers and groups, each distinct shape once (ResNet-18 shares three with L6-L8)."""
    out, seen = {}, set()
    for name in names:
        group = GROUPS.get(name)
        if group is None:
            found = [g[name] for g in GROUPS.values() if name in g]
            if not found:
                sys.exit(f"kernels_vs_onednn.py: unknown layer {name!r}; use a group ({', '.join(GROUPS)}) or a name in one")
            group = {name: found[0]}
        for label, wl in group.items():
            if (wl.kind, wl.shape) not in seen:
                seen.add((wl.kind, wl.shape))
                out[label] = wl
    return out


def kernel_call(wl: Workload, sch, target):
    """The tuned kernel as a callable on random inputs, built as it was measured (weights in the
    packed layout, the packing itself left out as a model does it once)."""
    from adaptune._tvm import ms
    f = fast_build(sch.mod, target, None)["main"]
    args = [tvm.runtime.tensor(np.random.default_rng(0).standard_normal([int(d) for d in a.shape]).astype("float32"))
            for a in ms.arg_info.ArgInfo.from_entry_func(sch.mod, remove_preproc=True)]
    return lambda: f(*args)


#: short samples per round and contender: this VM's slow phases last seconds (docs/decisions.md)
SAMPLES_PER_ROUND, SAMPLE_MS = 5, 100


def alternated_seconds(calls: dict, samples: int) -> dict:
    """Seconds per call of each contender: ``samples`` short samples each, alternated
    (``paired.sample_alternately``); with oneDNN among them, each is oneDNN's median times the median
    of its paired ratios to oneDNN's sample of the same round (``paired.paired_seconds``), so a slow
    phase that hits a few rounds slows both sides of their pairs; else each contender's own median."""
    times = sample_alternately({k: (lambda f=f: time_callable(f, repeat=1, min_repeat_ms=SAMPLE_MS))
                                for k, f in calls.items()}, samples)
    if "onednn" in times:
        return paired_seconds(times, "onednn")
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", nargs="+", default=list(GROUPS), help="groups (paper resnet18 resnet50 bert) "
                    "or layer names")
    ap.add_argument("--spaces", nargs="+", default=["generic", "expert"], choices=["generic", "expert", "both"])
    ap.add_argument("--trials", nargs=2, type=positive_int, default=[64, 256], metavar=("FIRST", "TOTAL"),
                    help="report the best kernel after FIRST and after TOTAL trials (default 64 256)")
    ap.add_argument("--rounds", type=positive_int, default=3,
                    help=f"timing rounds of {SAMPLES_PER_ROUND} alternated {SAMPLE_MS} ms samples per contender")
    ap.add_argument("--strategy", default="chameleon")
    ap.add_argument("--out", default="bench/out/kernels")
    ap.add_argument("--target", default=None)
    args = ap.parse_args()
    target = parse_target(args.target)
    out = Path(args.out)
    chosen = layers(args.layers)
    first, total = sorted(args.trials)
    peak = fma_peak_gflops(target)
    print(f"target {target}; FMA peak {peak:.0f} GFLOPS on {tvm.get_global_func('runtime.NumThreads')()} threads; "
          f"{len(chosen)} layers, spaces {' '.join(args.spaces)}, {first} and {total} trials", flush=True)
    rows = []
    measurer = Measurer(target)
    try:
        for label, wl in chosen.items():
            calls, errors = {}, {}
            for space in args.spaces:
                wd = out / f"{label.replace(' ', '_').replace('/', 's').replace('>', '')}-{space}"
                shutil.rmtree(wd, ignore_errors=True)
                for trials in (first, total):
                    res = tune_tir(wl.mod(), target, strategy=args.strategy, trials=trials, work_dir=wd,
                                   resume=trials == total, measurer=measurer, label=label, spaces=space)
                    ok, err = check_numerics(wl, res.best_schedule, target)
                    errors[(space, trials)] = err
                    if ok:
                        calls[(space, trials)] = kernel_call(wl, res.best_schedule, target)
                    print(f"  {label} {space} {trials} trials: best {res.best_latency * 1e3:.4f} ms while tuning, "
                          f"{'PASS' if ok else 'FAIL'} vs numpy ({err:.1e})", flush=True)
            onednn, errors["onednn"] = workload_call(wl)
            if errors["onednn"] <= TOLERANCE:
                calls["onednn"] = onednn
            gflops = {k: wl.flops / s / 1e9 for k, s in alternated_seconds(calls, SAMPLES_PER_ROUND * args.rounds).items()}
            rows.append({"layer": label, "workload": wl.label, "mflop": wl.flops / 1e6,
                         "gflops": {("/".join(map(str, k)) if isinstance(k, tuple) else k): v for k, v in gflops.items()},
                         "errors": {("/".join(map(str, k)) if isinstance(k, tuple) else k): v for k, v in errors.items()}})
            print(f"{label}: " + ", ".join(f"{r} {g:.1f} GF" for r, g in rows[-1]["gflops"].items()), flush=True)
    finally:
        measurer.close()
    cols = [f"{s}/{t}" for s in args.spaces for t in (first, total)]
    print(f"\nGFLOPS ({SAMPLES_PER_ROUND * args.rounds} alternated samples each, paired with oneDNN's; "
          f"peak {peak:.0f}); x = / oneDNN\n")
    head = f"{'layer':34s} {'MFLOP':>8s} {'oneDNN':>8s} " + " ".join(f"{c:>16s}" for c in cols)
    print(head)
    for r in rows:
        od = r["gflops"].get("onednn")
        cells = []
        for c in cols:
            g = r["gflops"].get(c)
            cells.append(f"{'-':>16s}" if g is None else f"{g:7.1f} {g / od if od else math.nan:5.2f}x  ")
        print(f"{r['layer']:34s} {r['mflop']:8.1f} {od or math.nan:8.1f} " + " ".join(cells))
    ratios = {c: geomean([r["gflops"].get(c, math.nan) / r["gflops"].get("onednn", math.nan) for r in rows])
              for c in cols}
    print(f"{'geomean / oneDNN':34s} {'':8s} {'1.00':>8s} " + " ".join(f"{'':7s} {ratios[c]:5.2f}x  " for c in cols))
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels.json").write_text(json.dumps({"target": str(target), "peak_gflops": peak, "trials": [first, total],
                                                  "rows": rows, "geomean_vs_onednn": ratios}, indent=1))
    print(f"\nwrote {out / 'kernels.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
