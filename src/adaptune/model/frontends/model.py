"""The ``Model`` every frontend ends in: a Relax IRModule with the weights bound as constants, its
input signature and example values, and a *reference* that computes the true output outside TVM."""
from __future__ import annotations

import contextlib
import io
import logging
import os
import warnings
from dataclasses import dataclass, field

import numpy as np
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
        return tree_unflatten([next(it) if v is TENSOR else v for v in user], spec)

    def onnx_proto(self):
        """The model as ONNX (exported from PyTorch once, if it came from there)."""
        if self.onnx_model is None and self.torch_module is not None and "proto" not in self._onnx_cache:
            import torch
            for name in ("torch.onnx", "torch.export", "onnxscript"):
                logging.getLogger(name).setLevel(logging.ERROR)
            args, kwargs = self.torch_args([torch.from_numpy(a) for a in self.example_inputs()])
            with quiet():
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
            return [o.detach().numpy() for _, o in tensor_leaves(out)]
        if self.onnx_model is not None:
            sess = ort_session(self.onnx_model)
            return list(sess.run(None, {n: a for (n, _, _), a in zip(self.inputs, inputs)}))
        from ..compile import run_vm, build_untuned      # a bare Relax module: TVM's own default build
        return run_vm(build_untuned(self), inputs)


TENSOR = object()     # marks a tensor slot among an export's user inputs (the others are constants)


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


def tensor_leaves(out) -> list[tuple[str, object]]:
    """(name, tensor) of every tensor in a model's output, in torch pytree order (the order of
    the exported program's outputs); names are the pytree key paths, e.g. ``last_hidden_state``."""
    import torch
    from torch.utils._pytree import keystr, tree_flatten_with_path
    leaves, _ = tree_flatten_with_path(out)
    return [(keystr(path).lstrip(".") or "output", leaf) for path, leaf in leaves if isinstance(leaf, torch.Tensor)]


def one_line(e: Exception, limit: int = 300) -> str:
    return " ".join(str(e).split())[:limit] or type(e).__name__


@contextlib.contextmanager
def quiet():
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


def output_count(mod) -> int:
    def count(ty):
        return sum(count(f) for f in ty.fields) if isinstance(ty, tvm.ir.TupleType) else 1
    return count(mod["main"].ret_ty)


def tensor_outputs_only(mod):
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


def check_shape(name: str, want, got) -> None:
    if got is not None and tuple(got) != tuple(want):
        raise ModelError(f"input shape mismatch: model input {name!r} is {list(want)}, got {list(got)}")


def check_specs(model_name: str, have: dict, inputs) -> None:
    """The user's input specs against the model's inputs ``{name: (shape or None, dtype)}``."""
    for s in inputs or ():
        if s.name not in have:
            raise ModelError(f"{model_name} has no input {s.name!r} (its inputs: {', '.join(have)})")
        shape, dtype = have[s.name]
        if dtype != s.dtype or (shape is not None and tuple(shape) != tuple(s.shape)):
            raise ModelError(f"input {s.name!r} of {model_name} is {dtype}{list(shape) if shape else ''}, "
                             f"not {s.dtype}{list(s.shape)}")
