"""Whole model end to end (issue: models): untuned TVM, TVM's stock tuning (MetaSchedule
evolutionary + XGBoost, gradient task scheduler) and adaptune at the same total trial budget,
PyTorch eager and ONNX Runtime, one run on this machine.  Every compiled model is checked against
PyTorch before it is timed.

    python bench/e2e.py                      # ResNet-18, batch 1, 224x224, 600 trials each
    python bench/e2e.py --model demo-cnn --trials 48     # a few minutes
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from adaptune import compile as C
from adaptune._build import fast_build
from adaptune._tvm import ms
from adaptune.frontends import load_model, ort_session
from adaptune.graph import fuse, optimise
from adaptune.measure import Measurer
from adaptune.scheduler import tune_model
from adaptune.target import host_target


def tune_ms(model, target, trials, batch, wd: Path, timeout=30.0) -> float:
    """TVM's stock model tuning on the same optimised graph, same build function and runner settings; wall s."""
    shutil.rmtree(wd, ignore_errors=True)
    m = Measurer(target, timeout=timeout)
    t0 = time.perf_counter()
    ms.relax_integration.tune_relax(
        fuse(optimise(model.mod), target), params={}, target=target, work_dir=str(wd), max_trials_global=trials,
        num_trials_per_iter=batch, builder=ms.builder.LocalBuilder(f_build=fast_build, timeout_sec=timeout),
        runner=m.runner, strategy="evolutionary", cost_model="xgb", seed=0)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--trials", type=int, default=600, help="total trial budget for each tuner")
    ap.add_argument("--strategy", default="chameleon")
    ap.add_argument("--ms-batch", type=int, default=16, help="MetaSchedule trials per iteration")
    ap.add_argument("--skip-ms", action="store_true", help="skip TVM's stock tuning (halves the run)")
    ap.add_argument("--out", default="bench/out/e2e")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target = host_target()
    model = load_model(args.model)
    x = model.example_inputs()
    rows = []        # (name, latency s, tuning wall s or None, max error)

    def add(name, ex, wall=None):
        err = C.check(ex, model, x)
        rows.append((name, C.time_vm(ex, x), wall, err))
        print(f"  {name}: {rows[-1][1] * 1e3:.3f} ms (max error {err:.1e})", flush=True)

    print(f"{args.model}, input {model.inputs[0][1]}, target {target}, budget {args.trials} trials", flush=True)
    add("TVM untuned", C.build_untuned(model, target))

    import torch
    xt = [torch.from_numpy(a) for a in x]

    def eager():
        with torch.no_grad():
            model.torch_module(*xt)
    rows.append(("PyTorch eager", C.time_callable(eager), None, 0.0))
    print(f"  PyTorch eager: {rows[-1][1] * 1e3:.3f} ms ({torch.get_num_threads()} threads)", flush=True)
    sess = ort_session(model.onnx_proto())
    feed = {i.name: a for i, a in zip(sess.get_inputs(), x)}
    got, want = sess.run(None, feed)[0], model.reference(x)[0]
    err = float(abs(got - want).max() / abs(want).max())
    assert err < 1e-3, f"ONNX Runtime output differs from PyTorch ({err:.1e})"
    rows.append(("ONNX Runtime", C.time_callable(lambda: sess.run(None, feed)), None, err))
    print(f"  ONNX Runtime: {rows[-1][1] * 1e3:.3f} ms", flush=True)

    wd_a = out / f"{args.model}-adaptune"
    shutil.rmtree(wd_a, ignore_errors=True)
    print(f"tuning with adaptune {args.strategy} ...", flush=True)
    res = tune_model(model, target, trials=args.trials, strategy=args.strategy, work_dir=wd_a)
    add(f"TVM + adaptune {args.strategy}", C.build_tuned(model, C.open_database(wd_a), target), res.wall_time)
    if not args.skip_ms:
        print("tuning with MetaSchedule evolutionary ...", flush=True)
        wd_m = out / f"{args.model}-ms-evolutionary"
        wall = tune_ms(model, target, args.trials, args.ms_batch, wd_m)
        add("TVM + MetaSchedule evolutionary", C.build_tuned(model, C.open_database(wd_m), target), wall)

    eager_s = rows[1][1]
    print(f"\n{args.model} batch 1, {args.trials} trials per tuner, {target}")
    print(f"{'runtime':34s} {'latency ms':>11s} {'vs PyTorch eager':>17s} {'tuning wall':>12s} {'max err':>8s}")
    for name, lat, wall, err in rows:
        w = f"{wall / 60:.1f} min" if wall else "-"
        print(f"{name:34s} {lat * 1e3:11.3f} {eager_s / lat:16.2f}x {w:>12s} {err:8.1e}")
    print("\nadaptune tasks by share of kernel time (weight x best kernel):")
    total = res.estimated_latency()
    for t in sorted(res.tasks, key=lambda t: -t.weight * (t.current or 0))[:8]:
        gf = f"{t.flops / t.current / 1e9:6.1f} GFLOPS" if t.flops and t.current else ""
        print(f"  {t.name:44s} x{t.weight} {t.trials:4d} trials {t.weight * t.current * 1e3:8.3f} ms "
              f"({100 * t.weight * t.current / total:4.1f}%) {gf}")
    (out / f"{args.model}-e2e.json").write_text(json.dumps(
        {"trials": args.trials, "rows": [{"name": n, "latency_s": l, "tuning_s": w, "max_err": e}
                                         for n, l, w, e in rows]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
