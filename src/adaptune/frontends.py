"""Models in: a zoo name, an ONNX file, a PyTorch ``module:attr``, or a Relax IRModule.

Every frontend ends in the same ``Model``: a Relax IRModule with the weights bound as constants,
its input signature, and a *reference* that computes the true output outside TVM (PyTorch for
PyTorch and zoo models, ONNX Runtime for ONNX files, the untuned TVM build for a bare Relax
module), against which every compiled model is checked before it is timed.
"""
from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
import re
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import _tvm  # noqa: F401  (fast TVM import)
from . import zoo

import tvm
from tvm import relax


class ModelError(ValueError):
    """A model that cannot be loaded as given; the message is one line for the user."""


@dataclass(frozen=True)
class InputSpec:
    """One model input as the user gives it (``--input NAME:SHAPE:DTYPE[:LOW:HIGH]``); ``range``
    is the half-open interval its example values are drawn from (None: the rule of ``example_inputs``)."""
    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    range: tuple[float, float] | None = None


@dataclass
class Model:
    name: str
    kind: str                                   # zoo | onnx | torch | relax
    mod: "tvm.IRModule"                         # Relax, weights bound as constants
    inputs: list[tuple[str, tuple[int, ...], str]]
    torch_module: object | None = None
    onnx_model: object | None = None
    source: str = ""
    input_ranges: dict[str, tuple[float, float]] = field(default_factory=dict)   # the user's overrides
    output_names: list[str] = field(default_factory=list)   # the flat outputs, in the Relax module's order
    given_inputs: list[np.ndarray] | None = None   # the example values a PyTorch factory returned
    torch_signature: tuple | None = None        # (in_spec, user inputs) of the export: how to call the module
    _onnx_cache: dict = field(default_factory=dict, repr=False)

    def example_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Valid values for every input.  Seed 0 of a model whose factory returned example inputs
        gives those; otherwise each input is drawn from its ``input_ranges`` entry when the user set
        one (uniform, ``[low, high)``), else: an input named like a mask (``*mask*``) all ones;
        other float inputs standard normal; an integer input that indexes an embedding table (see
        ``embedding_vocab``) uniform in ``[0, rows)``; any other integer or bool input in ``[0, 2)``,
        the one range that is valid for every lookup, flag and index a model may take."""
        if seed == 0 and self.given_inputs is not None:
            return [a.copy() for a in self.given_inputs]
        rng = np.random.default_rng(seed)
        vocab = embedding_vocab(self.mod)
        return [_draw(rng, name, shape, dtype, self.input_ranges.get(name), vocab.get(name))
                for name, shape, dtype in self.inputs]

    def torch_args(self, tensors) -> tuple[tuple, dict]:
        """``(args, kwargs)`` to call the PyTorch module with, from the flat input tensors."""
        if self.torch_signature is None:
            return tuple(tensors), {}
        from torch.utils._pytree import tree_unflatten
        spec, user = self.torch_signature
        it = iter(tensors)
        return tree_unflatten([next(it) if v is _TENSOR else v for v in user], spec)

    def onnx_proto(self):
        """The model as ONNX (exported from PyTorch once, if it came from there)."""
        if self.onnx_model is None and self.torch_module is not None and "proto" not in self._onnx_cache:
            import torch
            for name in ("torch.onnx", "torch.export", "onnxscript"):
                logging.getLogger(name).setLevel(logging.ERROR)
            args, kwargs = self.torch_args([torch.from_numpy(a) for a in self.example_inputs()])
            with _quiet():
                self._onnx_cache["proto"] = torch.onnx.export(self.torch_module, args, kwargs=kwargs, dynamo=True,
                                                              verbose=False).model_proto
        return self.onnx_model if self.onnx_model is not None else self._onnx_cache.get("proto")

    def reference(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """The output computed outside TVM (as the framework computes it), flattened in the order
        of ``output_names``."""
        if self.torch_module is not None:
            import torch
            args, kwargs = self.torch_args([torch.from_numpy(a) for a in inputs])
            with torch.no_grad():
                out = self.torch_module(*args, **kwargs)
            return [o.detach().numpy() for _, o in _tensor_leaves(out)]
        if self.onnx_model is not None:
            sess = ort_session(self.onnx_model)
            return list(sess.run(None, {n: a for (n, _, _), a in zip(self.inputs, inputs)}))
        from .compile import run_vm, build_untuned      # a bare Relax module: TVM's own default build
        return run_vm(build_untuned(self), inputs)


_TENSOR = object()     # marks a tensor slot among an export's user inputs (the others are constants)


def _draw(rng, name: str, shape, dtype: str, range_=None, vocab=None) -> np.ndarray:
    """One input's values by the rule of ``Model.example_inputs``."""
    kind = np.dtype(dtype).kind
    if range_ is None and "mask" in name.lower():
        return np.ones(shape, dtype)
    if range_ is None and kind in "fc":
        return rng.standard_normal(shape).astype(dtype)
    low, high = range_ or (0, vocab or 2)
    if kind in "fc":
        return rng.uniform(low, high, shape).astype(dtype)
    return rng.integers(int(low), int(high), shape).astype(dtype)


# Ops through which an index tensor still holds the same token ids (TVM's ONNX Gather adds
# ``where(i < 0, i + n, i)``; PyTorch's embedding an ``astype`` and a ``reshape``).
_INDEX_PRESERVING = {"relax.astype", "relax.reshape", "relax.squeeze", "relax.expand_dims", "relax.flatten",
                     "relax.permute_dims", "relax.broadcast_to", "relax.where", "relax.add"}


def embedding_vocab(mod) -> dict[str, int]:
    """Inputs of ``mod`` used as the indices of ``take`` on a constant table (an embedding
    lookup, directly or through casts, reshapes and negative-index fixes), with the table's row
    count (the smallest, when an input indexes several tables).  Read from the Relax graph, so it
    covers every frontend alike; Relax offers no use-def query, hence the walk over the bindings."""
    func = mod["main"]
    params = {p: p.name for p in func.params}
    bound = {b.var: b.value for blk in func.body.blocks for b in blk.bindings}
    vocab: dict[str, int] = {}

    def sources(expr, seen):
        if expr in params:
            yield params[expr]
        elif expr in bound and expr not in seen:
            seen.add(expr)
            value = bound[expr]
            if isinstance(value, relax.Call) and getattr(value.op, "name", "") in _INDEX_PRESERVING:
                for arg in value.args:
                    yield from sources(arg, seen)
            elif isinstance(value, relax.Var):
                yield from sources(value, seen)

    for value in bound.values():
        if (isinstance(value, relax.Call) and getattr(value.op, "name", "") == "relax.take"
                and isinstance(value.args[0], tvm.ir.GenericConst)):
            table = value.args[0].value.shape
            axis = int(value.attrs.axis) if value.attrs.axis is not None else 0
            for name in sources(value.args[1], set()):
                vocab[name] = min(vocab.get(name, table[axis]), table[axis])
    return vocab


def _tensor_leaves(out) -> list[tuple[str, object]]:
    """(name, tensor) of every tensor in a model's output, in torch pytree order (the order of
    the exported program's outputs); names are the pytree key paths, e.g. ``last_hidden_state``."""
    import torch
    from torch.utils._pytree import keystr, tree_flatten_with_path
    leaves, _ = tree_flatten_with_path(out)
    return [(keystr(path).lstrip(".") or "output", leaf) for path, leaf in leaves if isinstance(leaf, torch.Tensor)]


def _register_dataclasses(out) -> None:
    """Register the plain dataclasses in an output with torch's pytree (``ModelOutput`` and the
    standard containers already are), so export and ``_tensor_leaves`` see through them."""
    import dataclasses

    import torch
    from torch.utils._pytree import SUPPORTED_NODES, tree_leaves
    while True:
        new = {type(x) for x in tree_leaves(out) if dataclasses.is_dataclass(x) and type(x) not in SUPPORTED_NODES}
        if not new:
            return
        for cls in new:
            torch.export.register_dataclass(cls)


def _without_cache(module, kwargs: dict) -> None:
    """A ``transformers`` decoder (GPT-2) returns a key/value cache unasked; the cache is for
    step-by-step generation, one forward pass does not need it, and its growth (a concat onto an
    empty tensor) does not import into TVM.  So its config's ``use_cache`` is switched off, said in
    one line (the module is what adaptune compiles and checks against; a ``use_cache`` the user
    passes is kept)."""
    cfg = getattr(module, "config", None)
    if type(module).__module__.startswith("transformers.") and "use_cache" not in kwargs and \
            getattr(cfg, "use_cache", False) is True:
        print(f"adaptune: note: {type(module).__name__} runs with config.use_cache=False (one forward pass, "
              "no key/value cache for generation)", file=sys.stderr)
        cfg.use_cache = False


def _one_line(e: Exception, limit: int = 300) -> str:
    return " ".join(str(e).split())[:limit] or type(e).__name__


@contextlib.contextmanager
def _quiet():
    """Silence chatty exporters (they print progress to stdout/stderr)."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield


def ort_session(proto, threads: int | None = None):
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads or os.cpu_count() or 1
    opts.log_severity_level = 3
    return ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def graph_inputs(mod) -> list[tuple[str, tuple[int, ...], str]]:
    out = []
    for p in mod["main"].params:
        ty = p.ty
        shape = getattr(ty, "shape", None)
        if shape is None or not all(isinstance(d, tvm.ir.prim.expr.IntImm) for d in shape.values):
            raise ModelError(f"input {p.name!r} has a dynamic shape; adaptune tunes static shapes")
        out.append((p.name, tuple(int(d) for d in shape.values), str(ty.dtype)))
    return out


def _output_count(mod) -> int:
    def count(ty):
        return sum(count(f) for f in ty.fields) if isinstance(ty, tvm.ir.TupleType) else 1
    return count(mod["main"].ret_ty)


def _tensor_outputs_only(mod):
    """``mod`` with the non-tensor outputs of ``main`` dropped: torch.export keeps a ``None`` in an
    output structure as an output, which TVM imports as a null value; the reference has no such leaf."""
    func = mod["main"]
    fields = list(func.ret_ty.fields) if isinstance(func.ret_ty, tvm.ir.TupleType) else None
    if fields is None or all(isinstance(f, relax.TensorType) for f in fields):
        return mod
    tensors = [i for i, f in enumerate(fields) if isinstance(f, relax.TensorType)]
    body = relax.SeqExpr(func.body.blocks, relax.Tuple([relax.TupleGetItem(func.body.body, i) for i in tensors]))
    mod["main"] = relax.Function(func.params, body, tvm.ir.TupleType([fields[i] for i in tensors]), attrs=func.attrs)
    return relax.transform.Normalize()(mod)


def _check_shape(name: str, want, got) -> None:
    if got is not None and tuple(got) != tuple(want):
        raise ModelError(f"input shape mismatch: model input {name!r} is {list(want)}, got {list(got)}")


def _describe(args, kwargs) -> str:
    """The inputs a module was called with, for messages: ``input float32[1, 3], mask=int64[1, 8]``."""
    def one(t):
        return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}" if hasattr(t, "shape") else repr(t)
    return "input " + ", ".join([one(a) for a in args] + [f"{k}={one(v)}" for k, v in kwargs.items()])


def _from_torch(module, args, kwargs, name: str, kind: str, source: str, given: bool = False) -> Model:
    """Export ``module`` called as ``module(*args, **kwargs)``; ``given``: the example values are
    the user's own (a factory's), kept as ``Model.given_inputs``.  The module is run eagerly first,
    so an input it does not accept is reported as that, apart from what ``torch.export`` cannot do."""
    import torch
    from torch.export.graph_signature import InputKind, TensorArgument
    from torch.utils._pytree import tree_flatten
    from tvm.relax.frontend.torch import from_exported_program
    if not isinstance(module, torch.nn.Module):
        raise ModelError(f"{source}: not a torch.nn.Module (got {type(module).__name__})")
    module = module.eval()
    _without_cache(module, kwargs)
    try:
        with torch.no_grad(), _quiet():
            out = module(*args, **kwargs)
    except Exception as e:
        raise ModelError(f"{name} does not run on {_describe(args, kwargs)}: {_one_line(e)}") from None
    _register_dataclasses(out)
    names = [n for n, _ in _tensor_leaves(out)]
    if not names:
        raise ModelError(f"{name} returns no tensor (got {type(out).__name__})")
    try:
        with _quiet():
            ep = torch.export.export(module, args, kwargs)
    except Exception as e:
        raise ModelError(f"torch.export cannot export {name}: {type(e).__name__}: {_one_line(e)}") from None
    user = [_TENSOR if isinstance(s.arg, TensorArgument) else s.arg.value
            for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    try:
        with _quiet():
            mod = _tensor_outputs_only(from_exported_program(ep, keep_params_as_input=False))
    except Exception as e:
        raise ModelError(f"unsupported operator in {name}: {_one_line(e)}") from None
    if _output_count(mod) != len(names):
        raise ModelError(f"{name}: TVM's import returns {_output_count(mod)} outputs, the module {len(names)}")
    values = [t.numpy() for t in tree_flatten(ep.example_inputs)[0] if isinstance(t, torch.Tensor)]
    return Model(name, kind, mod, graph_inputs(mod), torch_module=module, source=source, output_names=names,
                 given_inputs=values if given else None, torch_signature=(ep.call_spec.in_spec, user))


def _torch_example(inputs, shape) -> tuple[tuple, dict]:
    """Example call for a module: the ``--input`` specs as keyword tensors (named like the
    forward's parameters), or one float tensor of ``shape``."""
    import torch
    if inputs:
        rng = np.random.default_rng(0)
        return (), {s.name: torch.from_numpy(_draw(rng, s.name, s.shape, s.dtype, s.range)) for s in inputs}
    return (torch.randn(*shape),), {}


def _onnx_simplify(proto, shapes: dict):
    """The model with its inputs fixed to ``shapes`` and its constants and shape computations
    folded by onnxslim, for TVM's importer, which takes a ``Pad``'s pads (and similar operands) only
    as constants.  Measured on a Pad fed by Constant->Concat, one fed by Shape->Gather->Mod->Concat,
    a MobileNetV2-style net with TensorFlow padding exported with dynamo=False and dynamo=True,
    and the zoo's demo-cnn, resnet18 and mobilenetv2 in both exports: onnxslim and onnxsim load all
    of them (onnxsim only when every output has a declared shape), onnxscript's optimizer all but
    the dynamo=False TF-padding net (it leaves a ConstantOfShape unfolded), onnx's shape inference
    neither Pad.  onnxslim is pure Python; of its fusions only Pad+Conv runs (a zero pad becomes the
    conv's own padding, as ``graph.fold_pads`` does for PyTorch models), the rest keep the graph as
    written.  A model it cannot simplify goes to TVM as it is."""
    import onnx
    import onnxslim
    fixed = onnx.ModelProto()
    fixed.CopyFrom(proto)
    for inp in fixed.graph.input:
        for dim, d in zip(inp.type.tensor_type.shape.dim, shapes.get(inp.name, ())):
            dim.dim_value = d
    from onnxslim.core.pattern.registry import DEFAULT_FUSION_PATTERNS
    try:
        with _quiet():
            slim = onnxslim.slim(fixed, skip_optimizations=["weight_tying"],
                                 skip_fusion_patterns=[p for p in DEFAULT_FUSION_PATTERNS if p != "FusionPadConv"])
    except Exception as e:          # simplification is an aid: TVM may still import the model
        logging.getLogger(__name__).debug("onnxslim failed (%s); importing the model as it is", _one_line(e))
        slim = fixed
    return _clip_as_max_min(slim)


def _clip_as_max_min(proto):
    """``Clip(x, lo, hi)`` with constant bounds -> ``Min(Max(x, lo), hi)``.  TVM's ONNX importer
    emits ``Clip`` as opaque TE kernels (plus a NaN test of each bound), which the layout pass wraps
    in transposes and no library chain can take as ReLU6; ``Max``/``Min`` import as Relax's
    ``maximum``/``minimum``.  (onnxslim and onnxscript have no such rewrite.)"""
    import onnx
    from onnx import helper, numpy_helper
    consts = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    consts.update({n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in proto.graph.node
                   if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"})
    nodes, extra = [], []
    for k, n in enumerate(proto.graph.node):
        bounds = list(n.input[1:3]) + [""] * (3 - len(n.input))
        if n.op_type != "Clip" or any(b and (b not in consts or consts[b].size != 1 or np.isnan(consts[b]).any())
                                      for b in bounds):
            nodes.append(n)
            continue
        if not any(bounds):                                 # opset < 11: the bounds are attributes
            attrs = {a.name: a.f for a in n.attribute}
            for j, key in enumerate(("min", "max")):
                if key in attrs:
                    bounds[j] = f"{n.output[0]}__clip_{key}"
                    extra.append(numpy_helper.from_array(np.array(attrs[key], np.float32), bounds[j]))
        x = n.input[0]
        for j, (op, b) in enumerate((("Max", bounds[0]), ("Min", bounds[1]))):
            if not b:
                continue
            out = f"{n.output[0]}__clip_lower" if op == "Max" and bounds[1] else n.output[0]
            nodes.append(helper.make_node(op, [x, b], [out], name=f"{n.name or f'clip{k}'}_{op.lower()}"))
            x = out
        if x == n.input[0]:                                 # no bound at all: an identity
            nodes.append(helper.make_node("Identity", [x], [n.output[0]], name=n.name))
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    out.graph.initializer.extend(extra)
    return out


def _node_label(node, index: int) -> str:
    return f"{node.op_type} (node {node.name!r})" if node.name else f"{node.op_type} (node #{index})"


def _failing_node(exc):
    """The ONNX node TVM was converting when ``exc`` was raised: TVM's converters do not name it,
    but its import loop holds it in the local ``node`` of a frame on the traceback."""
    import onnx
    node, tb = None, exc.__traceback__
    while tb is not None:
        cand = tb.tb_frame.f_locals.get("node")
        node = cand if isinstance(cand, onnx.NodeProto) else node
        tb = tb.tb_next
    return node


def _from_onnx(path: Path, input_shape, inputs=None) -> Model:
    import onnx
    from tvm.relax.frontend.onnx import from_onnx
    try:
        proto = onnx.load(str(path))
        onnx.checker.check_model(proto)
    except Exception as e:
        msg = " ".join(str(e).split())[:200] or type(e).__name__
        raise ModelError(f"malformed ONNX file {path}: {msg}") from None
    specs = {s.name: s for s in inputs or ()}
    inits = {i.name for i in proto.graph.initializer}
    _check_specs(path.name, {i.name: (None, onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type).name)
                             for i in proto.graph.input if i.name not in inits}, inputs)
    shapes = {}
    for inp in proto.graph.input:
        if inp.name in inits:
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in inp.type.tensor_type.shape.dim]
        given = specs[inp.name].shape if inp.name in specs else input_shape if not shapes else None
        if given is not None:
            if len(dims) != len(given) or any(d is not None and d != g for d, g in zip(dims, given)):
                _check_shape(inp.name, [d if d is not None else "?" for d in dims], given)
            dims = list(given)
        if any(d is None for d in dims):
            raise ModelError(f"ONNX input {inp.name!r} has a dynamic shape {dims}; pass --input-shape "
                             "or --input NAME:SHAPE:DTYPE")
        shapes[inp.name] = dims
    if not shapes:
        raise ModelError(f"ONNX file {path} has no inputs")
    simple = _onnx_simplify(proto, shapes)
    try:
        with _quiet():
            mod = from_onnx(simple, shape_dict=shapes)
    except tvm.error.OpNotImplemented as e:
        msg = str(e)        # TVM lists the operator types; name the first node of each
        first = {}
        for i, n in enumerate(simple.graph.node):
            if re.search(rf"\b{re.escape(n.op_type)}\b", msg):
                first.setdefault(n.op_type, _node_label(n, i))
        what = ", ".join(first.values()) or _one_line(e)
        raise ModelError(f"unsupported operator{'s' if len(first) > 1 else ''} in {path.name}: {what}") from None
    except Exception as e:
        node = _failing_node(e)
        where = f" at {_node_label(node, list(simple.graph.node).index(node))}" if node is not None else ""
        raise ModelError(f"cannot import {path}{where}: {_one_line(e)}") from None
    return Model(path.stem, "onnx", mod, graph_inputs(mod), onnx_model=proto, source=str(path),
                 output_names=[o.name for o in proto.graph.output])


def _from_module_attr(spec: str, input_shape, inputs=None) -> Model:
    """``module:attr``: an nn.Module instance, a class or factory giving one, or a factory giving
    ``(module, example_inputs)`` with example_inputs a tensor, a tuple of positional tensors or a
    dict of keyword tensors (exported and checked with those very values)."""
    module_name, _, attr = spec.partition(":")
    try:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise ModelError(f"cannot load PyTorch model {spec}: {e}") from None
    import torch
    if not isinstance(obj, torch.nn.Module) and callable(obj):
        obj = obj()                       # a class or factory
    if isinstance(obj, tuple):
        if len(obj) != 2:
            raise ModelError(f"{spec} returns a tuple of {len(obj)}; a factory returns a module or (module, example_inputs)")
        if input_shape is not None or inputs:
            raise ModelError(f"{spec} returns its own example inputs; drop --input / --input-shape")
        obj, example = obj
        if isinstance(example, torch.Tensor):
            args, kwargs = (example,), {}
        elif isinstance(example, (tuple, list)):
            args, kwargs = tuple(example), {}
        elif isinstance(example, dict):
            args, kwargs = (), dict(example)
        else:
            raise ModelError(f"{spec}: example inputs must be a tensor, a tuple of tensors or a dict of keyword "
                             f"tensors, got {type(example).__name__}")
        return _from_torch(obj, args, kwargs, attr, "torch", spec, given=True)
    shape = input_shape or getattr(obj, "example_input_shape", None)
    if shape is None and not inputs:
        raise ModelError(f"{spec}: pass --input-shape or --input NAME:SHAPE:DTYPE (or give the module an "
                         "example_input_shape attribute, or make the factory return (module, example_inputs))")
    return _from_torch(obj, *_torch_example(inputs, shape), attr, "torch", spec)


def _check_specs(model_name: str, have: dict, inputs) -> None:
    """The user's input specs against the model's inputs ``{name: (shape or None, dtype)}``."""
    for s in inputs or ():
        if s.name not in have:
            raise ModelError(f"{model_name} has no input {s.name!r} (its inputs: {', '.join(have)})")
        shape, dtype = have[s.name]
        if dtype != s.dtype or (shape is not None and tuple(shape) != tuple(s.shape)):
            raise ModelError(f"input {s.name!r} of {model_name} is {dtype}{list(shape) if shape else ''}, "
                             f"not {s.dtype}{list(s.shape)}")


def _apply_specs(model: Model, inputs) -> Model:
    """Check the user's input specs against the loaded model and keep their ranges."""
    _check_specs(model.name, {n: (s, d) for n, s, d in model.inputs}, inputs)
    model.input_ranges.update({s.name: s.range for s in inputs or () if s.range is not None})
    return model


def load_model(spec, input_shape=None, inputs=None) -> Model:
    """Resolve ``spec`` (zoo name, ``.onnx`` path, ``module:attr``, nn.Module or Relax IRModule).

    ``input_shape``: the shape of the (first) input; ``inputs``: a list of ``InputSpec`` naming
    inputs with their shape, dtype and optional value range (for a PyTorch module, keyword inputs)."""
    names = [s.name for s in inputs or ()]
    if len(set(names)) != len(names):
        raise ModelError(f"input given twice: {sorted({n for n in names if names.count(n) > 1})}")
    if input_shape is not None and inputs:
        raise ModelError("give the input shape with --input-shape or with --input, not both")
    return _apply_specs(_load(spec, input_shape, inputs), inputs)


def _load(spec, input_shape, inputs) -> Model:
    if isinstance(spec, tvm.IRModule):
        if not any(gv.name_hint == "main" and isinstance(f, relax.Function) for gv, f in spec.functions_items()):
            raise ModelError("Relax module has no 'main' function")
        n = _output_count(spec)
        return Model("relax-module", "relax", spec, graph_inputs(spec), source="IRModule",
                     output_names=["output"] if n == 1 else [f"output{i}" for i in range(n)])
    if not isinstance(spec, str):
        shape = input_shape or getattr(spec, "example_input_shape", None)
        if shape is None and not inputs:
            raise ModelError("a PyTorch module needs input_shape or inputs")
        return _from_torch(spec, *_torch_example(inputs, shape), type(spec).__name__, "torch", type(spec).__name__)
    if spec in zoo.MODELS:
        module, shape = zoo.build(spec)
        if isinstance(shape, dict):            # named inputs (BERT's token ids and mask)
            if input_shape is not None:
                raise ModelError(f"{spec} takes named inputs ({', '.join(shape)}); give them with --input")
            inputs = inputs or [InputSpec(n, s, d) for n, (s, d) in shape.items()]
            return _from_torch(module, *_torch_example(inputs, None), spec, "zoo", f"zoo:{spec}")
        _check_shape("x", shape, input_shape)
        return _from_torch(module, *_torch_example(inputs, shape), spec, "zoo", f"zoo:{spec}")
    path = Path(spec)
    if spec.endswith(".onnx") or path.exists():
        if not path.is_file():
            raise ModelError(f"model file not found: {spec}")
        return _from_onnx(path, input_shape, inputs)
    if ":" in spec:
        return _from_module_attr(spec, input_shape, inputs)
    raise ModelError(f"unknown model {spec!r}: not a zoo name ({', '.join(zoo.MODELS)}), "
                     "an .onnx file or a module:attr PyTorch model")
