"""The expert x86 design space (search/expert.py): which kernels it covers, that every design space
decodes, builds and computes the right result, and that it fits the register file."""
import re

import numpy as np
import pytest
from conftest import bench_module

from adaptune.cli.ops import check_numerics
from adaptune.measure.target import parse_target
from adaptune.model.workloads import get_workload
from adaptune._tvm import s_tir
from adaptune.search.expert import (_reduction_block, covers, register_blocks, vector_blocks, vector_isa,
                                     weights_stationary)
from adaptune.search.knobs import space_generator
from adaptune.search.space import KnobSpace

COVERED = [
    "conv2d_nhwc:1,16,14,14,16,3,3,1,1",      # 3x3
    "conv2d_nhwc:1,5,13,13,24,3,3,2,1",       # odd input channels, prime width, stride 2
    "conv2d_nhwc:1,24,10,10,40,1,1,1,0",      # 1x1, a vector block that is not a power of two
    "conv2d_nhwc:1,8,11,11,16,1,1,2,0",       # 1x1 stride 2
    "depthwise_nhwc:1,24,15,15,3,2,1",        # depthwise stride 2
    "conv2d_nhwc:1,64,4,6,48,3,3,1,1",        # weights outweigh the input: channel blocks outermost
    "conv2d_nhwc:1,96,3,3,64,1,1,1,0",        # the same, 1x1
    "linear:6,48,40",                         # a model's dense layer (packed weight)
]
NOT_COVERED = [
    "conv2d_nhwc:1,16,9,9,5,3,3,1,1",         # 5 output channels: no vector block
    "conv2d:1,16,14,14,16,3,3,1,1",           # NCHW
    "dense:16,48,40",                         # weight not layout-free: every vector load a gather
]


@pytest.mark.parametrize("spec", COVERED)
def test_every_expert_design_space_builds_and_computes_the_right_result(spec, target):
    wl = get_workload(spec)
    assert covers(wl.mod(), target)
    space = KnobSpace(wl.mod(), target, seed=1, spaces="expert")
    rng = np.random.default_rng(0)
    for s in range(len(space.traces)):
        configs = space.random(2, rng)
        configs[:, 0] = s
        for sch, why, _ in space.decode_many(configs):
            assert sch is not None, why
            ok, err = check_numerics(wl, sch, target)
            assert ok, f"{spec}, design space {s}: max rel. error {err:.2e}"


def _model_task(block, input_shape, kind, target):
    """The one task named ``kind`` of a small PyTorch block, after adaptune's graph passes."""
    from adaptune.model import graph
    from adaptune.model.frontends import load_model
    tasks, _ = graph.extract_tasks(graph.optimise(load_model(block.eval(), input_shape=input_shape).mod), target)
    (task,) = [t for t in tasks if kind in t.name]
    assert covers(task.mod, target)
    return task


def _every_space_builds_and_computes(space, task, target, check_script):
    """Two random points of each design space build, pass ``check_script(script)`` and compute what
    the untuned kernel does."""
    from adaptune.measure.verify import KernelChecker
    checker, rng = KernelChecker(task.mod, target), np.random.default_rng(0)
    for s in range(len(space.traces)):
        configs = space.random(2, rng)
        configs[:, 0] = s
        for sch, why, _ in space.decode_many(configs):
            assert sch is not None, why
            check_script(str(sch.mod["main"]))
            ok, why = checker.check(sch.mod)
            assert ok, f"design space {s}: {why}"


def _one_parallel_loop_before(*blocks):
    """A script check: one parallel loop, and the blocks ``blocks`` inside it in that order."""
    def check(script):
        assert script.count("T.parallel") == 1
        at = [script.index(b) for b in ("T.parallel", *blocks)]
        assert at == sorted(at), f"{blocks} not inside the parallel loop in order"
    return check


@pytest.mark.parametrize("stride", [1, 2])
def test_a_depthwise_separable_kernel_computes_its_depthwise_rows_inside_the_pointwise_tile(stride, target):
    """``graph.fuse_separable``'s kernel (dw + bias + ReLU6 -> 1x1): every expert design space builds
    and computes what the untuned kernel does, with one parallel loop and the depthwise block inside it."""
    import torch
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Conv2d(32, 32, 3, stride, 1, groups=32), torch.nn.ReLU6(),
                                torch.nn.Conv2d(32, 48, 1))
    task = _model_task(block, (1, 32, 16, 16), "separable", target)
    space = KnobSpace(task.mod, target, seed=1, spaces="expert")
    assert len(space.traces) == len(vector_blocks(48, vector_isa(target)[0]))
    _every_space_builds_and_computes(space, task, target, _one_parallel_loop_before('T.sblock("group_conv2d_nhwc'))


@pytest.mark.parametrize("stride", [1, 2])
def test_an_expanded_separable_kernel_computes_each_bands_expansion_inside_its_parallel_loop(stride, target,
                                                                                             monkeypatch):
    """``fuse_separable``'s kernel with the 1x1 expansion before the depthwise one (L2 made small so
    that it forms): one design space per pair of vector blocks, each building and computing what the
    untuned kernel does, with one parallel loop over bands of rows and the expansion inside it."""
    import torch
    from adaptune.model import graph
    monkeypatch.setattr(graph, "l2_bytes", lambda: 1024)
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 1), torch.nn.ReLU6(),
                                torch.nn.Conv2d(32, 32, 3, stride, 1, groups=32), torch.nn.ReLU6(),
                                torch.nn.Conv2d(32, 48, 1))
    task = _model_task(block, (1, 16, 16, 16), "expanded_separable", target)
    space = KnobSpace(task.mod, target, seed=1, spaces="expert")
    lanes = vector_isa(target)[0]
    assert len(space.traces) == len(vector_blocks(48, lanes)) * len(vector_blocks(32, lanes))
    _every_space_builds_and_computes(space, task, target,
                                     _one_parallel_loop_before('T.sblock("conv2d_nhwc_update"'))   # the expansion


@pytest.mark.parametrize("stride", [1, 2])
def test_an_expanded_depthwise_kernel_computes_each_channel_blocks_expansion_inside_its_parallel_loop(stride, target):
    """``kernel_rewrites.fuse_expansion_depthwise``'s kernel (1x1 + ReLU6 -> depthwise, whose 1x1
    consumer has more channels than it has pixels): one design space per depthwise vector block and
    expansion vector block within it, each building and computing what the untuned kernel does,
    with one parallel loop over channel blocks and the expansion inside it."""
    import torch
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Conv2d(16, 64, 1), torch.nn.ReLU6(),
                                torch.nn.Conv2d(64, 64, 3, stride, 1, groups=64), torch.nn.ReLU6(),
                                torch.nn.Conv2d(64, 96, 1))
    task = _model_task(block, (1, 16, 6, 6), "expanded_depthwise", target)
    space = KnobSpace(task.mod, target, seed=1, spaces="expert")
    lanes = vector_isa(target)[0]
    assert len(space.traces) == sum(v % e == 0 for v in vector_blocks(64, lanes) for e in vector_blocks(64, lanes))
    _every_space_builds_and_computes(space, task, target, _one_parallel_loop_before(
        'T.sblock("conv2d_nhwc_update"', 'T.sblock("group_conv2d_nhwc_update"'))


@pytest.mark.parametrize("padding", [0, 1])
def test_a_convolution_of_the_nchw_input_transposes_it_in_its_padding_pass(padding, target):
    """``kernel_rewrites.fuse_input_transpose``'s kernel (the model's NCHW input -> conv + ReLU):
    every expert design space builds and computes what the untuned kernel does, with the transpose
    inlined (into the padding pass where there is one), no loop nest of its own."""
    import torch
    torch.manual_seed(0)
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, 2, padding), torch.nn.ReLU())
    task = _model_task(conv, (1, 3, 17, 17), "nchw_input", target)
    space = KnobSpace(task.mod, target, seed=1, spaces="expert")

    def check(script):
        assert "T_transpose" not in script and script.count("T.parallel") == 1 + padding
    _every_space_builds_and_computes(space, task, target, check)


@pytest.mark.parametrize("spec,stationary", [("conv2d_nhwc:1,64,4,6,48,3,3,1,1", True),
                                             ("conv2d_nhwc:1,96,3,3,64,1,1,1,0", True),
                                             ("conv2d_nhwc:1,16,14,14,16,3,3,1,1", False),
                                             ("conv2d_nhwc:1,16,4,4,96,1,1,1,0", False),    # an expansion
                                             ("depthwise_nhwc:1,24,15,15,3,2,1", False),
                                             ("linear:6,48,400", False)])
def test_the_outer_tile_order_follows_the_operand_sizes(spec, stationary, target):
    """Weights-stationary (channel blocks outermost) exactly for convolutions whose weights outweigh
    input and output together (an expansion's weights outweigh only its input); the fused parallel
    loop then starts with the channel blocks."""
    sch = s_tir.Schedule(get_workload(spec).mod())
    assert weights_stationary(sch, _reduction_block(sch)) == stationary
    space = KnobSpace(get_workload(spec).mod(), target, seed=1, spaces="expert")
    sch, why, _ = space.decode_many(space.random(1, np.random.default_rng(0)))[0]
    assert sch is not None, why
    if not spec.startswith("linear"):                # conv loops: ff (channels), nn, yy, xx
        fused = re.findall(r"for (\w+) in T.parallel", str(sch.mod["main"]))[-1]
        assert fused.startswith("ff_0") == stationary, fused


@pytest.mark.parametrize("spec", NOT_COVERED)
def test_an_uncovered_kernel_falls_back_to_the_generic_spaces(spec, target):
    wl = get_workload(spec)
    assert not covers(wl.mod(), target)
    expert = KnobSpace(wl.mod(), target, seed=1, spaces="expert")
    generic = KnobSpace(wl.mod(), target, seed=1, spaces="generic")
    assert expert.structures == generic.structures


def test_both_holds_the_generic_and_the_expert_spaces(target):
    mod = get_workload(COVERED[0]).mod()
    generic = KnobSpace(mod, target, spaces="generic")
    expert = KnobSpace(mod, target, spaces="expert")
    both = KnobSpace(mod, target, spaces="both")
    assert len(both.traces) == len(generic.traces) + len(expert.traces)
    assert set(both.structures) == set(generic.structures) | set(expert.structures)
    assert KnobSpace(mod, target).structures == expert.structures      # auto = expert
    with pytest.raises(ValueError, match="unknown design spaces"):
        space_generator(mod, target, "fancy")


def test_the_expert_knobs_are_the_templates(target):
    """One design space per output-channel vector block; knobs: register block, input-channel split,
    unroll depth; a ScheduleFn space carries RewriteLayout so the weights are packed."""
    space = KnobSpace(get_workload("conv2d_nhwc:1,32,14,14,64,3,3,1,1").mod(), target, spaces="expert")
    lanes, _ = vector_isa(target)
    assert len(space.traces) == len(vector_blocks(64, lanes))
    assert {k.kind for k in space.knobs[1:]} == {"categorical", "tile"}
    assert any(type(p).__name__ == "RewriteLayout" for p in space.postprocs)


def test_vector_blocks_are_whole_vectors_or_else_fill_the_extent():
    """Full vectors where they divide; else half a zmm and a zmm-and-ymm block that covers 24 or 40
    channels with one broadcast input (COVERED's 40-channel 1x1 builds and checks both)."""
    assert vector_blocks(64, 16) == [16, 32, 64] and vector_blocks(48, 16) == [16, 48]
    assert vector_blocks(24, 16) == [8, 24] and vector_blocks(40, 16) == [8, 40] and vector_blocks(72, 16) == [8, 24]
    assert vector_blocks(24, 8) == [8, 24] and vector_blocks(5, 16) == []


@pytest.mark.parametrize("mcpu,lanes,regs", [("znver4", 16, 32), ("znver1", 8, 16), ("x86-64", 4, 16)])
def test_register_blocks_fit_the_register_file(mcpu, lanes, regs):
    t = parse_target({"kind": "llvm", "mcpu": mcpu})
    assert vector_isa(t) == (lanes, regs)
    for extent in (7, 14, 28, 56, 112, 13):
        for vec in vector_blocks(64, lanes) or [8]:
            for b in register_blocks(extent, vec, lanes, regs):
                assert extent % b == 0 and b * -(-vec // lanes) <= regs - 4


def test_model_convolutions_get_the_expert_space(target):
    from adaptune.model.frontends import load_model
    from adaptune.model.graph import extract_tasks, optimise

    tasks, _ = extract_tasks(optimise(load_model("demo-cnn").mod), target)
    kinds = {t.name: covers(t.mod, target) for t in tasks}
    assert all(v for n, v in kinds.items() if "conv2d" in n), kinds
    assert not kinds["fused_matmul_add31"]           # 10 classes: no vector block divides them
    assert not any(v for n, v in kinds.items() if "conv2d" not in n), kinds


def test_tune_op_tunes_in_the_expert_space(tmp_path, target):
    from adaptune.tuner import tune_tir

    wl = get_workload("conv2d_nhwc:1,16,14,14,32,3,3,1,1")
    res = tune_tir(wl.mod(), target, trials=8, work_dir=tmp_path / "wd", seed=0)
    assert res.best_latency is not None and res.trials == 8
    assert KnobSpace(wl.mod(), target, spaces="expert").encode(res.best_schedule.trace) is not None
    ok, err = check_numerics(wl, res.best_schedule, target)
    assert ok, err


@pytest.mark.parametrize("spec", ["conv2d_nhwc:1,16,9,9,32,3,3,2,1", "conv2d:1,8,7,7,16,1,1,1,0",
                                  "depthwise_nhwc:1,32,9,9,3,1,1", "linear:4,32,24", "dense:4,32,24"])
def test_onednn_on_a_workloads_shape_computes_what_numpy_computes(spec):
    from adaptune.model.library import workload_call
    from adaptune.measure.verify import TOLERANCE

    call, err = workload_call(get_workload(spec))
    assert err <= TOLERANCE
    call()


def test_tune_op_prints_onednn_beside_the_tuned_kernel_and_writes_json(tmp_path, cli):
    import json

    spec = "conv2d_nhwc:1,16,14,14,32,3,3,1,1"
    code, out, err = cli("tune-op", spec, "--trials", "4", "--work-dir", str(tmp_path / "wd"), "--json",
                         str(tmp_path / "r.json"))
    assert code == 0, err
    assert "oneDNN, same shape" in out and "PASS" in out
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["trials"] == 4 and r["best_latency_ms"] > 0 and r["onednn_latency_ms"] > 0
    assert r["gflops"] == pytest.approx(get_workload(spec).flops / r["best_latency_ms"] / 1e6)


def test_the_kernels_benchmark_lists_each_shape_once():
    kernels = bench_module("kernels_vs_onednn")

    every = kernels.layers(list(kernels.GROUPS))
    assert len({(w.kind, w.shape) for w in every.values()}) == len(every)
    assert len(kernels.GROUPS["resnet50"]) == 23
    assert len(every) == 8 + (11 - 3) + (23 - 5) + 3    # ResNet-18 shares L6-L8; ResNet-50 five of those
    assert all(w.packed for w in every.values())


def test_a_weight_packed_to_its_own_shape_is_not_taken_for_a_wrong_result(target):
    """Winograd's batched GEMM has a square layout-free weight (36, 16, 16) that the template can pack
    transposed, keeping its shape.  The measured file takes the packed layout; checked on the
    unpacked weight, correct fast kernels were rejected as wrong (2 of 16 here before the fix)."""
    import tvm
    from adaptune.measure.verify import packs_arguments
    from adaptune.model.winograd import gemm
    from adaptune.tuner import tune_tir

    mod = tvm.IRModule({"main": gemm(16, 16, 16).with_attr("global_symbol", "main")})
    assert not packs_arguments(mod)
    space = KnobSpace(mod, target, seed=1, spaces="expert")
    sch, why, _ = space.decode_many(space.random(1, np.random.default_rng(0)))[0]
    assert sch is not None and packs_arguments(sch.mod), why
    res = tune_tir(mod, target, trials=16, seed=0)
    assert res.best_latency is not None and "wrong" not in res.failures, res.failures


def test_the_kernels_benchmark_pairs_each_kernel_with_onednn(monkeypatch):
    """A slow phase that covers one more of one contender's samples than of the other's decides by own
    medians (here 1.65x for a kernel 10% slower than oneDNN); paired with oneDNN's sample of the
    same round, the kernel stays 1.1x."""
    import statistics
    kernels = bench_module("kernels_vs_onednn")

    turns, own = [], {"ours": [], "onednn": []}

    def fake_timer(call, repeat, min_repeat_ms):
        turns.append(call())
        seconds = (3.0 if len(turns) <= 21 else 1.0) * {"onednn": 1.0, "ours": 1.1}[turns[-1]]   # slow, then quick
        own[turns[-1]].append(seconds)
        return seconds

    monkeypatch.setattr(kernels, "time_callable", fake_timer)
    seconds = kernels.alternated_seconds({"ours": lambda: "ours", "onednn": lambda: "onednn"}, 20)
    assert turns[:4] == ["ours", "onednn", "onednn", "ours"] and len(turns) == 40   # order reversed each round
    assert statistics.median(own["ours"]) / statistics.median(own["onednn"]) == pytest.approx(1.65)
    assert seconds["ours"] / seconds["onednn"] == pytest.approx(1.1)


def test_a_1kb_accumulator_tile_stays_on_the_stack_and_computes_the_same(target, avx512_target):
    """A 4 x 64 float tile (1024 bytes) is one ``TVMBackendAllocWorkspace`` call per tile in TVM's own
    pipeline; adaptune's (``measure/pipeline.py``) leaves it to LLVM's stack, bit for bit the same.
    The tile is a point of the AVX-512 space (16 zmm); it is built and run for the host."""
    from adaptune._tvm import ms, tvm
    from adaptune.measure.build import fast_build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    wl = get_workload("conv2d_nhwc:1,16,8,8,64,3,3,1,1")
    space = KnobSpace(wl.mod(), avx512_target, seed=1, spaces="expert")
    config = space.random(1, np.random.default_rng(0))[0]
    config[0] = 2                                              # vector block 64 (4 zmm per row)
    wb = next(k for k, knob in enumerate(space.knobs) if space.active[2, k] and knob.values == [1, 2, 4])
    config[wb] = 2                                             # 4 rows: 16 zmm, 1024 bytes
    sch = space.decode(config)[0]
    packed = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(sch.mod)
    stock, ours = tvm.build(packed, target=target), fast_build(sch.mod, target, None)
    allocs = [len(re.findall(r"load .*@__TVMBackendAllocWorkspace", m.inspect_source("ll"))) for m in (stock, ours)]
    assert allocs[1] < allocs[0]
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal([int(d) for d in a.shape]).astype("float32")
              for a in ms.arg_info.ArgInfo.from_entry_func(sch.mod, remove_preproc=True)]
    outs = []
    for m in (stock, ours):
        args = [tvm.runtime.tensor(a) for a in inputs]
        m["main"](*args)
        outs.append(args[-1].numpy())
    assert np.array_equal(outs[0], outs[1]) and np.abs(outs[1]).max() > 0
    assert check_numerics(wl, sch, target)[0]
