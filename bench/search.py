"""Woodpecker-DL Fig. 3a, reproduced: random vs genetic (ga) vs RL-search (rl-direct) vs chameleon
on the convolutions of Woodpecker's Table 1, same measurement budget, each against PyTorch's conv2d.

    python bench/search.py                               # all five convs, 32 trials each
    python bench/search.py --trials 4 --convs conv4 --strategies random,ga

Table 1 gives H, W, Cin, Cout, 3x3 and the stride, not the padding.  Its rows are one chain: each
conv's input is the previous one's output without padding (112x96 -> 110x94, stride 2 -> 54x46 ->
26x22 -> 12x10), so the default is VALID (pad 0), Woodpecker's other padding mode; ``--padding
same`` pads by 1.  Batch 1, NCHW.

PyTorch runs ``torch.nn.functional.conv2d`` timed like TVM's evaluator (``timing.time_callable``);
the paper's baseline is cuDNN, ours the host's PyTorch CPU kernel.  Every tuned kernel is checked
against numpy before its time is reported (tune_tir already rejects a new best that disagrees with
the untuned kernel); a kernel that fails shows FAIL and is left out of the geomean.  Prints one
table: per conv, each strategy's best latency and its speedup over PyTorch (> 1: faster), and a
geomean row; writes it as JSON to --out.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import numpy as np  # noqa: E402
from common import geomean, run_adaptune  # noqa: E402

from adaptune.model.timing import time_callable  # noqa: E402
from adaptune.measure.target import host_target  # noqa: E402
from adaptune.model.workloads import Workload  # noqa: E402

TABLE_1 = {  # name: (H, W, Cin, Cout, stride), 3x3 kernels
    "conv1a": (112, 96, 3, 64, 1),
    "conv1b": (110, 94, 64, 96, 2),
    "conv2": (54, 46, 96, 128, 2),
    "conv3": (26, 22, 128, 256, 2),
    "conv4": (12, 10, 256, 512, 1),
}


def workload(name: str, padding: str) -> Workload:
    h, w, cin, cout, stride = TABLE_1[name]
    return Workload("conv2d", (1, cin, h, w, cout, 3, 3, stride, 1 if padding == "same" else 0), name)


def time_pytorch(wl: Workload) -> tuple[float, float]:
    """(seconds per call, max relative error against numpy) of PyTorch's conv2d."""
    import torch

    x, w = wl.random_inputs()
    stride, pad = wl.shape[7], wl.shape[8]
    xt, wt = torch.from_numpy(x), torch.from_numpy(w)

    def run():
        with torch.no_grad():
            return torch.nn.functional.conv2d(xt, wt, stride=stride, padding=pad)
    ref = wl.reference([x, w])
    err = float(np.abs(run().numpy() - ref).max() / np.abs(ref).max())
    return time_callable(run), err


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=32, help="measurements per strategy and conv")
    ap.add_argument("--batch", type=int, default=8, help="configs per iteration (GA children, RL environments)")
    ap.add_argument("--convs", default=",".join(TABLE_1), help="comma-separated, from " + ", ".join(TABLE_1))
    ap.add_argument("--strategies", default="random,ga,rl-direct,chameleon")
    ap.add_argument("--padding", choices=["valid", "same"], default="valid")
    ap.add_argument("--out", default="bench/out/search")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    convs, strategies = args.convs.split(","), args.strategies.split(",")
    if unknown := [c for c in convs if c not in TABLE_1]:
        ap.error(f"unknown conv(s) {', '.join(unknown)}; choose from {', '.join(TABLE_1)}")
    logging.getLogger("tvm").setLevel(logging.WARNING)
    target = host_target()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"target {target}; {args.trials} trials per strategy and conv, batch {args.batch}, padding {args.padding}",
          flush=True)
    rows = {}
    for name in convs:
        wl = workload(name, args.padding)
        torch_s, torch_err = time_pytorch(wl)
        spec = "conv2d:" + ",".join(map(str, wl.shape))
        print(f"{name} {spec}: PyTorch {torch_s * 1e3:.3f} ms (max error {torch_err:.1e})", flush=True)
        rows[name] = {"pytorch": torch_s}
        for s in strategies:
            r = run_adaptune(wl, target, s, args.trials, args.batch, out, args.seed)
            rows[name][s] = r.best if r.numerics_ok else None
            print(f"{name} {s:10s} best {r.best * 1e3:8.3f} ms, numerics {'PASS' if r.numerics_ok else 'FAIL'}, "
                  f"wall {r.wall:.0f} s", flush=True)
    (out / "results.json").write_text(json.dumps({"trials": args.trials, "padding": args.padding, "seconds": rows},
                                                 indent=1))
    print(f"\nbest latency in ms (speedup over PyTorch's conv2d), {args.trials} trials each")
    print(f"{'conv':8s}{'pytorch':>10s}" + "".join(f"{s:>20s}" for s in strategies))
    for name, row in rows.items():
        cells = [f"{row[s] * 1e3:9.3f} ({row['pytorch'] / row[s]:5.2f}x)" if row[s] else "FAIL" for s in strategies]
        print(f"{name:8s}{row['pytorch'] * 1e3:10.3f}" + "".join(f"{c:>20s}" for c in cells))
    means = [geomean([row["pytorch"] / row[s] for row in rows.values() if row[s]]) for s in strategies]
    print(f"{'geomean':8s}{'':10s}" + "".join(f"({m:5.2f}x)".rjust(20) for m in means))


if __name__ == "__main__":
    main()
