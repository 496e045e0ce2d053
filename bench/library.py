"""A model end to end with and without Woodpecker's per-operator library choice (issue: Woodpecker).

From one tuning log: TVM with every kernel generated, TVM with each conv/matmul on whichever of
PyTorch's kernel and ours measured faster, PyTorch eager and ONNX Runtime, one run on this machine.
Every compiled model is checked against PyTorch before it is timed.  PyTorch eager is timed twice:
in this process (OMP_WAIT_POLICY=PASSIVE, which adaptune sets so PyTorch and TVM threads can take
turns) and in a fresh process with the environment you started with, and the faster one is the
baseline, so the policy can only make our ratio look worse.

    python bench/library.py --db bench/out/e2e/resnet18-adaptune     # reuse a tuning log
    python bench/library.py --model demo-cnn --trials 32               # tune first (minutes)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import adaptune
from adaptune import compile as C
from adaptune.frontends import load_model, ort_session
from adaptune.library import chosen, plan_model
from adaptune.scheduler import tune_model
from adaptune.target import host_target
from adaptune.zoo import MODELS

EAGER = """
import sys, torch
from adaptune.zoo import MODELS
from adaptune.compile import time_callable
ctor, shape = MODELS[sys.argv[1]]
m, x = ctor().eval(), torch.randn(*shape)
def f():
    with torch.no_grad():
        m(x)
print(time_callable(f))
"""


def eager_fresh_process(name: str, env: dict) -> float:
    """PyTorch eager in a fresh interpreter (the policy adaptune sets removed when the user had none)."""
    out = subprocess.run([sys.executable, "-c", EAGER, name], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--db", default=None, help="work dir of a finished tuning run (default: tune now)")
    ap.add_argument("--trials", type=int, default=64, help="trials when tuning first")
    ap.add_argument("--out", default="bench/out/library")
    args = ap.parse_args(argv)
    user_env = dict(os.environ)
    if adaptune.OMP_POLICY_SET_HERE:
        user_env.pop("OMP_WAIT_POLICY")       # set by adaptune's import, not by the user
    target = host_target()
    model = load_model(args.model)
    x = model.example_inputs()
    db_dir = Path(args.db) if args.db else Path(args.out) / f"{args.model}-tuned"
    if not args.db:
        print(f"tuning {args.model} for {args.trials} trials ...", flush=True)
        tune_model(model, target, trials=args.trials, work_dir=db_dir)
    db = C.open_database(db_dir)
    rows = []

    def add(name, ex, note=""):
        err = C.check(ex, model, x)
        rows.append((name, C.time_vm(ex, x), f"max err {err:.1e}{note}"))
        print(f"  {name}: {rows[-1][1] * 1e3:.3f} ms", flush=True)

    print(f"{args.model}, target {target}, log {db_dir}", flush=True)
    add("TVM untuned", C.build_untuned(model, target))
    add("TVM tuned, all generated (--no-library)", C.build_tuned(model, db, target))
    choices = plan_model(model, db, target)
    lib_ops = chosen(choices)
    add("TVM tuned + library choice", C.build_tuned(model, db, target, lib_ops),
        f"; {len(lib_ops)}/{len(choices)} signatures on PyTorch")

    import torch
    xt = [torch.from_numpy(a) for a in x]

    def eager():
        with torch.no_grad():
            model.torch_module(*xt)
    here = C.time_callable(eager)
    fresh = eager_fresh_process(args.model, user_env) if args.model in MODELS else here
    rows.append(("PyTorch eager", min(here, fresh),
                 f"in-process {here * 1e3:.2f} ms, fresh process {fresh * 1e3:.2f} ms, "
                 f"{torch.get_num_threads()} threads"))
    sess = ort_session(model.onnx_proto())
    feed = {i.name: a for i, a in zip(sess.get_inputs(), x)}
    rows.append(("ONNX Runtime", C.time_callable(lambda: sess.run(None, feed)), ""))

    eager_s = next(s for n, s, _ in rows if n == "PyTorch eager")
    print(f"\n{args.model} batch 1, {target}")
    print(f"{'runtime':42s} {'latency ms':>11s} {'vs PyTorch eager':>17s}  note")
    for name, lat, note in rows:
        print(f"{name:42s} {lat * 1e3:11.3f} {eager_s / lat:16.2f}x  {note}")
    print("\nper-operator choice (PyTorch's kernel vs our best fused kernel):")
    print(f"  {'operator':40s} {'calls':>5s} {'PyTorch ms':>10s} {'tuned ms':>9s}  uses")
    for c in choices:
        gen = "-" if c.generated_s is None else f"{c.generated_s * 1e3:9.3f}"
        print(f"  {c.op.label:40s} {c.calls:5d} {c.library_s * 1e3:10.3f} {gen:>9s}  "
              f"{'PyTorch' if c.use_library else 'generated'}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.model}-library.json").write_text(json.dumps(
        {"db": str(db_dir), "rows": [{"name": n, "latency_s": s, "note": t} for n, s, t in rows],
         "choices": [c.as_dict() for c in choices]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
