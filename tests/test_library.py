"""The vendor path: fused oneDNN calls for conv/dense chains in the NHWC graph, the per-chain choice
checked on the whole model, the fallback when oneDNN rejects a chain, and the bench table."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tvm
from tvm import relax
from adaptune.model import compile as C
from adaptune.model import library as L
from adaptune._tvm import ms
from adaptune.cli import main
from adaptune.model.frontends import load_model
from adaptune.model.graph import fuse, op_counts, optimise
from adaptune.scheduler import TaskSummary, next_task


class ResBlock(torch.nn.Module):
    """conv-BN-ReLU, conv-BN, + the block's input, ReLU; then a ReLU6 depthwise conv and a GELU dense."""
    example_input_shape = (1, 8, 12, 12)

    def __init__(self):
        super().__init__()
        self.c1, self.b1 = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8)
        self.c2, self.b2 = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8)
        self.dw = torch.nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x):
        y = torch.relu(self.b2(self.c2(torch.relu(self.b1(self.c1(x))))) + x)
        y = F.relu6(self.dw(y))
        return F.gelu(self.fc(y.mean((2, 3))))


@pytest.fixture(scope="module")
def block():
    torch.manual_seed(0)
    return load_model(ResBlock().eval(), input_shape=ResBlock.example_input_shape)


@pytest.fixture()
def empty_db(tmp_path):
    """A work dir whose database has no records: every kernel is TVM's untuned one."""
    wd = tmp_path / "wd"
    wd.mkdir()
    ms.database.JSONDatabase(work_dir=str(wd))
    return wd


def _nhwc(a):
    return tvm.runtime.tensor(np.ascontiguousarray(a.permute(0, 2, 3, 1).numpy()))


def test_fused_conv_bias_add_relu_matches_pytorch_unfused():
    torch.manual_seed(0)
    x, other = torch.randn(1, 16, 9, 11), torch.randn(1, 24, 5, 6)
    w, b = torch.randn(24, 16, 3, 3), torch.randn(24)
    want = F.relu(F.conv2d(x, w, b, stride=2, padding=1) + other)
    got = L.onednn_conv2d_add(_nhwc(x), _nhwc(other), tvm.runtime.tensor(w.numpy()), tvm.runtime.tensor(b.numpy()),
                              (1, 1), (2, 2), (1, 1), 1, "relu", 11)
    np.testing.assert_allclose(got.numpy(), want.permute(0, 2, 3, 1).numpy(), rtol=1e-4, atol=1e-4)
    # depthwise with clip(0, 6) as oneDNN's hardtanh, and a dense with GELU
    wd = torch.randn(16, 1, 3, 3)
    got = L.onednn_conv2d(_nhwc(x), tvm.runtime.tensor(wd.numpy()), tvm.runtime.tensor(np.zeros(16, "float32")),
                          (1, 1), (1, 1), (1, 1), 16, "hardtanh:0:6", 12)
    want = F.conv2d(x, wd, None, padding=1, groups=16).clamp(0, 6)
    np.testing.assert_allclose(got.numpy(), want.permute(0, 2, 3, 1).numpy(), rtol=1e-4, atol=1e-4)
    xl, wl, bl = torch.randn(3, 7, 16), torch.randn(5, 16), torch.randn(5)
    got = L.onednn_linear(tvm.runtime.tensor(xl.numpy()), tvm.runtime.tensor(wl.numpy()),
                          tvm.runtime.tensor(bl.numpy()), "gelu", 13)
    np.testing.assert_allclose(got.numpy(), F.gelu(F.linear(xl, wl, bl)).numpy(), rtol=1e-4, atol=1e-4)


class WinoBlock(torch.nn.Module):
    """Two 3x3 convs of 16 channels on a 9x11 map (tiles cut at both edges): conv+bias+ReLU and
    conv+bias+residual add+ReLU, then a ReLU6 one (clip as the post-op)."""
    example_input_shape = (1, 16, 9, 11)

    def __init__(self):
        super().__init__()
        self.c1, self.c2, self.c3 = (torch.nn.Conv2d(16, 16, 3, padding=1) for _ in range(3))

    def forward(self, x):
        y = torch.relu(self.c2(torch.relu(self.c1(x))) + x)
        return F.relu6(self.c3(y))


def test_winograd_chains_match_pytorch_and_load_in_a_fresh_process(target, empty_db, tmp_path):
    """Winograd F(4x4,3x3) (generated transforms around oneDNN's grouped GEMM) for conv+bias+ReLU,
    conv+bias+add+ReLU and conv+bias+clip, on inputs whose tiles run past both edges."""
    from adaptune.model import winograd
    torch.manual_seed(0)
    m = load_model(WinoBlock().eval(), input_shape=WinoBlock.example_input_shape)
    ops = L.find_ops(optimise(m.mod))
    assert all(winograd.supports(op) for op in ops) and len(ops) == 3
    mod = C.lower_tuned(m, C.open_database(empty_db), target, {op: "winograd" for op in ops})
    counts = op_counts(mod)
    assert counts["call_pure_packed"] == 3 and sum(v for k, v in counts.items() if "winograd" in k) == 6
    x = m.example_inputs(seed=4)
    ex = tvm.compile(mod, target=target)
    assert C.check(ex, m, x) < 1e-4
    # F(2x2,3x3), its GEMM generated (untuned here): 3x3 tiles of 2x2 over the 9x11 map, cut at both edges
    mod2 = C.lower_tuned(m, C.open_database(empty_db), target, {op: "winograd-generated-f2" for op in ops})
    assert sum(n for k, n in op_counts(mod2).items() if k.startswith("kernel:winograd_gemm_30x16x16_f2")) == 3
    assert C.check(tvm.compile(mod2, target=target), m, x) < 1e-4
    # exported, it loads and runs in a fresh process (the oneDNN GEMM registers on import)
    lib = C.export(ex, tmp_path / "wino.so")
    np.save(tmp_path / "x.npy", x[0])
    code = ("import sys, numpy as np; from adaptune.model import compile as C; "
            "np.save(sys.argv[3], C.run_vm(C.load(sys.argv[1]), [np.load(sys.argv[2])])[0])")
    subprocess.run([sys.executable, "-c", code, str(lib), str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
                   check=True, capture_output=True)
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), m.reference(x)[0], rtol=1e-4, atol=1e-4)


def test_the_all_generated_build_runs_winograd_with_its_tuned_gemm(target, tmp_path):
    """Each 3x3 chain's Winograd GEMM is a task of the model (one per shape); tuned, the all-generated
    build runs the chains where that timed faster than the direct kernel as Winograd with the tuned
    GEMM, checked, and races it against the direct build; neither calls the library."""
    from adaptune.model.winograd import gemm_name
    from adaptune.scheduler import tune_model
    torch.manual_seed(0)
    m = load_model(WinoBlock().eval(), input_shape=WinoBlock.example_input_shape)
    res = tune_model(m, target, trials=24, work_dir=tmp_path / "wd")
    gemms = [t for t in res.tasks if t.name.startswith("winograd_gemm_")]
    assert len(gemms) == 1 and gemms[0].weight == 3 and gemms[0].alternative and gemms[0].best is not None
    best = C.build_best(m, C.open_database(tmp_path / "wd"), target, library=False, rounds=1)
    assert len(best.choices) == 3 and all(c.winograd_generated_s is not None for c in best.choices)
    gen = best.builds[0]
    assert gen.name == "generated" and gen.library == L.generated_choice(best.choices)
    assert [b.name for b in best.builds] == (["generated", "generated, direct"] if gen.library else ["generated"])
    assert all(not b.on_library and b.error < 1e-4 for b in best.builds)
    if gen.library:
        counts = op_counts(C.lower_tuned(m, C.open_database(tmp_path / "wd"), target, gen.library))
        # one GEMM call per call of a chain the plan timed faster as Winograd (each chain is timed on its own)
        winograd_calls = sum(c.calls for c in best.choices if c.generated_impl == "winograd-generated")
        assert sum(n for k, n in counts.items() if k.startswith("kernel:" + gemm_name(next(iter(gen.library))))) \
            == winograd_calls


def test_the_race_gets_builds_with_winograd_kept_below_each_weight_size():
    """Winograd's weights outgrow the cache on the largest layers first: the race's extra all-generated
    builds keep each chain's F(4x4) form while its weight fits a size, then its F(2x2) form (16/9 of
    the direct weight, offered from 256x256 channels), then its direct kernel, one size at a time."""
    from adaptune.model.library.op import LibraryOp
    from adaptune.model.winograd import forms
    ops = {c: LibraryOp("conv2d", (1, 8, 8, c), (c, c, 3, 3), (1, 8, 8, c), ((1, 1), (1, 1), (1, 1), 1))
           for c in (64, 128, 256)}
    assert [len(forms(ops[c])) for c in (64, 128, 256)] == [2, 2, 3]

    def choice(c, calls=1, f2=True):      # both Winograd forms faster alone than the direct kernel
        return L.Choice(ops[c], calls, None, 1e-3, [], None, 5e-4, 6e-4 if f2 and c == 256 else None)
    caps = C.winograd_caps([choice(c) for c in (64, 128, 256)])
    assert [name for name, _ in caps] == ["generated, Winograd up to 4.0 MB weights (1 as F(2x2))"]
    assert [{op.weight[0]: impl for op, impl in kept.items()} for _, kept in caps] == [
        {64: "winograd-generated", 128: "winograd-generated", 256: "winograd-generated-f2"}]  # 6.8 MB: the caps stop
    # without the F(2x2) form, the 256-channel chain goes straight to its direct kernel
    assert [name for name, _ in C.winograd_caps([choice(c, f2=False) for c in (64, 128, 256)])] == [
        "generated, Winograd up to 2.2 MB weights"]
    # a form slower alone than the direct kernel is never raced
    slow = L.Choice(ops[256], 1, None, 1e-3, [], None, 5e-4, 2e-3)
    assert all(i != "winograd-generated-f2" for _, kept in C.winograd_caps([choice(64), choice(128), slow])
               for i in kept.values())
    assert C.winograd_caps([choice(64)]) == [] and C.winograd_caps([]) == []
    # 2.8 MB of Winograd weights in all (each called once): they fit any last-level cache
    assert C.winograd_caps([choice(c) for c in (64, 128)]) == []
    # called four times each, 11 MB: the caps race
    assert len(C.winograd_caps([choice(c, calls=4) for c in (64, 128)])) == 1


def test_chains_are_found_once_each_with_their_epilogues(block):
    ops = L.find_ops(optimise(block.mod))
    assert sorted(o.label for o in ops) == [
        "conv2d 8->8 3x3 s1 p1 @12x12+add+relu", "conv2d 8->8 3x3 s1 p1 @12x12+relu",
        "conv2d 8->8 3x3 s2 p1 g8 @12x12+hardtanh", "linear 1x8 -> 5+gelu"]
    assert all(n == 1 for n in ops.values())


def test_offloaded_model_matches_pytorch_and_only_layout_and_glue_stay_in_tvm(block, target, empty_db):
    db = C.open_database(empty_db)
    ops = {op: "onednn" for op in L.find_ops(optimise(block.mod))}
    mod = C.lower_tuned(block, db, target, ops)
    assert op_counts(mod)["call_pure_packed"] == 4
    assert C.check(tvm.compile(mod, target=target), block) < 1e-4
    assert op_counts(C.lower_tuned(block, db, target)).get("call_pure_packed", 0) == 0


def test_each_chain_maps_to_the_task_of_its_own_fused_kernel(block, target, empty_db, monkeypatch, capsys):
    """... the chain that reads the model's NCHW input too, whose own module transposes it first as
    the model does (one kernel: ``kernel_rewrites.fuse_input_transpose``); and the plan after tuning
    reuses the library timings tuning measured for the floors."""
    from adaptune.model.graph import extract_tasks
    optimised = optimise(block.mod)
    tasks, _ = extract_tasks(optimised, target)
    times = {}
    floors = L.task_floors(optimised, tasks, target, times)
    names = {t.name for t in tasks}
    assert len(floors) == 4 and set(floors) <= names and all(s > 0 for s in floors.values())
    assert all(("conv2d" in n or "matmul" in n) for n in floors)
    assert sum("nchw_input" in n for n in floors) == 1

    def no_second_timing(self, **kw):
        raise AssertionError(f"{self.label} timed twice")
    monkeypatch.setattr(L.LibraryOp, "time", no_second_timing)
    choices = L.plan(optimised, C.open_database(empty_db), target, times)
    assert "timed twice" not in capsys.readouterr().err and len([c for c in choices if c.library_s]) == 4
    assert sorted(c.library_s for c in choices if c.library_s is not None) == sorted(
        t for (op, impl), t in times.items() if impl == "onednn" and t is not None)


class ResidualFirst(torch.nn.Module):
    """``y + conv(conv(y))``, the residual first, as MobileNetV2 writes it; ``y`` is itself a conv chain."""
    example_input_shape = (1, 8, 6, 6)

    def __init__(self):
        super().__init__()
        self.c0, self.c1, self.c2 = torch.nn.Conv2d(8, 16, 1), torch.nn.Conv2d(16, 32, 1), torch.nn.Conv2d(32, 16, 1)

    def forward(self, x):
        y = self.c0(x)
        return y + self.c2(self.c1(y))


def test_a_chain_whose_residual_comes_first_finds_its_tuned_kernel(target):
    """The chain compared with a tuned kernel is built as the model adds: with the residual as the
    first operand, the chain's own module compiles to the model's task (else it had no tuned time)."""
    import tvm_ffi
    from adaptune.model.graph import extract_tasks
    from adaptune.model.library.choice import _chain_tasks
    optimised = optimise(load_model(ResidualFirst().eval(), input_shape=ResidualFirst.example_input_shape).mod)
    model_tasks = {tvm_ffi.structural_hash(t.mod) for t in extract_tasks(optimised, target)[0]}
    chains = {op.label: tasks for op, _, tasks in _chain_tasks(optimised, target)}
    assert sorted(chains) == ["conv2d 16->32 1x1 s1 p0 @6x6", "conv2d 32->16 1x1 s1 p0 @6x6+add",
                              "conv2d 8->16 1x1 s1 p0 @6x6"]
    assert all(tvm_ffi.structural_hash(t.mod) in model_tasks for tasks in chains.values() for t in tasks)


def test_chains_the_generated_build_runs_as_one_kernel_stay_generated_in_the_choice(target, empty_db):
    """A depthwise conv and the 1x1 conv it alone feeds are one generated kernel (``fuse_separable``),
    which the library has no fused call for: neither chain is a kernel of the model, so neither has
    a record, and the per-chain choice keeps both generated (the race times that kernel), while an
    untuned conv of its own goes to oneDNN."""
    from adaptune.model.graph import op_counts
    from adaptune.search.expert import x86_lanes
    if not x86_lanes(target):
        pytest.skip("the separable kernel is an x86 rewrite")
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 1), torch.nn.ReLU(),
                                torch.nn.Conv2d(32, 32, 3, padding=1, groups=32), torch.nn.ReLU6(),
                                torch.nn.Conv2d(32, 32, 1)).eval()
    m = load_model(block, input_shape=(1, 16, 8, 8))
    choices = {c.op.label.split(" @")[0]: c for c in L.plan(optimise(m.mod), C.open_database(empty_db), target)}
    assert sorted(choices) == ["conv2d 16->32 1x1 s1 p0", "conv2d 32->32 1x1 s1 p0", "conv2d 32->32 3x3 s1 p1 g32"]
    expansion = choices.pop("conv2d 16->32 1x1 s1 p0")
    assert expansion.own_kernel and expansion.generated_s is None and expansion.impl == "onednn"
    assert all(not c.own_kernel and c.generated_s is None and c.impl == "generated" for c in choices.values())
    ops = L.chosen(list(choices.values()) + [expansion])
    assert list(ops.values()) == ["onednn"]
    lowered = C.lower_tuned(m, C.open_database(empty_db), target, ops)
    assert sum("separable_conv2d" in k for k in op_counts(lowered)) == 1
    assert C.check(C.build_tuned(m, C.open_database(empty_db), target, ops), m) < 1e-4


def test_a_chain_oneDNN_rejects_falls_back_to_the_generated_kernel_with_one_warning(
        block, target, empty_db, monkeypatch, capsys):
    real = L.LibraryOp.time

    def fails_for_depthwise(self, **kw):
        if self.kind == "conv2d" and self.attrs[3] > 1:
            raise RuntimeError("unsupported\nsecond line")
        return real(self, **kw)
    monkeypatch.setattr(L.LibraryOp, "time", fails_for_depthwise)
    choices = L.plan(optimise(block.mod), C.open_database(empty_db), target)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "oneDNN cannot run conv2d 8->8 3x3 s2 p1 g8" in err[0] and "generated" in err[0]
    dw = next(c for c in choices if c.op.attrs and c.op.attrs[3] > 1)
    assert dw.library_s is None and not dw.use_library and dw.op not in L.eligible(choices)
    assert len(L.chosen(choices)) == 3          # untuned kernels: every other chain goes to oneDNN


def _inject_build_times(block, monkeypatch, seconds) -> list[int]:
    """Per chain the library looks faster for convolutions only (five builds: generated, library,
    choice, and the last two with serial glue), and each model timing returns ``seconds(i, n)`` for
    build ``i`` (in the order first timed) on its ``n``-th timing; returns the builds' indices in
    the order they were timed."""
    monkeypatch.setattr(L, "plan", lambda *a, **_: [
        L.Choice(op, 1, 1e-6, 1e-3) if op.kind == "conv2d" else L.Choice(op, 1, 1e-3, 1e-6)
        for op in L.find_ops(optimise(block.mod))])
    order, calls = [], []

    def fake_time(ex, inputs, **_):
        if id(ex) not in order:
            order.append(id(ex))
        i = order.index(id(ex))
        calls.append(i)
        return seconds(i, calls.count(i))
    monkeypatch.setattr(C, "time_vm", fake_time)
    return calls


def test_the_final_build_is_the_fastest_whole_model_even_when_the_per_chain_choice_is_slower(
        block, target, empty_db, monkeypatch):
    """Per chain the library looks faster, but the model built with that choice is the slowest:
    the generated build is kept (timings injected; the builds and their checks are real)."""
    calls = _inject_build_times(block, monkeypatch, lambda i, n: [1.0, 3.0, 5.0, 4.0, 6.0][i])
    best = C.build_best(block, C.open_database(empty_db), target, rounds=2)
    assert [b.name for b in best.builds] == ["generated", "library", "choice", "library, serial glue",
                                             "choice, serial glue"]
    assert best.best.name == "generated" and best.best.seconds == 1.0
    assert [calls.count(i) for i in range(5)] == [30, 30, 10, 10, 10]  # 5 x 2 rounds, then a run-off of the two fastest
    assert all(b.error < 1e-4 for b in best.builds)
    assert len(best.builds[1].library) == 4 and len(best.builds[2].library) == 3
    assert [(b.library, b.serial) for b in best.builds[3:]] == [(best.builds[1].library, True),
                                                                (best.builds[2].library, True)]


def test_the_generated_build_stays_in_the_run_off_when_a_slow_phase_hid_it(block, target, empty_db, monkeypatch):
    """The machine was slow while the generated build ran in the first race (third of five): it
    still runs in the run-off, is the fastest there, and is kept (timings injected)."""
    # generated (build 0): 9.0 in the first race's ten rounds, then 1.0
    calls = _inject_build_times(block, monkeypatch, lambda i, n: (9.0 if n <= 10 else 1.0) if i == 0
                                else [None, 3.0, 2.0, 6.0, 7.0][i])
    best = C.build_best(block, C.open_database(empty_db), target, rounds=2)
    assert [calls.count(i) for i in range(5)] == [30, 30, 30, 10, 10]  # the two fastest and the generated one
    assert best.best.name == "generated" and best.best.seconds == 1.0


def test_the_race_gets_a_build_with_records_chosen_cold_where_constants_outgrow_the_cache(
        block, target, empty_db, monkeypatch):
    """With a last-level cache smaller than the model's constants (a 1-byte cache here), the race has
    the all-generated build once more with its records chosen by their time with the weights cold;
    with the real cache (this block's constants are a few KB) it has not."""
    from adaptune.model import cold_weights
    names = [b.name for b in C.build_best(block, C.open_database(empty_db), target, library=False, rounds=1).builds]
    assert "generated, records timed with cold weights" not in names
    monkeypatch.setattr(cold_weights, "cache_bytes", lambda index, default=0: 1)
    best = C.build_best(block, C.open_database(empty_db), target, library=False, rounds=1)
    assert [b.name for b in best.builds][:2] == ["generated", "generated, records timed with cold weights"]
    assert all(b.error < 1e-4 for b in best.builds)


def test_builds_timed_in_different_phases_compare_by_their_paired_ratios():
    """The machine was 3x slower during the first race's ten rounds: the library build, timed only
    there, is 0.9x the generated build in every pair and is faster, though its own median (2.7)
    is far above the generated build's (1.0, most of its rounds in the run-off)."""
    from adaptune.measure.paired import paired_seconds
    s = paired_seconds({"generated": [3.0] * 10 + [1.0] * 20, "library": [2.7] * 10}, "generated")
    assert s == pytest.approx({"generated": 1.0, "library": 0.9})


def test_alternated_samples_reverse_the_order_every_other_round_and_skip_a_sampler_that_declines():
    """One sample per contender per round, order reversed each round; a sampler returning None (the
    slow untuned model after its first sample) adds nothing, and the others keep their rounds."""
    from adaptune.measure.paired import sample_alternately
    turns = []

    def sampler(name, seconds):
        def sample():
            turns.append(name)
            return None if name == "untuned" and turns.count("untuned") > 1 else seconds
        return sample

    got = sample_alternately({"a": sampler("a", 1.0), "b": sampler("b", 2.0), "untuned": sampler("untuned", 9.0)},
                             4, {"a": [0.5]})
    assert turns[:6] == ["a", "b", "untuned", "untuned", "b", "a"]
    assert got == {"a": [0.5, 1.0, 1.0, 1.0, 1.0], "b": [2.0] * 4, "untuned": [9.0]}


class DenseNorm(torch.nn.Module):
    """A 33-MFLOP matmul, then a layer norm: one big kernel and one glue kernel."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(256, 256) / 16)

    def forward(self, x):
        return F.layer_norm(x @ self.w, (256,))


def test_serial_glue_drops_the_parallel_loops_of_glue_kernels_only(target):
    """Records that parallelise every kernel (made by hand, so the test does not hang on what a
    short tuning run happens to find): with ``serial`` the layer norm's loops are serial, the
    matmul's stay parallel, and both builds match PyTorch."""
    from tvm import s_tir
    torch.manual_seed(0)
    model = load_model(DenseNorm().eval(), input_shape=(256, 256))
    fused = fuse(optimise(model.mod), target)
    db = ms.database.MemoryDatabase()
    for gv, func in fused.functions_items():
        if not isinstance(func, tvm.tirx.PrimFunc):
            continue
        mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
        sch = s_tir.Schedule(mod)
        for b in sch.get_child_blocks(sch.get_sblock("root")):
            sch.parallel(sch.get_loops(b)[0])
        db.commit_tuning_record(ms.database.TuningRecord(
            sch.trace, db.commit_workload(mod), run_secs=[1e-3], target=target,
            args_info=ms.arg_info.ArgInfo.from_prim_func(func)))

    def parallel(serial):
        lowered = C.lower_tuned(model, db, target, serial=serial)
        return {re.sub(r"\d+$", "", gv.name_hint): "T.parallel" in f.script() for gv, f in lowered.functions_items()
                if isinstance(f, tvm.tirx.PrimFunc)}
    assert parallel(False) == {"matmul": True, "layer_norm": True}
    assert parallel(True) == {"matmul": True, "layer_norm": False}
    for serial in (False, True):
        assert C.check(C.build_tuned(model, db, target, serial=serial), model) < 1e-4


def test_scheduler_spends_less_on_a_task_the_library_already_beats():
    gen_only = TaskSummary("a", 1, 1e9, 4e-3, best=2e-3, trials=8)
    covered = TaskSummary("b", 1, 1e9, 4e-3, best=2e-3, trials=8, library=5e-4)
    assert covered.claim == pytest.approx(gen_only.claim / 16)
    assert next_task([covered, gen_only]) == 1
    assert covered.in_model == 5e-4 and gen_only.in_model == 2e-3
    fresh = TaskSummary("c", 1, 1e9, 4e-3, best=2e-3, trials=1, library=5e-4)   # not yet given a fair try
    assert fresh.claim == pytest.approx(TaskSummary("d", 1, 1e9, 4e-3, best=2e-3, trials=1).claim)


def test_an_epilogue_with_several_output_blocks_compiles(target):
    """A split after an add (GPT-2's qkv) has several output blocks: it is left to TVM, not a crash."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 12), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.add(x, relax.const(np.ones((12,), "float32"))))
            parts = bb.emit(relax.op.split(y, 3, axis=1))
            out = bb.emit_output(relax.Tuple([relax.TupleGetItem(parts, i) for i in range(3)]))
        bb.emit_func_output(out)
    mod = L.schedule_epilogues(fuse(bb.get(), target))
    ex = tvm.compile(mod, target=target)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    a = np.arange(24, dtype="float32").reshape(2, 12)
    got = vm["main"](tvm.runtime.tensor(a))
    np.testing.assert_allclose(np.concatenate([g.numpy() for g in got], axis=1), a + 1)


@pytest.mark.slow
def test_cli_flag_switches_library_off_and_exported_model_loads_in_a_fresh_process(
        empty_db, tmp_path, capsys):
    demo = load_model("demo-cnn")
    off, on = tmp_path / "off.so", tmp_path / "on.so"
    assert main(["compile", "demo-cnn", "--db", str(empty_db), "-o", str(off), "--no-library", "--rounds", "1"]) == 0
    assert "0 chains as fused library calls" in capsys.readouterr().out
    # with no tuning records the library beats every untuned kernel, so the library build wins
    # (each chain on oneDNN's fused call or, for the 3x3 ones where it measures faster, Winograd)
    assert main(["compile", "demo-cnn", "--db", str(empty_db), "-o", str(on), "--rounds", "1"]) == 0
    said = re.search(r"(\d+) chains as fused library calls(?:, (\d+) as Winograd)?", capsys.readouterr().out)
    assert said and int(said[1]) + int(said[2] or 0) == 4
    x = demo.example_inputs(seed=5)
    np.save(tmp_path / "x.npy", x[0])
    code = ("import sys, numpy as np; from adaptune.model import compile as C; "
            "print(repr(C.run_vm(C.load(sys.argv[1]), [np.load(sys.argv[2])])[0].tolist()))")
    for lib in (off, on):
        out = subprocess.run([sys.executable, "-c", code, str(lib), str(tmp_path / "x.npy")],
                             capture_output=True, text=True, check=True).stdout
        np.testing.assert_allclose(np.array(eval(out)), demo.reference(x)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_bench_json_holds_every_row_each_checked(empty_db, tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["bench", "demo-cnn", "--db", str(empty_db), "--json", str(out), "--rounds", "1", "--profile"]) == 0
    text = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["model"] == "demo-cnn"
    assert [r["runtime"] for r in data["rows"]] == ["tvm-untuned", "adaptune-generated", "adaptune",
                                                   "pytorch-eager", "torch-compile", "onnxruntime"]
    for r in data["rows"]:
        assert r["latency_ms"] > 0 and r["max_error"] is not None and r["max_error"] < 1e-3
    paired = data["paired_vs_onnxruntime"]
    assert paired["onnxruntime"] == 1.0 and all(paired[r["runtime"]] > 0 for r in data["rows"])  # all sampled each round
    assert "library calls" in text and "where adaptune's model spends its time" in text
    assert re.search(r"1x\d+x\d+x\d+ -> 1x\d+x\d+x\d+", text)       # a kernel's shapes say which layer it is
    # the generated kernels' arithmetic against this CPU's FMA peak, measured in the same run
    assert re.search(r"arithmetic of the generated kernels: \d+\.\d+ GFLOP per inference, .* FMA peak, measured now: "
                     r"\d+ GFLOP/s", text) and "GFLOP/s hot" in text


def test_the_ratio_to_a_reference_is_paired_round_by_round():
    """Slow phases that fall on one runtime's samples in two rounds move the medians' ratio (1.2 here),
    not the paired one; a runtime sampled once (the slow untuned baseline) has no paired ratio."""
    from adaptune.model.evaluate import Evaluation
    own, ref = [0.8, 1.6, 2.4, 8.0, 3.5], [1.0, 2.0, 3.0, 4.0, 1.0]
    ev = Evaluation("m", [], samples={"adaptune": own, "onnxruntime": ref, "tvm-untuned": [9.0]})
    assert np.median(own) / np.median(ref) == pytest.approx(1.2)
    assert ev.paired("adaptune", "onnxruntime") == pytest.approx(0.8)
    assert ev.paired("tvm-untuned", "onnxruntime") is None and ev.paired("adaptune", "torch-compile") is None


def test_a_winograd_form_timed_no_faster_than_the_direct_kernel_gets_a_second_sample(monkeypatch, target):
    """One slow sample (a shared machine's transient slowdown) must not drop a Winograd form from
    every build: a form timed no faster than the direct kernel's record is timed once more and
    keeps the faster sample; a form that beats the record at once is timed once."""
    from adaptune.model.library import choice as CH
    model = load_model(torch.nn.Conv2d(16, 16, 3, padding=1).eval(), input_shape=(1, 16, 8, 8))

    class Record:
        run_secs = [1e-3]                                  # the direct kernel's recorded time

    class Database:
        def query_tuning_record(self, *_):
            return Record()

    for samples, expect_calls, expect in (([2e-3, 0.5e-3], 2, 0.5e-3), ([0.6e-3, 9.0], 1, 0.6e-3),
                                          ([3e-3, 2e-3], 2, 2e-3)):
        calls = []

        def fake(op, impl, *_a, samples=iter(samples), **_k):
            calls.append(impl)
            return next(samples)
        monkeypatch.setattr(CH, "_time_winograd", fake)
        [c] = CH.plan(optimise(model.mod), Database(), target, library=False)
        assert calls == ["winograd-generated"] * expect_calls
        assert c.generated_s == 1e-3 and c.winograd_generated_s == expect
        assert c.winograd_forms == (["winograd-generated"] if expect < 1e-3 else [])
