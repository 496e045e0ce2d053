"""Woodpecker's per-operator library choice: offloading to PyTorch's kernels, and the switch off."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import tvm
from adaptune import compile as C
from adaptune._tvm import ms
from adaptune.cli import main
from adaptune.frontends import load_model
from adaptune.graph import extract_tasks, op_counts, optimise
from adaptune.library import Choice, chosen, find_ops, tasks_of


@pytest.fixture(scope="module")
def demo():
    return load_model("demo-cnn")


@pytest.fixture()
def empty_db(tmp_path):
    """A work dir whose database has no records: every kernel is TVM's untuned one."""
    wd = tmp_path / "wd"
    wd.mkdir()
    ms.database.JSONDatabase(work_dir=str(wd))
    return wd


def test_eligible_ops_are_found_and_mapped_to_their_fused_tasks(demo, target):
    optimised = optimise(demo.mod)
    ops = find_ops(optimised)
    assert sorted(o.kind for o in ops) == ["conv2d", "conv2d", "conv2d", "matmul"]
    tasks, _ = extract_tasks(optimised, target)
    for op in ops:
        hits = tasks_of(op, tasks)
        assert len(hits) == 1 and op.kind in hits[0].name
        assert hits[0].flops >= op.flops          # the fused kernel is the op plus its epilogue


def test_choice_takes_the_faster_side():
    op = next(iter(find_ops(optimise(load_model("demo-cnn").mod))))
    fast_lib, slow_lib, untuned = Choice(op, 1, 1e-3, 2e-3), Choice(op, 1, 3e-3, 2e-3), Choice(op, 1, 3e-3, None)
    assert [c.use_library for c in (fast_lib, slow_lib, untuned)] == [True, False, True]
    assert chosen([fast_lib, slow_lib]) == [op]


def test_one_conv_on_pytorch_matches_pytorch(demo, target, empty_db):
    db = C.open_database(empty_db)
    conv = next(o for o in find_ops(optimise(demo.mod)) if o.kind == "conv2d")
    mod = C.lower_tuned(demo, db, target, [conv])
    assert op_counts(mod)["call_pure_packed"] == 1
    ex = tvm.compile(mod, target=target)
    assert C.check(ex, demo) < 1e-4                       # reference: the PyTorch model itself
    # the epilogue left behind (bias + ReLU) is parallelised and vectorised
    scheduled = [f for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)
                 and "parallel" in f.script() and "vectorized" in f.script()]
    assert scheduled
    assert op_counts(C.lower_tuned(demo, db, target)).get("call_pure_packed", 0) == 0


def test_cli_flag_switches_library_choice_off_and_exported_model_loads_in_a_fresh_process(
        demo, empty_db, tmp_path, capsys):
    off, on = tmp_path / "off.so", tmp_path / "on.so"
    assert main(["compile", "demo-cnn", "--db", str(empty_db), "-o", str(off), "--no-library"]) == 0
    assert "0 conv/matmul signatures on PyTorch" in capsys.readouterr().out
    # with no tuning records every eligible op is faster on PyTorch than TVM's untuned kernel
    assert main(["compile", "demo-cnn", "--db", str(empty_db), "-o", str(on)]) == 0
    assert "4 conv/matmul signatures on PyTorch" in capsys.readouterr().out
    x = demo.example_inputs(seed=5)
    np.save(tmp_path / "x.npy", x[0])
    code = ("import sys, numpy as np; from adaptune import compile as C; "
            "print(repr(C.run_vm(C.load(sys.argv[1]), [np.load(sys.argv[2])])[0].tolist()))")
    for lib in (off, on):
        out = subprocess.run([sys.executable, "-c", code, str(lib), str(tmp_path / "x.npy")],
                             capture_output=True, text=True, check=True).stdout
        np.testing.assert_allclose(np.array(eval(out)), demo.reference(x)[0], rtol=1e-4, atol=1e-4)
