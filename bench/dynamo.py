"""``torch.compile(model, backend="adaptune")`` on zoo models: checked against eager, timed beside
eager, and compiled a second time from the same work dir with every measurement refused.

    python bench/dynamo.py                                    # resnet18 and bert-base, 64 trials each
    python bench/dynamo.py --models demo-cnn --trials 16      # a few minutes

Per model: the first ``torch.compile`` call tunes and builds (its wall time printed); the output
is compared with eager PyTorch on the model's own example inputs (real token ids for BERT); then
``torch._dynamo.reset()`` and a second compile with the same work dir, with
``Measurer.measure`` replaced by a function that raises, so a second call that measured anything
fails the run; finally eager and the compiled model are timed alternately (median of rounds).
"""
from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from adaptune.measure import run as measure
from adaptune.model.frontends import load_model
from adaptune.measure.paired import sample_alternately
from adaptune.model.timing import time_callable
from adaptune.measure.verify import TOLERANCE, max_relative_error


def _compile(module, work_dir: Path, trials: int):
    torch._dynamo.reset()
    return torch.compile(module, backend="adaptune", options={"trials": trials, "work_dir": str(work_dir)})


def _max_error(got, want) -> float:
    from torch.utils._pytree import tree_leaves
    return max_relative_error([g.detach().numpy() for g in tree_leaves(got)],
                              [w.detach().numpy() for w in tree_leaves(want)])


def run(name: str, trials: int, out: Path, rounds: int) -> dict:
    model = load_model(name)
    module = model.torch_module
    args, kwargs = model.torch_args([torch.from_numpy(a) for a in model.example_inputs()])
    work_dir = out / name
    shutil.rmtree(work_dir, ignore_errors=True)
    with torch.no_grad():
        want = module(*args, **kwargs)
        t = time.perf_counter()
        compiled = _compile(module, work_dir, trials)
        got = compiled(*args, **kwargs)
        first_s = time.perf_counter() - t
        error = _max_error(got, want)
        assert error <= TOLERANCE, f"{name}: compiled output differs from eager (max error {error:.1e})"

        def refuse(*_a, **_k):
            raise AssertionError("the second compile measured a kernel")
        original, measure.Measurer.measure = measure.Measurer.measure, refuse
        try:
            t = time.perf_counter()
            again = _compile(module, work_dir, trials)
            error2 = _max_error(again(*args, **kwargs), want)
            second_s = time.perf_counter() - t
        finally:
            measure.Measurer.measure = original
        assert error2 < 1e-3
        times = sample_alternately({"eager": lambda: time_callable(lambda: module(*args, **kwargs), repeat=5),
                                    "adaptune": lambda: time_callable(lambda: again(*args, **kwargs), repeat=5)},
                                   rounds)
    row = {"model": name, "trials": trials, "first_compile_s": first_s, "second_compile_s": second_s,
           "max_error": max(error, error2), "eager_ms": float(np.median(times["eager"])) * 1e3,
           "adaptune_ms": float(np.median(times["adaptune"])) * 1e3}
    print(f"{name}: first compile {first_s:.0f} s, second {second_s:.0f} s (nothing measured); max error "
          f"{row['max_error']:.1e}; eager {row['eager_ms']:.2f} ms, backend=\"adaptune\" {row['adaptune_ms']:.2f} ms "
          f"({row['eager_ms'] / row['adaptune_ms']:.2f}x)", flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["resnet18", "bert-base"])
    p.add_argument("--trials", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default="runs/bench-dynamo")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = [run(m, a.trials, out, a.rounds) for m in a.models]
    (out / "dynamo.json").write_text(json.dumps(rows, indent=1))
    print(f"wrote {out / 'dynamo.json'}")


if __name__ == "__main__":
    main()
