"""What models take and give (issue 32, items 1-3): inputs of any dtype with valid values, outputs
of any structure, ONNX files that need their constants folded, and the one-line errors for the rest.
Tiny models, untuned builds only."""
from __future__ import annotations

import dataclasses
import io
import textwrap

import numpy as np
import pytest
import torch
from torch import nn

from adaptune.model import compile as C
from adaptune.cli import main
from adaptune.cli.common import UsageError
from adaptune.cli.models import _input
from adaptune.model.frontends import InputSpec, ModelError, embedding_vocab, load_model
from adaptune.model.frontends.model import _draw


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("adaptune: error:"), err
    return err[0]


# -- --input ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, spec", [
    ("input_ids:1,128:int64", InputSpec("input_ids", (1, 128), "int64")),
    ("x:1x3x8x8:float32", InputSpec("x", (1, 3, 8, 8), "float32")),
    ("ids:2,7:int32:5:9", InputSpec("ids", (2, 7), "int32", (5, 9))),
    ("x:4:float32:-0.5:2", InputSpec("x", (4,), "float32", (-0.5, 2.0))),
])
def test_input_specs_parse(text, spec):
    assert _input(text) == spec


@pytest.mark.parametrize("text, message", [
    ("ids:1,128", "NAME:SHAPE:DTYPE"),
    (":1,128:int64", "NAME:SHAPE:DTYPE"),
    ("ids:1,128:int64:0", "NAME:SHAPE:DTYPE"),
    ("ids:1,a:int64", "comma-separated integers"),
    ("ids:1,0:int64", "positive integers"),
    ("ids:1,8:int65", "unknown dtype 'int65'"),
    ("ids:1,8:int64:0.5:3", "must be integers"),
    ("ids:1,8:int64:7:7", "empty"),
    ("x:1,8:float32:0:inf", "not finite"),
])
def test_bad_input_specs_are_one_line_exit_2(text, message, capsys):
    with pytest.raises(UsageError, match=message):
        _input(text)
    assert main(["bench", "demo-cnn", "--input", text]) == 2
    assert message in _one_error_line(capsys)


def test_input_and_input_shape_together_or_unknown_names_are_refused(capsys):
    assert main(["bench", "demo-cnn", "--input-shape", "1,3,32,32", "--input", "x:1,3,32,32:float32"]) == 2
    assert "not both" in _one_error_line(capsys)
    assert main(["bench", "demo-cnn", "--input", "y:1,3,32,32:float32"]) == 2
    assert "y" in _one_error_line(capsys)


# -- integer inputs ----------------------------------------------------------------------------------
class TokenNet(nn.Module):
    """Token ids, token types, a mask and an integer flag that indexes nothing."""

    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(50, 8)
        self.typ = nn.Embedding(3, 8)
        self.out = nn.Linear(8, 4)

    def forward(self, input_ids, attention_mask, token_type_ids, flag):
        h = self.tok(input_ids) + self.typ(token_type_ids)
        h = h * attention_mask.unsqueeze(-1).float() * (1 + flag.unsqueeze(-1).float())
        return self.out(h)


TOKEN_SPECS = [InputSpec("input_ids", (1, 64), "int64"), InputSpec("attention_mask", (1, 64), "int64"),
               InputSpec("token_type_ids", (1, 64), "int64"), InputSpec("flag", (1, 64), "int32")]


def test_integer_inputs_get_valid_values_by_their_use():
    m = load_model(TokenNet(), inputs=TOKEN_SPECS)
    assert m.inputs == [(s.name, s.shape, s.dtype) for s in TOKEN_SPECS]
    assert embedding_vocab(m.mod) == {"input_ids": 50, "token_type_ids": 3}
    ids, mask, types, flag = m.example_inputs(seed=1)
    assert ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < 50 and len(np.unique(ids)) > 10
    assert (mask == 1).all()
    assert set(np.unique(types)) == {0, 1, 2}
    assert (_draw(np.random.default_rng(0), "head_mask", (2, 3), "float32") == 1).all()     # float masks too
    assert flag.dtype == np.int32 and set(np.unique(flag)) == {0, 1}
    ex = C.build_untuned(m)
    assert C.check(ex, m, m.example_inputs(seed=1)) < 1e-4


def test_a_user_range_overrides_the_rule():
    specs = [InputSpec("input_ids", (1, 64), "int64", (10, 20))] + TOKEN_SPECS[1:3] + \
            [InputSpec("flag", (1, 64), "int32", (3, 5))]
    m = load_model(TokenNet(), inputs=specs)
    assert m.input_ranges == {"input_ids": (10, 20), "flag": (3, 5)}
    ids, _, _, flag = m.example_inputs(seed=2)
    assert ids.min() >= 10 and ids.max() < 20 and len(np.unique(ids)) > 2
    assert set(np.unique(flag)) == {3, 4}


def test_embedding_ids_of_an_onnx_file_are_found_through_gather(tmp_path, capsys):
    """TVM imports ONNX's Gather with a negative-index fix (where / add) before the take."""
    class Emb(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(40, 8)

        def forward(self, ids, attention_mask):
            return self.emb(ids) * attention_mask.unsqueeze(-1)
    f = io.BytesIO()
    torch.onnx.export(Emb(), (torch.zeros(1, 6, dtype=torch.long), torch.ones(1, 6, dtype=torch.long)), f,
                      dynamo=False, input_names=["ids", "attention_mask"],
                      dynamic_axes={"ids": {1: "seq"}, "attention_mask": {1: "seq"}})
    path = tmp_path / "emb.onnx"
    path.write_bytes(f.getvalue())
    m = load_model(str(path), inputs=[InputSpec("ids", (1, 32), "int64"), InputSpec("attention_mask", (1, 32), "int64")])
    assert embedding_vocab(m.mod) == {"ids": 40}
    ids, mask = m.example_inputs(seed=3)
    assert ids.max() < 40 and len(np.unique(ids)) > 10 and (mask == 1).all()
    assert C.check(C.build_untuned(m), m, [ids, mask]) < 1e-4       # against ONNX Runtime
    assert main(["bench", str(path), "--input", "ids:1,32:float32"]) == 2      # the file says int64
    assert "is int64, not float32[1, 32]" in _one_error_line(capsys)


def test_a_float_input_into_an_embedding_is_reported_as_such_not_as_a_shape_mismatch(tmp_path, monkeypatch, capsys):
    (tmp_path / "tok.py").write_text(textwrap.dedent("""
        import torch
        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = torch.nn.Embedding(10, 4)
            def forward(self, ids):
                return self.emb(ids)
    """))
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "tok:Net", "--input-shape", "1,5"]) == 2
    line = _one_error_line(capsys)
    assert "does not run on input float32[1, 5]" in line and "indices" in line and "shape mismatch" not in line
    m = load_model("tok:Net", inputs=[InputSpec("ids", (1, 5), "int64")])
    assert C.check(C.build_untuned(m), m) == 0.0


def test_an_export_failure_says_what_it_is(tmp_path, monkeypatch, capsys):
    (tmp_path / "branchy.py").write_text(textwrap.dedent("""
        import torch
        class Net(torch.nn.Module):
            example_input_shape = (1, 4)
            def forward(self, x):
                return x * 2 if x.sum() > 0 else x - 1    # data-dependent control flow
    """))
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "branchy:Net"]) == 2
    line = _one_error_line(capsys)
    assert "torch.export cannot export Net" in line and "shape mismatch" not in line


# -- structured outputs -------------------------------------------------------------------------------
@dataclasses.dataclass
class Pair:          # a plain dataclass, not registered with torch's pytree
    logits: torch.Tensor
    hidden: tuple


class Structured(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.lin = nn.Linear(6, 5)

    def forward(self, x):
        y = self.lin(x)
        if self.kind == "dict":
            return {"logits": y, "probs": torch.softmax(y, -1)}
        if self.kind == "nested":
            return y, (y.sum(-1), [y.relu(), None])
        return Pair(y, (y.mean(-1), {"max": y.max(-1).values}))


@pytest.mark.parametrize("kind, names", [
    ("dict", ["['logits']", "['probs']"]),
    ("nested", ["[0]", "[1][0]", "[1][1][0]"]),
    ("dataclass", ["logits", "hidden[0]", "hidden[1]['max']"]),
])
def test_structured_outputs_are_flattened_named_and_checked(kind, names):
    m = load_model(Structured(kind), input_shape=(2, 6))
    assert m.output_names == names
    x = m.example_inputs(seed=4)
    want = m.reference(x)
    assert len(want) == len(names) and all(isinstance(w, np.ndarray) for w in want)
    ex = C.build_untuned(m)
    got = C.run_vm(ex, x)
    assert [g.shape for g in got] == [w.shape for w in want]
    assert C.check(ex, m, x) < 1e-4


# -- factories that bring their inputs ------------------------------------------------------------------
FACTORY = """
import torch
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(30, 4)
    def forward(self, input_ids, scale, attention_mask=None):
        return {"h": self.emb(input_ids) * scale * attention_mask.unsqueeze(-1)}

def with_kwargs():          # keyword inputs, not in the signature's order, with real values
    return Net(), {"attention_mask": torch.tensor([[1, 1, 0]]), "scale": torch.full((1, 3, 1), 2.0),
                   "input_ids": torch.tensor([[7, 29, 3]])}

def with_args():
    return Net(), (torch.tensor([[7, 29, 3]]), torch.full((1, 3, 1), 2.0), torch.tensor([[1, 1, 0]]))

def not_a_pair():
    return Net(), 3
"""


@pytest.mark.parametrize("attr, order", [("with_kwargs", ["attention_mask", "scale", "input_ids"]),
                                         ("with_args", ["input_ids", "scale", "attention_mask"])])
def test_a_factory_gives_module_and_example_inputs(attr, order, tmp_path, monkeypatch):
    (tmp_path / "fac.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    m = load_model(f"fac:{attr}")
    assert [n for n, _, _ in m.inputs] == order and m.output_names == ["['h']"]
    given = dict(zip(order, m.example_inputs()))
    np.testing.assert_array_equal(given["input_ids"], [[7, 29, 3]])     # the user's values, not random ones
    np.testing.assert_array_equal(given["attention_mask"], [[1, 1, 0]])
    ex = C.build_untuned(m)
    assert C.check(ex, m) < 1e-6
    other = dict(zip(order, m.example_inputs(seed=5)))
    assert other["input_ids"].max() < 30 and (other["attention_mask"] == 1).all()
    assert C.check(ex, m, list(other.values())) < 1e-6


def test_bad_factories_are_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "fac.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelError, match="example inputs must be"):
        load_model("fac:not_a_pair")
    assert main(["bench", "fac:with_kwargs", "--input-shape", "1,3"]) == 2
    assert "returns its own example inputs" in _one_error_line(capsys)


# -- ONNX preprocessing ---------------------------------------------------------------------------------
def _pad_model(chain: str):
    """A Pad whose pads are computed in the graph: Constant -> Concat, or Shape -> Gather -> Mod -> Concat."""
    from onnx import TensorProto, helper, numpy_helper

    def const(name, value):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(value, np.int64)))
    if chain == "concat":
        nodes = [const("a", [0, 0, 1, 0]), const("b", [0, 0, 1, 2]), helper.make_node("Concat", ["a", "b"], ["p"], axis=0)]
        out = [1, 2, 7, 7]
    else:
        nodes = [helper.make_node("Shape", ["X"], ["s"]), const("i", [2, 3]), helper.make_node("Gather", ["s", "i"], ["hw"]),
                 const("two", [2]), helper.make_node("Mod", ["hw", "two"], ["m"]), const("z", [0, 0, 0, 0, 0, 0]),
                 helper.make_node("Concat", ["z", "m"], ["p"], axis=0)]
        out = [1, 2, 6, 6]
    nodes.append(helper.make_node("Pad", ["X", "p"], ["Y"], name="pad"))
    graph = helper.make_graph(nodes, "pad", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 2, 5, 5])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, out)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("chain", ["concat", "shape"])
def test_onnx_pads_computed_in_the_graph_import_after_folding(chain, tmp_path):
    import onnx
    from tvm.relax.frontend.onnx import from_onnx
    proto = _pad_model(chain)
    with pytest.raises(Exception):               # TVM alone cannot: the pads are not a constant
        from_onnx(proto, shape_dict={"X": [1, 2, 5, 5]})
    path = tmp_path / f"pad_{chain}.onnx"
    onnx.save(proto, str(path))
    m = load_model(str(path))
    assert m.onnx_model.graph.node[-1].op_type == "Pad" and len(m.onnx_model.graph.node) > 2   # the original kept
    x = m.example_inputs()
    assert C.check(C.build_untuned(m), m, x) == 0.0 and m.reference(x)[0].shape == tuple(
        d.dim_value for d in proto.graph.output[0].type.tensor_type.shape.dim)


def test_unsupported_or_unimportable_onnx_nodes_are_named(tmp_path, monkeypatch, capsys):
    import onnx
    from onnx import TensorProto, helper
    monkeypatch.chdir(tmp_path)
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 3, 3])
    det = helper.make_graph([helper.make_node("Relu", ["X"], ["r"], name="relu0"),
                             helper.make_node("Det", ["r"], ["Y"], name="det0")], "det", [x],
                            [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1])])
    onnx.save(helper.make_model(det, opset_imports=[helper.make_opsetid("", 17)]), "det.onnx")
    assert main(["tune", "det.onnx", "--work-dir", "wd"]) == 2
    assert "unsupported operator in det.onnx: Det (node 'det0')" in _one_error_line(capsys)
    dyn = helper.make_graph([helper.make_node("Pad", ["X", "P"], ["Y"], name="pad_by_input")], "dyn",
                            [x, helper.make_tensor_value_info("P", TensorProto.INT64, [6])],
                            [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 3, 3])])
    onnx.save(helper.make_model(dyn, opset_imports=[helper.make_opsetid("", 17)]), "dyn.onnx")
    assert main(["tune", "dyn.onnx", "--work-dir", "wd"]) == 2
    line = _one_error_line(capsys)
    assert "cannot import dyn.onnx at Pad (node 'pad_by_input')" in line and "Dynamic pads" in line
    assert not (tmp_path / "wd").exists()


# -- transformers (optional extra: pip install -e ".[models]") ------------------------------------------
HF_FACTORY = """
import torch
from transformers import BertConfig, BertModel

def tiny_bert():
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=37, max_position_embeddings=64)
    return BertModel(cfg).eval(), {"input_ids": torch.randint(0, 99, (1, 16)),
                                   "attention_mask": torch.ones(1, 16, dtype=torch.long)}
"""


def test_a_tiny_transformers_bert_through_both_entry_points(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    (tmp_path / "hfbert.py").write_text(HF_FACTORY)
    monkeypatch.chdir(tmp_path)
    m = load_model("hfbert:tiny_bert")             # returns a ModelOutput
    assert m.output_names == ["['last_hidden_state']", "['pooler_output']"]
    assert embedding_vocab(m.mod) == {"input_ids": 99}
    ex = C.build_untuned(m)
    assert C.check(ex, m) < 1e-4 and C.check(ex, m, m.example_inputs(seed=1)) < 1e-4

    class Tuple(nn.Module):      # the TorchScript exporter passes transformers 5's BertModel a stray use_cache
        def __init__(self, bert):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask).to_tuple()
    bert, kw = m.torch_module, m.torch_args([torch.from_numpy(a) for a in m.example_inputs()])[1]
    f = io.BytesIO()
    torch.onnx.export(Tuple(bert), (kw["input_ids"], kw["attention_mask"]), f, dynamo=False,
                      input_names=["input_ids", "attention_mask"], output_names=["last_hidden_state", "pooler_output"])
    (tmp_path / "bert.onnx").write_bytes(f.getvalue())
    o = load_model(str(tmp_path / "bert.onnx"))
    assert o.output_names == ["last_hidden_state", "pooler_output"] and embedding_vocab(o.mod) == {"input_ids": 99}
    ids, mask = o.example_inputs(seed=2)
    assert ids.max() < 99 and len(np.unique(ids)) > 4 and (mask == 1).all()
    assert C.check(C.build_untuned(o), o, [ids, mask]) < 1e-4


# -- the zoo's transformers (issue 32, item 7) -----------------------------------------------------
def _copy_hf_bert(ours, hf) -> None:
    """Load a transformers BertModel's weights into the zoo's Bert (names mapped one by one)."""
    sd = hf.state_dict()
    new = {"words.weight": sd["embeddings.word_embeddings.weight"],
           "positions.weight": sd["embeddings.position_embeddings.weight"],
           "types.weight": sd["embeddings.token_type_embeddings.weight"],
           "norm.weight": sd["embeddings.LayerNorm.weight"], "norm.bias": sd["embeddings.LayerNorm.bias"],
           "pooler.weight": sd["pooler.dense.weight"], "pooler.bias": sd["pooler.dense.bias"]}
    for i in range(len(ours.layers)):
        hf_l, l = f"encoder.layer.{i}.", f"layers.{i}."
        pairs = {"attn.qkv.0": "attention.self.query", "attn.qkv.1": "attention.self.key",
                 "attn.qkv.2": "attention.self.value", "attn.out": "attention.output.dense",
                 "norm1": "attention.output.LayerNorm", "mlp.0": "intermediate.dense", "mlp.2": "output.dense",
                 "norm2": "output.LayerNorm"}
        for mine, theirs in pairs.items():
            for p in ("weight", "bias"):
                new[f"{l}{mine}.{p}"] = sd[f"{hf_l}{theirs}.{p}"]
    ours.load_state_dict(new)


def test_the_zoo_bert_computes_what_transformers_bert_computes():
    transformers = pytest.importorskip("transformers")
    from adaptune.model import zoo
    cfg = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=37, max_position_embeddings=64)
    torch.manual_seed(0)
    hf = transformers.BertModel(cfg).eval()
    ours = zoo.Bert(vocab=99, dim=32, layers=2, heads=2, hidden=37, max_len=64).eval()
    _copy_hf_bert(ours, hf)
    ids = torch.randint(0, 99, (1, 16))
    mask = torch.ones(1, 16, dtype=torch.long)
    mask[0, 11:] = 0                                  # padding: the mask must really be applied
    with torch.no_grad():
        want, got = hf(input_ids=ids, attention_mask=mask), ours(ids, mask)
    torch.testing.assert_close(got["last_hidden_state"], want.last_hidden_state, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got["pooler_output"], want.pooler_output, rtol=1e-5, atol=1e-5)


def test_the_zoo_transformers_import_with_token_inputs_and_check():
    from adaptune.model import zoo
    m = load_model("bert-base")                       # no TVM build: 110 M weights
    assert [(n, s, d) for n, s, d in m.inputs] == [("input_ids", (1, 128), "int64"),
                                                    ("attention_mask", (1, 128), "int64")]
    assert embedding_vocab(m.mod)["input_ids"] == 30522
    ids, mask = m.example_inputs()
    assert len(np.unique(ids)) > 100 and (mask == 1).all()
    torch.manual_seed(0)
    bert = zoo.Bert(vocab=50, dim=32, layers=2, heads=2, hidden=48, max_len=32)
    small = load_model(bert, inputs=[InputSpec("input_ids", (1, 12), "int64"),
                                     InputSpec("attention_mask", (1, 12), "int64")])
    ids, mask = small.example_inputs(seed=3)
    mask[0, 9:] = 0
    assert C.check(C.build_untuned(small), small, [ids, mask]) < 1e-4
    vit = load_model(zoo.ViT(image=32, patch=8, dim=32, layers=2, heads=2, hidden=48, num_classes=10),
                     input_shape=(1, 3, 32, 32))
    assert C.check(C.build_untuned(vit), vit) < 1e-4


def test_a_transformers_epilogues_and_attention_softmax_become_library_calls(target):
    """PyTorch's 3-D Linear imports as reshape/matmul/add/reshape: ``graph.sink_reshapes`` moves
    the GELU and the residual add ahead of the reshape so oneDNN runs them in the dense call;
    attention's scaled (and masked) softmax is one PyTorch call, and so is each layer norm; ``graph.fuse`` gives the
    generated softmax TVM's fast form.  Both models match PyTorch with everything offloaded."""
    from adaptune.model import library as L
    from adaptune.model import zoo
    from adaptune.model.graph import extract_tasks, optimise
    torch.manual_seed(0)
    m = load_model(zoo.Bert(vocab=50, dim=32, layers=1, heads=2, hidden=48, max_len=32),
                   inputs=[InputSpec("input_ids", (1, 12), "int64"), InputSpec("attention_mask", (1, 12), "int64")])
    ops = L.find_ops(optimise(m.mod))
    assert [op.post for op in ops if op.weight == (48, 32)] == ["gelu"]
    # the residual adds behind the attention output and the MLP's second layer join their dense calls
    assert sorted(op.label for op in ops if op.residual and op.kind == "linear") == ["linear 12x32 -> 32+add",
                                                                                 "linear 12x48 -> 32+add"]
    names = [t.name for t in extract_tasks(optimise(m.mod), target)[0]]
    assert any("fast_softmax" in n for n in names) and not any("gelu" in n and "matmul" not in n for n in names)
    # attention's two batched matmuls of activations are library ops too (torch.bmm), and so is the
    # softmax between them with its scale and the attention mask (PyTorch's softmax)
    assert sorted(op.label for op in ops if op.kind == "bmm") == ["bmm 2x12x12 @ 2x12x16", "bmm 2x12x16 @ 2x16x12"]
    assert [op.label for op in ops if op.kind == "softmax"] == ["softmax 1x2x12x12 *0.25+mask"]
    assert [op.label for op in ops if op.kind == "layer_norm"] == ["layer_norm 1x12x32"]     # PyTorch's too
    from adaptune._tvm import ms
    ex = C.build_tuned(m, ms.database.MemoryDatabase(), target, {op: "onednn" for op in ops})
    ids, mask = m.example_inputs(seed=3)
    mask[0, 9:] = 0
    assert C.check(ex, m, [ids, mask]) < 1e-4
    vit = load_model(zoo.ViT(image=32, patch=8, dim=32, layers=1, heads=2, hidden=48, num_classes=10),
                     input_shape=(1, 3, 32, 32))
    ops = L.find_ops(optimise(vit.mod))
    assert [op.label for op in ops if op.kind == "softmax"] == ["softmax 1x2x17x17 *0.25"]     # no mask
    assert [op.label for op in ops if op.kind == "layer_norm"] == ["layer_norm 1x17x32"]
    assert C.check(C.build_tuned(vit, ms.database.MemoryDatabase(), target, {op: "onednn" for op in ops}), vit) < 1e-4


class TfPadded(nn.Module):
    """TensorFlow-style "same" padding (HF MobileNetV2's ``tf_padding``): an explicit zero pad before
    every conv, asymmetric at stride 2, and ReLU6 as a clamp."""

    def __init__(self):
        super().__init__()
        self.down = nn.Conv2d(3, 8, 3, stride=2)
        self.dw = nn.Conv2d(8, 8, 3, groups=8)
        self.pw = nn.Conv2d(8, 16, 1)

    def forward(self, x):
        x = torch.clamp(self.down(nn.functional.pad(x, (0, 1, 0, 1))), 0, 6)
        x = torch.clamp(self.dw(nn.functional.pad(x, (1, 1, 1, 1))), 0, 6)
        return self.pw(nn.functional.pad(x, (0, 0, 0, 0)))


@pytest.mark.parametrize("entry", ["pytorch", "onnx"])
def test_tf_padding_and_relu6_reach_the_library_through_both_entry_points(entry, tmp_path, target):
    """Each zero pad becomes its conv's own padding (``graph.fold_pads``; onnxslim's Pad+Conv fusion
    for ONNX files) and ONNX's ``Clip`` arrives as Relax's maximum/minimum
    (``frontends.onnx._clip_as_max_min``, ``graph.pairwise_reductions``), so the convs are library
    chains with ReLU6 as oneDNN's post-op; the stride-2 conv, padded asymmetrically, stays generated."""
    from adaptune.model import library as L
    from adaptune._tvm import ms
    from adaptune.model.graph import op_counts, optimise
    torch.manual_seed(0)
    module = TfPadded().eval()
    if entry == "onnx":
        path = tmp_path / "tf.onnx"
        torch.onnx.export(module, (torch.randn(1, 3, 16, 16),), str(path), dynamo=False, input_names=["x"])
        m = load_model(str(path))
    else:
        m = load_model(module, input_shape=(1, 3, 16, 16))
    counts = op_counts(optimise(m.mod))
    assert not [op for op in counts if op in ("nn.pad", "stack", "broadcast_to") or op.startswith("kernel:")], counts
    ops = L.find_ops(optimise(m.mod))
    assert sorted(op.label for op in ops) == ["conv2d 8->16 1x1 s1 p0 @8x8", "conv2d 8->8 3x3 s1 p1 g8 @8x8+hardtanh"]
    ex = C.build_tuned(m, ms.database.MemoryDatabase(), target, {op: "onednn" for op in ops})
    assert C.check(ex, m) < 1e-4


@pytest.mark.parametrize("opset", [6, 13])
def test_onnx_clip_with_attribute_or_input_bounds_imports_as_max_min(opset, tmp_path):
    """``Clip``'s bounds are attributes before opset 11 and inputs since; both become
    ``maximum``/``minimum`` (no opaque kernels) and compute what ONNX Runtime computes."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from adaptune.model.graph import op_counts, optimise
    if opset < 11:
        clip, inits = helper.make_node("Clip", ["X"], ["Y"], min=-0.5, max=0.75), []
    else:
        clip = helper.make_node("Clip", ["X", "lo", "hi"], ["Y"])
        inits = [numpy_helper.from_array(np.array(-0.5, np.float32), "lo"),
                 numpy_helper.from_array(np.array(0.75, np.float32), "hi")]
    graph = helper.make_graph([clip], "clip", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 8])], inits)
    path = tmp_path / "clip.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), str(path))
    m = load_model(str(path))
    counts = op_counts(optimise(m.mod))
    assert counts["maximum"] == counts["minimum"] == 1 and not [k for k in counts if k.startswith("kernel:")], counts
    x = [np.linspace(-2, 2, 16, dtype=np.float32).reshape(2, 8)]
    assert C.check(C.build_untuned(m), m, x) == 0.0
    assert np.allclose(m.reference(x)[0], np.clip(x[0], -0.5, 0.75))


def test_an_onnx_gelu_written_out_becomes_the_dense_calls_post_op(tmp_path, target):
    """The TorchScript exporter writes GELU as Div, Erf, Add, Mul, Mul; ``graph.recognise_gelu``
    makes it a ``gelu`` again, which the dense chain takes as oneDNN's post-op."""
    from adaptune.model import library as L
    from adaptune._tvm import ms
    from adaptune.model.graph import op_counts, optimise
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(16, 24), nn.GELU(), nn.Linear(24, 8)).eval()
    path = tmp_path / "mlp.onnx"
    torch.onnx.export(module, (torch.randn(4, 16),), str(path), dynamo=False, input_names=["x"])
    m = load_model(str(path))
    counts = op_counts(optimise(m.mod))
    assert counts["nn.gelu"] == 1 and "erf" not in counts, counts
    ops = L.find_ops(optimise(m.mod))
    assert sorted(op.label for op in ops) == ["linear 4x16 -> 24+gelu", "linear 4x24 -> 8"]
    assert C.check(C.build_tuned(m, ms.database.MemoryDatabase(), target, {op: "onednn" for op in ops}), m) < 1e-4


def test_a_tiny_transformers_gpt2_as_it_comes_loads_and_its_mlp_is_library_calls(capsys, target):
    """GPT-2 returns a key/value cache unless told not to (its growth does not import into TVM):
    adaptune says so in one line and runs it with ``use_cache=False``.  Its GELU, written out in
    tanh form, becomes the dense call's post-op (``graph.recognise_gelu``); all-library matches."""
    transformers = pytest.importorskip("transformers")
    from adaptune.model import library as L
    from adaptune._tvm import ms
    from adaptune.model.graph import optimise
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50, n_positions=16,
                                  bos_token_id=0, eos_token_id=0)
    mask = torch.ones(1, 8, dtype=torch.long)
    mask[0, 6:] = 0
    m = load_model(transformers.GPT2Model(cfg).eval(),
                   inputs=[InputSpec("input_ids", (1, 8), "int64"), InputSpec("attention_mask", (1, 8), "int64")])
    assert "use_cache=False" in capsys.readouterr().err
    ops = L.find_ops(optimise(m.mod))
    assert "linear 8x32 -> 128+gelu_tanh" in {op.label for op in ops}
    ids, mask = m.example_inputs(seed=2)
    mask[0, 6:] = 0
    ex = C.build_tuned(m, ms.database.MemoryDatabase(), target, {op: "onednn" for op in ops})
    assert C.check(ex, m, [ids, mask]) < 1e-4


class Heads(nn.Module):
    """Attention with the heads as a fourth axis, as an ONNX export keeps it, written out and as SDPA."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)

    def forward(self, x):
        q, k, v = (t.reshape(1, 6, 2, 8).transpose(1, 2) for t in self.qkv(x).split(16, dim=-1))
        p = torch.softmax(q @ k.transpose(-1, -2) / 4.0, dim=-1)
        o = nn.functional.scaled_dot_product_attention(q, k, v)       # exported as scaled q and k, plain softmax
        return (p @ v + o).transpose(1, 2).reshape(1, 6, 16)


def test_onnx_attention_with_four_axis_matmuls_is_library_calls(tmp_path, target):
    from adaptune.model import library as L
    from adaptune._tvm import ms
    from adaptune.model.graph import optimise
    torch.manual_seed(0)
    path = tmp_path / "heads.onnx"
    torch.onnx.export(Heads().eval(), (torch.randn(1, 6, 16),), str(path), dynamo=False, input_names=["x"])
    m = load_model(str(path))
    ops = L.find_ops(optimise(m.mod))
    labels = sorted(op.label for op in ops if op.kind in ("bmm", "softmax"))
    assert labels == ["bmm 1x2x6x6 @ 1x2x6x8", "bmm 1x2x6x8 @ 1x2x8x6", "softmax 1x2x6x6", "softmax 1x2x6x6 *0.25"], labels
    assert C.check(C.build_tuned(m, ms.database.MemoryDatabase(), target, {op: "onednn" for op in ops}), m) < 1e-4
