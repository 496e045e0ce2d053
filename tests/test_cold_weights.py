"""Records chosen with their weights cold (``model.cold_weights``): a model's constants are counted
once each; a kernel with large weights keeps, of its fastest records, the one its cold timing puts
first, and a kernel with small weights its best record; a candidate runs with its weights rotated
through copies past the cache."""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, s_tir
from tvm.s_tir import meta_schedule as ms
from tvm.script import tirx as T

from adaptune.model import cold_weights as CW

TARGET = tvm.target.Target({"kind": "llvm"})


def _matmul(k: int, name: str):
    """``y (4, k) = x (4, k) @ w (k, k)``, ``w`` a layout-free (constant) weight of 4 k^2 bytes."""
    @T.prim_func(s_tir=True)
    def f(x: T.Buffer((4, k), "float32"), w: T.Buffer((k, k), "float32"), y: T.Buffer((4, k), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True, "layout_free_buffers": [1]})
        for i, j, r in T.grid(4, k, k):
            with T.sblock("matmul"):
                vi, vj, vr = T.axis.remap("SSR", [i, j, r])
                with T.init():
                    y[vi, vj] = T.float32(0)
                y[vi, vj] = y[vi, vj] + x[vi, vr] * w[vr, vj]
    return f.with_attr("global_symbol", name)


def _traces(mod):
    """Three distinct traces of ``mod``: untouched, its row loop parallel, its column loop split."""
    out = []
    for kind in ("plain", "parallel", "split"):
        sch = s_tir.Schedule(mod)
        i, j, _ = sch.get_loops(sch.get_sblock("matmul"))
        if kind == "parallel":
            sch.parallel(i)
        elif kind == "split":
            sch.split(j, [None, 16])
        out.append(sch.trace)
    return out


def _database(funcs):
    """A memory database with three records of each function, hot times 1, 2 and 3 ms."""
    db = ms.database.MemoryDatabase()
    for f in funcs:
        mod = tvm.IRModule({"main": f.with_attr("global_symbol", "main")})
        wl = db.commit_workload(mod)
        for t, trace in zip((1e-3, 2e-3, 3e-3), _traces(mod)):
            db.commit_tuning_record(ms.database.TuningRecord(
                trace, wl, run_secs=[t], target=TARGET, args_info=ms.arg_info.ArgInfo.from_prim_func(f)))
    return db


def test_constants_are_counted_once_each():
    c = relax.const(np.ones((256,), "float32"))
    x = relax.Var("x", relax.TensorType((256,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        y = bb.emit(relax.op.add(x, c))
        bb.emit_func_output(bb.emit(relax.op.multiply(y, c)))
    assert CW.constant_bytes(bb.get()) == 1024


def test_a_kernel_with_large_weights_keeps_the_record_fastest_cold(monkeypatch):
    """The heavy kernel (1 MiB of weights) gets the record the cold timings put first (its slowest
    hot); the light one (16 KiB) keeps its hot-fastest record, and is never timed cold."""
    heavy, light = _matmul(512, "heavy"), _matmul(64, "light")
    db = _database([heavy, light])
    cold_ms = {1e-3: 5.0, 2e-3: 4.0, 3e-3: 2.0}       # hot time of a record -> its (injected) cold time
    timed = []

    def fake_sampler(rec, free, llc, workdir, index):
        timed.append((float(rec.run_secs[0]), free))
        return lambda: cold_ms[float(rec.run_secs[0])] * 1e-3
    monkeypatch.setattr(CW, "_cold_sampler", fake_sampler)
    fused = tvm.IRModule({"heavy": heavy, "light": light})
    out = CW.ColdChoice(db, TARGET, llc=1 << 20).database_for(fused)
    best = {name: out.query_tuning_record(tvm.IRModule({"main": f.with_attr("global_symbol", "main")}), TARGET, name)
            for name, f in (("heavy", heavy), ("light", light))}
    assert float(best["heavy"].run_secs[0]) == 3e-3 and float(best["light"].run_secs[0]) == 1e-3
    assert sorted(timed) == [(1e-3, [1]), (2e-3, [1]), (3e-3, [1])]


def test_a_candidate_runs_with_its_weights_rotated_past_the_cache(tmp_path):
    """A real candidate, built and timed: positive seconds per call, each call on the next weight copy."""
    f = _matmul(512, "heavy")
    db = _database([f])
    mod = tvm.IRModule({"main": f.with_attr("global_symbol", "main")})
    rec = db.get_top_k(db.commit_workload(mod), 1)[0]
    sample = CW._cold_sampler(rec, [1], 4 << 20, tmp_path, 0)
    assert 0 < sample() < 1 and 0 < sample() < 1
    assert CW._weight_bytes(f) == 1 << 20
