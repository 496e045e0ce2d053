"""Whole models: frontends, graph passes, the task scheduler, tuning + compile + export + resume,
the model CLI's bad-input contract, and the HTML report rendered in headless Chromium."""
from __future__ import annotations

import json
import shutil
import subprocess
import textwrap

import numpy as np
import pytest
import tvm
import tvm_ffi

from adaptune.model import compile as C
from adaptune.cli import main
from adaptune.model.frontends import ModelError, load_model
from adaptune.model.graph import extract_tasks, op_counts, optimise, pass_report
from adaptune.scheduler import TaskSummary, next_task, tune_model


def _onnx_model(op_type="Relu", in_shape=(1, 3, 16, 16)):
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    n, c, h, w = in_shape
    inits = [numpy_helper.from_array(rng.standard_normal((8, c, 3, 3)).astype("float32"), "W"),
             numpy_helper.from_array(rng.standard_normal((8,)).astype("float32"), "Bc"),
             numpy_helper.from_array(rng.standard_normal((10, 8 * h * w)).astype("float32"), "G")]
    nodes = [helper.make_node("Conv", ["X", "W", "Bc"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node(op_type, ["c"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"], axis=1),
             helper.make_node("Gemm", ["f", "G"], ["Y"], transB=1)]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(in_shape))],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [n, 10])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture(scope="module")
def tiny_onnx(tmp_path_factory):
    import onnx
    path = tmp_path_factory.mktemp("onnx") / "tiny.onnx"
    onnx.save(_onnx_model(), str(path))
    return path


@pytest.fixture(scope="module")
def tuned(tiny_onnx, tmp_path_factory, target):
    """A tiny ONNX model tuned for 6 trials (shared by the compile, resume and report tests)."""
    wd = tmp_path_factory.mktemp("model") / "wd"
    model = load_model(str(tiny_onnx))
    res = tune_model(model, target, trials=6, strategy="chameleon", work_dir=wd)
    return model, res, wd


def test_checks_accept_correct_kernels_with_rewritten_weight_layouts(tuned):
    """Tasks whose weights MetaSchedule re-lays out are timed with other argument shapes; their
    checks must still pass (a regression once rejected every new best as wrong)."""
    import json
    _, _, wd = tuned
    errors = [json.loads(ln)["error"] for f in (wd / "tasks").glob("*.jsonl")
              for ln in f.read_text().splitlines() if ln.strip()]
    assert errors and "wrong" not in errors


# -- frontends -----------------------------------------------------------------------------------
def test_onnx_and_zoo_frontends_give_relax_modules_with_references(tiny_onnx):
    m = load_model(str(tiny_onnx))
    assert m.kind == "onnx" and m.inputs == [("X", (1, 3, 16, 16), "float32")]
    assert m.reference(m.example_inputs())[0].shape == (1, 10)
    z = load_model("demo-cnn")
    assert z.kind == "zoo" and z.inputs[0][1] == (1, 3, 32, 32) and z.torch_module is not None


def test_relax_module_frontend_uses_the_untuned_build_as_reference(target):
    from tvm import relax
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 8, 8), "float32"))
    w = relax.const(np.random.default_rng(0).standard_normal((4, 4, 3, 3)).astype("float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(relax.op.nn.conv2d(x, w, padding=1)))
        bb.emit_func_output(out)
    m = load_model(bb.get())
    assert m.kind == "relax" and m.inputs == [("x", (1, 4, 8, 8), "float32")]
    tasks, _ = extract_tasks(optimise(m.mod), target)
    # the NHWC graph: the fused conv reading the NCHW input itself, and a transpose at the output
    assert sorted(t.name.rstrip("0123456789") for t in tasks) == ["fused_conv2d_nchw_input_relu", "transpose"]
    assert C.check(C.build_untuned(m, target), m) == 0.0


@pytest.mark.parametrize("name", ["alexnet", "vgg16", pytest.param("mobilenetv2", marks=pytest.mark.slow)])
def test_zoo_models_import_and_split_into_tasks(name, target):
    from adaptune.model import zoo
    from adaptune.search.expert import x86_lanes
    m = load_model(name)
    assert m.inputs[0][1] == zoo.MODELS[name][1]
    tasks, summary = extract_tasks(optimise(m.mod), target)
    n_convs = sum(isinstance(x, zoo.nn.Conv2d) for x in m.torch_module.modules())
    # a separable kernel holds a depthwise conv and the 1x1 after it; an expanded one the 1x1 before it too
    # an expanded depthwise one a 1x1 expansion and the depthwise conv after it
    convs = lambda t: 3 if "expanded_separable" in t.name else 2 if "separable" in t.name or "expanded" in t.name else 1  # noqa: E731
    assert sum(t.weight * convs(t) for t in tasks if "conv2d" in t.name) == n_convs
    if name == "mobilenetv2" and x86_lanes(target):        # the four depthwise convs at 7x7 join their expansion
        assert sum(t.weight for t in tasks if "separable_conv2d" in t.name) == 17 - 4
        assert sum(t.weight for t in tasks if "expanded_depthwise_conv2d" in t.name) == 4
    assert summary["kernel_calls"] >= sum(t.weight for t in tasks if "conv2d" in t.name)


def test_pytorch_module_attr_frontend(tmp_path, monkeypatch):
    (tmp_path / "mynet.py").write_text(textwrap.dedent("""
        import torch
        class Net(torch.nn.Module):
            example_input_shape = (1, 4, 8, 8)
            def __init__(self):
                super().__init__()
                self.conv = torch.nn.Conv2d(4, 4, 3, padding=1)
            def forward(self, x):
                return torch.relu(self.conv(x))
    """))
    monkeypatch.chdir(tmp_path)
    m = load_model("mynet:Net")
    assert m.kind == "torch" and m.inputs[0][1] == (1, 4, 8, 8)
    ex = C.build_untuned(m)
    assert C.check(ex, m) < 1e-4


@pytest.mark.parametrize("spec, message", [
    ("no-such-model", "unknown model"),
    ("missing.onnx", "model file not found"),
    ("nosuchmodule_xyz:Net", "cannot load PyTorch model"),
])
def test_bad_model_specs_are_one_line_errors(spec, message):
    with pytest.raises(ModelError, match=message):
        load_model(spec)


def test_malformed_unsupported_and_mismatched_onnx(tmp_path):
    import onnx
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x01garbage" * 10)
    with pytest.raises(ModelError, match="malformed ONNX"):
        load_model(str(bad))
    odd = tmp_path / "odd.onnx"
    onnx.save(_onnx_model(op_type="Det"), str(odd))     # Det is a real ONNX op that TVM does not import
    with pytest.raises(ModelError, match="unsupported operator.*Det"):
        load_model(str(odd))
    ok = tmp_path / "ok.onnx"
    onnx.save(_onnx_model(), str(ok))
    with pytest.raises(ModelError, match="input shape mismatch"):
        load_model(str(ok), input_shape=(1, 3, 32, 32))
    with pytest.raises(ModelError, match="input shape mismatch"):
        load_model("demo-cnn", input_shape=(1, 3, 64, 64))


# -- graph passes and tasks ------------------------------------------------------------------------
def test_a_graph_convertlayout_rejects_stays_nchw_with_one_warning(monkeypatch, capsys):
    """The ``except tvm.error.InternalError`` around ConvertLayout is exercised (a wrong exception
    name there would turn TVM's refusal into a crash)."""
    from tvm import relax
    m = load_model("demo-cnn")

    def refuse(_mod):
        raise tvm.error.InternalError("ConvertLayout: no layout inference for topk")
    monkeypatch.setattr(relax.transform, "ConvertLayout", lambda *_a: refuse)
    out = optimise(m.mod)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "stays NCHW" in err[0] and "topk" in err[0]
    assert "permute_dims" not in op_counts(out) and C.check(C.build_untuned(m), m) < 1e-4


def test_graph_passes_fold_batchnorm_and_tasks_carry_weights(target):
    m = load_model("resnet18")
    opt = optimise(m.mod)
    rep = pass_report(m.mod, opt)
    assert rep["before"]["nn.batch_norm"] == 20 and "nn.batch_norm" not in rep["after"]
    assert rep["after"]["nn.conv2d"] == 20
    tasks, summary = extract_tasks(opt, target)
    conv = [t for t in tasks if "conv2d" in t.name]
    assert sum(t.weight for t in conv) == 20        # every conv call is covered, repeats share a task
    assert any(t.weight > 1 for t in conv)
    assert summary["tasks"] == len(tasks) < summary["kernel_calls"]
    assert tasks[0].flops * tasks[0].weight == max(t.flops * t.weight for t in tasks)


def test_optimise_keeps_its_latest_results_by_module_and_builds_leave_them_unchanged(target, monkeypatch):
    """A build race lowers one graph once per build: the passes run once per module object, a
    second module (the same graph) gets its own run, and fusing and offloading the cached graph
    (both rewrite through BlockBuilders) leave it as it was."""
    from adaptune.model import graph
    from adaptune.model.graph import fuse
    from adaptune.model.library import find_ops, offload
    runs = []
    real = graph._optimise
    monkeypatch.setattr(graph, "_optimise", lambda mod: runs.append(mod) or real(mod))
    m = load_model("demo-cnn")
    first = optimise(m.mod)
    assert optimise(m.mod) is first and len(runs) == 1
    other = load_model("demo-cnn").mod
    assert optimise(other) is not first and len(runs) == 2
    before = tvm_ffi.structural_hash(first)
    fuse(first, target)
    fuse(offload(first, {op: "onednn" for op in find_ops(first)}), target)
    assert tvm_ffi.structural_hash(first) == before and optimise(m.mod) is first


def test_constants_fold_with_numpy_to_what_tvms_fold_constant_gives(monkeypatch):
    """BatchNorm folding's arithmetic on constants is computed with numpy (TVM's FoldConstant
    compiles each call): the module equals FoldConstant's, constants bit for bit, and with
    FoldConstant turned into a no-op no constant arithmetic is left."""
    import torch
    from tvm import relax
    from adaptune.model import constants

    class ConvBN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16)
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)

        def forward(self, x):
            return torch.relu(self.bn(self.conv(x)))

    torch.manual_seed(0)
    m = load_model(ConvBN().eval(), input_shape=(1, 3, 8, 8))
    mod = relax.transform.DecomposeOpsForInference()(relax.transform.FoldBatchnormToConv2D()(m.mod))
    assert tvm_ffi.structural_equal(constants.fold_constants(mod), relax.transform.FoldConstant()(mod))

    monkeypatch.setattr(relax.transform, "FoldConstant", lambda: (lambda module: module))
    folded = constants.fold_constants(mod)
    arithmetic = {"add", "subtract", "multiply", "divide", "sqrt"}
    assert any(k in arithmetic for k in op_counts(mod))
    bound = {b.var: b.value for blk in folded["main"].body.blocks for b in blk.bindings}
    consts = lambda e: isinstance(bound.get(e, e), tvm.ir.expr.Constant)      # noqa: E731
    left = [b.value.op.name for blk in folded["main"].body.blocks for b in blk.bindings
            if isinstance(b.value, relax.Call) and b.value.op.name.removeprefix("relax.") in arithmetic
            and all(consts(a) for a in b.value.args)]
    assert not left


def test_convolutions_short_of_whole_vectors_run_padded_with_their_epilogues_fused(target):
    """24- and 40-channel convs (MobileNetV2's projections) compute 32 and 48 channels with zero
    weights on AVX-512 lanes, each one kernel with its bias, residual and ReLU6, and match PyTorch."""
    import torch
    import torch.nn.functional as F
    from adaptune.model.graph import fuse, pad_output_channels

    class Narrow(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.p, self.q = torch.nn.Conv2d(16, 24, 1), torch.nn.Conv2d(24, 24, 1)
            self.r, self.s = torch.nn.Conv2d(24, 40, 3, padding=1), torch.nn.Conv2d(40, 32, 1)

        def forward(self, x):
            y = self.p(x)
            return self.s(F.relu6(self.r(self.q(y) + y)))

    torch.manual_seed(0)
    m = load_model(Narrow().eval(), input_shape=(1, 16, 10, 10))
    fused = fuse(pad_output_channels(optimise(m.mod), lanes=16), target)
    kernels = {k.removeprefix("kernel:") for k in op_counts(fused) if k.startswith("kernel:")}
    padded = {k.split("_", 3)[-1]: k for k in kernels if "conv2d_padded" in k}      # epilogue -> kernel
    assert set(padded) == {"add1", "add_add11", "add2_maximum_minimum1"}    # bias; + residual; + ReLU6
    assert not any("strided_slice" in k for k in kernels)                   # no slice kernel of its own
    assert sum("conv2d" in k and "padded" not in k for k in kernels) == 1   # 40 -> 32: whole vectors already
    assert {e: int(fused[k].params[1].shape[0]) for e, k in padded.items()} == \
        {"add1": 32, "add_add11": 32, "add2_maximum_minimum1": 48}          # the zero-padded weights
    assert C.check(tvm.compile(fused, target=target), m) < 1e-5


def test_the_padding_width_follows_the_half_vector_fma_rate(monkeypatch):
    """Half-width vectors count as whole ones where this CPU runs their FMAs at 3/4 or more of the full
    width's FLOP/s (AMD Zen 4), not at half (Intel's 512-bit FMA ports); a target other than this host's
    CPU, or a model whose channels pad alike at both widths, is never measured and keeps whole vectors.
    With half vectors whole, 24 channels stay 24."""
    from adaptune.model import graph, kernel_rewrites, timing
    rates = {None: 224.0, 8: 215.0}
    monkeypatch.setattr(timing, "best_fma_peak_gflops", lambda t, lanes=None: rates[lanes])
    cpu = tvm.target.codegen.llvm_get_system_cpu()
    host = tvm.target.Target({"kind": "llvm", "mcpu": cpu})
    assert kernel_rewrites.pad_lanes(host, 16, {24, 64}) == 8
    rates[8] = 112.0
    assert kernel_rewrites.pad_lanes(host, 16, {24, 64}) == 16
    rates.clear()                                                   # measuring now raises KeyError
    other = tvm.target.Target({"kind": "llvm", "mcpu": "znver4" if cpu != "znver4" else "sapphirerapids"})
    assert kernel_rewrites.pad_lanes(other, 16, {24}) == 16 and kernel_rewrites.pad_lanes(host, 4, {6}) == 4
    assert kernel_rewrites.pad_lanes(host, 16, {3, 64, 512}) == 16      # 3 is not padded at all

    import torch
    m = load_model(torch.nn.Sequential(torch.nn.Conv2d(16, 24, 1), torch.nn.Conv2d(24, 64, 3)).eval(),
                   input_shape=(1, 16, 6, 6))
    assert kernel_rewrites.conv_output_channels(optimise(m.mod)) == {24, 64}
    avx512 = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})
    for width, channels in ((16, 32), (8, 24)):
        monkeypatch.setattr(graph, "pad_lanes", lambda t, lanes, co: width)
        fused = graph.fuse(optimise(m.mod), avx512)
        weights = [int(f.params[1].shape[0]) for gv, f in fused.functions_items() if "conv2d" in gv.name_hint]
        assert sorted(weights) == [channels, 64]


def test_the_nchw_input_is_read_by_the_convolutions_it_feeds(target):
    """The transposes ``ConvertLayout`` puts at the model's NCHW input are no kernels of their own:
    each convolution reading the input (24 channels: padded to 32 on AVX-512) reads the NCHW tensor,
    with its bias and ReLU fused; only the output's transpose is left; the module matches PyTorch."""
    import torch
    from adaptune.model.graph import fuse, fuse_input_transpose

    class Stem(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = torch.nn.Conv2d(3, 24, 3, 2, 1), torch.nn.Conv2d(24, 16, 1)

        def forward(self, x):
            return self.c2(torch.relu(self.c1(x)))

    class TwoReaders(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = torch.nn.Conv2d(3, 16, 3, 1, 1), torch.nn.Conv2d(3, 16, 1)

        def forward(self, x):
            return torch.relu(self.c1(x)) + self.c2(x)

    torch.manual_seed(0)
    for net, readers in ((Stem(), 1), (TwoReaders(), 2)):
        m = load_model(net.eval(), input_shape=(1, 3, 12, 12))
        fused = fuse(fuse_input_transpose(optimise(m.mod), lanes=16), target)
        counts = {k.removeprefix("kernel:"): n for k, n in op_counts(fused).items() if k.startswith("kernel:")}
        assert sum(n for k, n in counts.items() if "transpose" in k) == 1, counts     # the output's
        nchw = [k for k in counts if "conv2d_nchw_input" in k]
        assert len(nchw) == readers and any("relu" in k for k in nchw), counts
        assert all([int(d) for d in fused[k].params[0].shape] == [1, 3, 12, 12] for k in nchw)
        if readers == 1:
            assert int(fused[nchw[0]].params[1].shape[0]) == 32               # the zero-padded weight
        assert C.check(tvm.compile(fused, target=target), m) < 1e-5


def test_a_depthwise_convolution_and_the_pointwise_one_it_feeds_only_are_one_kernel(target, avx512_target):
    """dw + BatchNorm + ReLU6 -> 1x1 (24 channels, padded to 32) is one kernel; a depthwise conv whose
    channels are not whole vectors, one whose output is read twice, one feeding a 3x3 conv and one
    feeding a 1x1 conv with more output channels than pixels stay apart; the module computes what
    PyTorch does."""
    import torch
    import torch.nn.functional as F
    from adaptune.model.graph import fuse

    class Blocks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.dw1, self.bn = torch.nn.Conv2d(32, 32, 3, padding=1, groups=32), torch.nn.BatchNorm2d(32)
            self.pw1 = torch.nn.Conv2d(32, 24, 1)
            self.dw2, self.pw2 = torch.nn.Conv2d(24, 24, 3, padding=1, groups=24), torch.nn.Conv2d(24, 24, 1)
            self.dw3, self.c3 = torch.nn.Conv2d(32, 32, 3, 2, 1, groups=32), torch.nn.Conv2d(32, 24, 3, 2, 1)
            self.dw4, self.pw4 = torch.nn.Conv2d(32, 32, 3, padding=1, groups=32), torch.nn.Conv2d(32, 24, 1)
            self.dw5, self.pw5 = torch.nn.Conv2d(32, 32, 3, 2, 1, groups=32), torch.nn.Conv2d(32, 32, 1)  # 25 pixels
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)

        def forward(self, x):
            y = self.pw1(F.relu6(self.bn(self.dw1(x))))
            y = y + self.pw2(F.relu(self.dw2(y)))
            d = F.relu(self.dw4(x))
            wide = self.pw5(F.relu6(self.dw5(x))).mean()
            return y + self.c3(F.relu(self.dw3(x))).mean() + self.pw4(d) + d[:, :24] + wide

    torch.manual_seed(0)
    m = load_model(Blocks().eval(), input_shape=(1, 32, 10, 10))
    fused = fuse(optimise(m.mod), avx512_target)        # 16 lanes: 24 channels are not whole vectors
    kernels = {k.removeprefix("kernel:") for k in op_counts(fused) if k.startswith("kernel:")}
    separable = [k for k in kernels if "separable_conv2d" in k]
    assert len(separable) == 1
    assert [int(p.shape[0]) for p in fused[separable[0]].params[1:3]] == [32, 32]   # dw weight, padded 1x1
    assert sum("conv2d" in k and "separable" not in k for k in kernels) == 8      # dw2-5, pw2, c3, pw4, pw5
    assert C.check(tvm.compile(fused, target=target), m) < 1e-5


def test_an_expansion_that_outgrows_the_l2_caches_joins_its_depthwise_separable_kernel(target, avx512_target,
                                                                                       monkeypatch):
    """1x1 expansion + ReLU6 -> depthwise (stride 1, 2) + ReLU6 -> 1x1 projection is one kernel where
    the expanded tensor is larger than the cores' L2 together (made small here), its input the
    block's input; an expansion whose output is read twice, and every expansion where the L2 holds
    it, stay kernels of their own; the module computes what PyTorch does."""
    import torch
    import torch.nn.functional as F
    from adaptune.model import graph
    from adaptune.model.graph import fuse

    class Inverted(torch.nn.Module):
        def __init__(self):
            super().__init__()
            conv = torch.nn.Conv2d
            self.e1, self.d1, self.p1 = conv(16, 32, 1), conv(32, 32, 3, 1, 1, groups=32), conv(32, 16, 1)
            self.e2, self.d2, self.p2 = conv(16, 48, 1), conv(48, 48, 3, 2, 1, groups=48), conv(48, 24, 1)
            self.e3, self.d3, self.p3 = conv(24, 32, 1), conv(32, 32, 3, 1, 1, groups=32), conv(32, 24, 1)

        def forward(self, x):
            y = x + self.p1(F.relu6(self.d1(F.relu6(self.e1(x)))))
            y = self.p2(F.relu6(self.d2(F.relu6(self.e2(y)))))
            e = F.relu6(self.e3(y))
            return self.p3(F.relu6(self.d3(e))) + e.mean()

    torch.manual_seed(0)
    m = load_model(Inverted().eval(), input_shape=(1, 16, 12, 12))
    kernels = lambda f: [k.removeprefix("kernel:") for k in op_counts(f) if k.startswith("kernel:")]  # noqa: E731
    assert not any("expanded" in k for k in kernels(fuse(optimise(m.mod), avx512_target)))
    monkeypatch.setattr(graph, "l2_bytes", lambda: 4096)        # 8 KB on 2 cores: 12x12x32 is 18 KB
    fused = fuse(optimise(m.mod), avx512_target)
    expanded = sorted(k for k in kernels(fused) if "expanded_separable" in k)
    assert len(expanded) == 2 and sum("separable" in k for k in kernels(fused)) == 3, kernels(fused)
    assert sorted(tuple(int(d) for d in fused[k].params[1].shape) for k in expanded) == [(32, 1, 1, 16), (48, 1, 1, 16)]
    assert all([int(d) for d in fused[k].params[0].shape] == [1, 12, 12, 16] for k in expanded)
    assert C.check(tvm.compile(fused, target=target), m) < 1e-5


def _packed_model(target):
    """A conv + ReLU + 1x1 conv model and a database of expert-space records for it (which pack the
    weights), recorded untimed: a fixture, nothing is measured."""
    import torch
    from tvm.s_tir import meta_schedule as ms
    from adaptune.search.expert import covers
    from adaptune.search.space import KnobSpace

    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Conv2d(32, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(32, 48, 1))
    m = load_model(block.eval(), input_shape=(1, 32, 8, 8))
    tasks, _ = extract_tasks(optimise(m.mod), target)
    db, rng = ms.database.MemoryDatabase(), np.random.default_rng(0)
    for task in (t for t in tasks if covers(t.mod, target)):
        space = KnobSpace(task.mod, target, seed=1, spaces="expert")
        sch, why, _ = space.decode_many(space.random(1, rng))[0]
        assert sch is not None, why
        db.commit_tuning_record(ms.database.TuningRecord(
            sch.trace, db.commit_workload(task.mod), run_secs=[1e-3], target=target,
            args_info=ms.arg_info.ArgInfo.from_prim_func(task.mod["main"])))
    return m, db


def test_prepacked_weights_reach_the_kernel_calls_as_constants(target):
    """Kernels whose tuned schedule re-lays out their weights (the expert space's packed weights) get
    them pre-transformed at compile time; the VM passes them straight to each call rather than
    building and unpacking a tuple of them per call, and the model computes what PyTorch does."""
    m, db = _packed_model(target)
    lowered = C.lower_tuned(m, db, target)
    assert sum("layout_rewrite" in str(f.attrs) or "prepacked" in gv.name_hint
               for gv, f in lowered.functions_items()) >= 2          # both convolutions' weights packed
    ex = C.build_tuned(m, db, target)
    assert "vm.builtin.tuple_getitem" not in ex.as_text()
    assert C.check(ex, m) < 1e-4


def test_weight_packing_folds_in_one_build_to_what_fold_constant_gives(target, monkeypatch):
    """The weight-packing kernels split off the tuned ones run once each from one LLVM build
    (``constants.fold_calls``): the compiled module equals the one ``FoldConstant`` alone gives,
    constants bit for bit, and with ``FoldConstant`` a no-op no kernel call on constants is left."""
    from tvm import relax
    from adaptune.model import constants, graph

    m, db = _packed_model(target)
    lowered = C.lower_tuned(m, db, target)
    monkeypatch.setattr(graph, "fold_calls", lambda mod: mod)
    assert tvm_ffi.structural_equal(C.lower_tuned(m, db, target), lowered)
    monkeypatch.setattr(graph, "fold_calls", constants.fold_calls)
    monkeypatch.setattr(relax.transform, "FoldConstant",
                        lambda: tvm.transform.module_pass(lambda mod, _ctx: mod, opt_level=0, name="NoFold"))
    assert not constants._constant_calls(C.lower_tuned(m, db, target))
    monkeypatch.setattr(graph, "fold_calls", lambda mod: mod)
    assert constants._constant_calls(C.lower_tuned(m, db, target))     # the packing calls were there


def test_scheduler_warms_up_every_task_then_follows_time_share_per_trial():
    ts = [TaskSummary("a", 1, 1e9, 1.0, best=0.5, trials=8), TaskSummary("b", 4, 1e9, 1.0, trials=0)]
    assert next_task(ts) == 1                              # untried task first
    ts[1].trials, ts[1].best = 8, 0.2                       # b: 4 x 0.2 / 8 = 0.1 > a: 0.5 / 8
    assert next_task(ts) == 1
    ts[1].trials = 24                                      # b: 0.8 / 24 < a: 0.5 / 8
    assert next_task(ts) == 0
    ts[0].exhausted = True
    assert next_task(ts) == 1
    ts[1].exhausted = True
    assert next_task(ts) is None


# -- tune, compile, export, resume -----------------------------------------------------------------
def test_tuned_model_compiles_checks_exports_and_resumes(tuned, target, tmp_path):
    model, res, wd = tuned
    assert res.trials == 6 and all(t.trials >= 1 for t in res.tasks)     # warm-up reached every task
    meta = json.loads((wd / "model.json").read_text())
    assert {t["name"] for t in meta["tasks"]} == {t.name for t in res.tasks}
    ex = C.build_tuned(model, C.open_database(wd), target)
    assert C.check(ex, model) < 1e-4                       # against ONNX Runtime
    lib = C.export(ex, tmp_path / "model.so")
    x = model.example_inputs(seed=3)
    np.testing.assert_allclose(C.run_vm(C.load(lib), x)[0], model.reference(x)[0], rtol=1e-4, atol=1e-4)
    # resume: two more trials, nothing measured twice
    res2 = tune_model(model, target, trials=8, work_dir=wd, resume=True)
    assert res2.trials == 8 and res2.new_trials == 2
    for t in meta["tasks"]:
        rows = [json.loads(ln) for ln in (wd / "tasks" / f"{t['name']}.jsonl").read_text().splitlines()]
        configs = [tuple(r["config"]) for r in rows]
        assert len(configs) == len(set(configs))


def test_a_task_keeps_its_seed_when_the_task_list_is_reordered(tuned, target, monkeypatch):
    """A task's seed follows its workload, not its place among the tasks: a generic space's knob
    sizes depend on the seed, so a seed by position broke ``--resume`` once a graph pass added a task."""
    from adaptune import scheduler
    model, res, wd = tuned
    seeds: list[dict] = []

    class Spy(scheduler.TaskTuner):
        def __init__(self, mod, target, *, seed, label, **kw):
            seeds[-1][label] = seed
            super().__init__(mod, target, seed=seed, label=label, **kw)
    monkeypatch.setattr(scheduler, "TaskTuner", Spy)
    for order in (1, -1):
        seeds.append({})

        def extract_in_order(mod, tgt, order=order):
            tasks, summary = extract_tasks(mod, tgt)
            return tasks[::order], summary
        monkeypatch.setattr(scheduler, "extract_tasks", extract_in_order)
        tune_model(model, target, trials=res.trials, work_dir=wd, resume=True)    # opens every task, tunes none
    assert len(seeds[0]) >= 2 and seeds[0] == seeds[1]


def test_the_database_serves_the_untuned_kernel_where_it_is_the_fastest(tuned, target):
    """Compilation applies ``get_top_k(..., 1)``; for every task it must be the fastest record of
    its task log or its untuned kernel (TVM's database once skipped the untuned record's empty
    trace, so a 0.14 ms max-pool ran as a 2.8 ms tuned one)."""
    model, res, wd = tuned
    db = C.open_database(wd)
    tasks, _ = extract_tasks(optimise(model.mod), target)
    meta = {t["name"]: t for t in json.loads((wd / "model.json").read_text())["tasks"]}
    for t in tasks:
        # JSONDatabase ranks by mean run time, adaptune by median: two close records can swap, so
        # the fastest record by median (the untuned one included) must be among those TVM serves,
        # and the first of them must be the fastest by mean
        recs = db.get_top_k(db.commit_workload(t.mod), 10_000)
        best = min(x for x in (meta[t.name]["baseline"], meta[t.name]["best"]) if x is not None)
        medians = [float(np.median([float(x) for x in r.run_secs])) for r in recs]
        assert any(m == pytest.approx(best) for m in medians)
        means = [float(np.mean([float(x) for x in r.run_secs])) for r in recs]
        assert means[0] == min(means)
        untuned = [r for r, m in zip(recs, medians) if m == pytest.approx(meta[t.name]["baseline"])]
        if best == meta[t.name]["baseline"]:
            sch = tvm.s_tir.Schedule(t.mod)
            untuned[0].trace.apply_to_schedule(sch, remove_postproc=False)
            assert tvm_ffi.structural_equal(sch.mod, t.mod)


@pytest.mark.slow
def test_interrupted_model_tuning_is_resumable(tiny_onnx, target, tmp_path):
    model = load_model(str(tiny_onnx))
    wd = tmp_path / "wd"
    seen = []

    def stop_after_three(done, total, task, est):
        seen.append(done)
        if done == 3:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        tune_model(model, target, trials=10, work_dir=wd, on_progress=stop_after_three)
    res = tune_model(model, target, trials=4, work_dir=wd, resume=True)
    assert res.trials == 4 and res.new_trials == 1


# -- CLI ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["tune", "no-such-model"], "unknown model"),
    (["tune", "missing.onnx"], "model file not found"),
    (["tune", "demo-cnn", "--trials", "0"], "--trials must be a positive"),
    (["tune", "demo-cnn", "--batch-size", "-1"], "--batch-size must be a positive integer, got '-1'"),
    (["bench", "demo-cnn", "--rounds", "0"], "--rounds must be a positive integer, got '0'"),
    (["tune", "demo-cnn", "--input-shape", "1,3,x"], "--input-shape"),
    (["tune", "demo-cnn", "--target", "{bad json"], "target"),
    (["compile", "demo-cnn", "--db", "no-such-dir", "-o", "m.so"], "not an adaptune"),
    (["report", "no-such-dir"], "not a model work dir"),
])
def test_model_cli_bad_input_is_one_line_exit_2_and_writes_nothing(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("adaptune: error:") and message in err[0]
    assert list(tmp_path.iterdir()) == []


def test_model_cli_unsupported_operator_and_malformed_file(tmp_path, monkeypatch, capsys):
    import onnx
    monkeypatch.chdir(tmp_path)
    onnx.save(_onnx_model(op_type="Det"), "odd.onnx")
    (tmp_path / "bad.onnx").write_bytes(b"not an onnx file")
    for name, message in (("odd.onnx", "unsupported operator"), ("bad.onnx", "malformed ONNX")):
        assert main(["tune", name, "--work-dir", "wd"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0]
    assert not (tmp_path / "wd").exists()


def test_compile_cli_writes_a_checked_library(tuned, tiny_onnx, tmp_path, capsys):
    _, _, wd = tuned
    out = tmp_path / "tiny.so"
    assert main(["compile", str(tiny_onnx), "--db", str(wd), "-o", str(out), "--rounds", "1"]) == 0
    printed = capsys.readouterr()
    assert out.stat().st_size > 0 and "numerics PASS" in printed.out and "no record" not in printed.err


def test_kernels_without_a_record_are_named_in_one_warning(tuned, target, capsys):
    """A database that lacks a kernel's records (tuned for another model, or on a CPU whose vector width
    pads the channels otherwise) still builds, the kernel untuned, and one line names that kernel."""
    from tvm.s_tir import meta_schedule as ms
    from adaptune.model.graph import fuse, kernels
    model, _, wd = tuned
    db = C.open_database(wd)
    fused = fuse(optimise(model.mod), target)
    assert C.untuned_kernels(fused, db, target) == []
    names = {name: mod for name, _, mod in kernels(fused)}
    dropped = next(n for n in names if "conv2d" in n)
    partial, mod = ms.database.MemoryDatabase(), names[dropped]
    for rec in db.get_all_tuning_records():
        if not tvm_ffi.structural_equal(rec.workload.mod, mod):
            partial.commit_tuning_record(ms.database.TuningRecord(
                rec.trace, partial.commit_workload(rec.workload.mod), run_secs=rec.run_secs, target=rec.target,
                args_info=rec.args_info))
    assert C.untuned_kernels(fused, partial, target) == [dropped]
    best = C.build_best(model, partial, target, library=False, rounds=1)
    err = capsys.readouterr().err
    assert best.best.error < 1e-4 and err.count("no record") == 1 and dropped in err
    assert f"for 1 of the model's {len(names)} kernels" in err


# -- report ------------------------------------------------------------------------------------------
CHECK_SCRIPT = """<script>
window.addEventListener('load', () => {
  const imgs = [...document.images];
  const ok = imgs.filter(i => i.complete && i.naturalWidth > 100 && i.naturalHeight > 100).length;
  document.body.setAttribute('data-images', ok + '/' + imgs.length);
});
</script></body>"""


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    raise AssertionError("Chromium is needed for this test (.ci/run installs Debian's chromium package)")


def test_report_renders_in_headless_chromium(tuned, tmp_path):
    from adaptune.model.report import write_report
    _, res, wd = tuned
    page = write_report(wd, tmp_path / "report")
    assert {p.name for p in page.parent.glob("*.png")} == {"convergence.png", "model_convergence.png",
                                                          "speedup.png", "trials.png"}
    probe = page.parent / "probe.html"      # the report itself carries no test code
    probe.write_text(page.read_text().replace("</body>", CHECK_SCRIPT))
    dom = subprocess.run(
        [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         f"--user-data-dir={tmp_path / 'chrome-profile'}", "--virtual-time-budget=5000", "--dump-dom",
         probe.as_uri()], capture_output=True, text=True, timeout=120).stdout
    assert 'data-images="4/4"' in dom
    for t in res.tasks:
        assert t.name in dom
    assert "adaptune report" in dom


def _profiled_packed_call(name, fn, runs):
    """``timing.profile``'s rows, by call, of a model ``y = name(x); y + y`` on a (4,) input, with the
    Python function ``fn`` registered as the packed function ``name``."""
    from tvm import relax
    from adaptune.measure.pipeline import compile_module
    from adaptune.model.timing import profile

    tvm.register_global_func(name, fn, override=True)
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        y = bb.emit(relax.call_pure_packed(name, x, ty_args=relax.TensorType((4,), "float32")))
        bb.emit_func_output(bb.emit(relax.op.add(y, y)))
    ex = compile_module(bb.get(), tvm.target.Target({"kind": "llvm"}))
    return {r["call"]: r for r in profile(ex, [np.zeros(4, "float32")], runs=runs)}


def test_profile_runs_each_call_once_more_for_its_hot_time_and_never_a_vm_builtin():
    """``timing.profile``'s hot runs execute every call a second time just before timing it (that
    is what puts its data in cache), and leave the VM's builtins (allocations) alone."""
    runs = []

    def _counter(x):
        runs.append(1)
        return tvm.runtime.tensor(x.numpy() + 1.0)

    rows = _profiled_packed_call("adaptune.test.profile_counter", _counter, runs=3)
    # a warm-up run, three runs as the model runs, three hot runs calling it twice
    assert len(runs) == 1 + 3 + 2 * 3
    counter = rows["adaptune.test.profile_counter"]
    assert counter["calls"] == 1 and counter["ms"] > 0 and counter["hot_ms"] > 0 and counter["shapes"] == [(4,)]
    assert any(k.startswith("vm.builtin") for k in rows)        # timed, and (the count above) not run twice
    assert {"ms", "hot_ms", "group", "calls"} <= set(next(iter(rows.values())))


def test_a_run_the_host_interrupts_moves_no_row_of_the_profile():
    """Each call counts with its median over the runs: a call that stalls 60 ms in one of three runs
    (a host preempting the VM) keeps its row at the other runs' time, as model time and as hot time;
    a mean would have put 20 ms on it."""
    import time
    invocations = []

    def _stall(x):
        invocations.append(1)
        # invocations: warm-up 1; then model run 2, hot run 3-4, model 5, hot 6-7, model 8, hot 9-10
        if len(invocations) in (5, 7):
            time.sleep(0.06)
        return tvm.runtime.tensor(x.numpy() + 1.0)

    row = _profiled_packed_call("adaptune.test.profile_stall", _stall, runs=3)["adaptune.test.profile_stall"]
    assert len(invocations) == 10 and row["calls"] == 1
    assert row["ms"] < 10 and row["hot_ms"] < 10


def test_profile_counts_each_kernels_arithmetic_per_inference():
    """``kernel_flops`` counts a matmul's multiply-adds as TVM does (2 per MAC), and ``profile``
    gives a row the operations of all its calls in one inference (here one matmul kernel called
    twice), so that its GFLOP/s is operations over hot time; the VM's builtins have none.  The FMA
    peak they are set against is a positive rate."""
    from tvm import relax
    from adaptune.measure.pipeline import compile_module
    from adaptune.model.timing import fma_peak_gflops, kernel_flops, profile

    x = relax.Var("x", relax.TensorType((8, 32), "float32"))
    w = relax.const(np.ones((32, 16), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, w))
            y2 = bb.emit(relax.op.matmul(relax.op.add(x, x), w))
            out = bb.emit_output(relax.op.add(y, y2))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    flops = kernel_flops(mod)
    assert flops["matmul"] == 2 * 8 * 16 * 32 and set(flops) == {"matmul", "add", "add1"}
    ex = compile_module(mod, tvm.target.Target({"kind": "llvm"}))
    rows = {r["call"]: r for r in profile(ex, [np.ones((8, 32), "float32")], runs=2, flops=flops)}
    assert rows["matmul"]["calls"] == 2 and rows["matmul"]["flops"] == 2 * flops["matmul"]
    assert rows["add"]["flops"] == flops["add"]
    assert all(r["flops"] is None for k, r in rows.items() if k.startswith("vm."))
    assert 0 < fma_peak_gflops(tvm.target.Target({"kind": "llvm"}), seconds=0.01) < 1e5


def test_a_depthwise_convolution_left_apart_joins_the_expansion_it_alone_reads(target, avx512_target):
    """Where the 1x1 projection has more output channels than the depthwise output has pixels (no
    separable kernel), the 1x1 expansion + ReLU6 -> depthwise (stride 1, 2) is one kernel; an
    expansion whose output is read twice stays a kernel of its own; the module computes what
    PyTorch does."""
    import torch
    import torch.nn.functional as F
    from adaptune.model.graph import fuse

    class Late(torch.nn.Module):            # MobileNetV2's 7x7 stage in small: 4x4 pixels, 48 channels out
        def __init__(self):
            super().__init__()
            conv = torch.nn.Conv2d
            self.e1, self.d1, self.p1 = conv(16, 32, 1), conv(32, 32, 3, 2, 1, groups=32), conv(32, 48, 1)
            self.e2, self.d2, self.p2 = conv(48, 32, 1), conv(32, 32, 3, 1, 1, groups=32), conv(32, 48, 1)
            self.e3, self.d3, self.p3 = conv(48, 32, 1), conv(32, 32, 3, 1, 1, groups=32), conv(32, 48, 1)

        def forward(self, x):
            y = self.p1(F.relu6(self.d1(F.relu6(self.e1(x)))))
            y = y + self.p2(F.relu6(self.d2(F.relu6(self.e2(y)))))
            e = F.relu6(self.e3(y))
            return self.p3(F.relu6(self.d3(e))) + e.mean()

    torch.manual_seed(0)
    m = load_model(Late().eval(), input_shape=(1, 16, 8, 8))
    fused = fuse(optimise(m.mod), avx512_target)
    kernels = [k.removeprefix("kernel:") for k in op_counts(fused) if k.startswith("kernel:")]
    expanded = sorted(k for k in kernels if "expanded_depthwise" in k)
    assert len(expanded) == 2 and not any("separable" in k for k in kernels), kernels
    assert sorted(tuple(int(d) for d in fused[k].params[0].shape) for k in expanded) == [(1, 4, 4, 48), (1, 8, 8, 16)]
    assert C.check(tvm.compile(fused, target=target), m) < 1e-5
