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


@dataclass
class Model:
    name: str
    kind: str                                   # zoo | onnx | torch | relax
    mod: "tvm.IRModule"                         # Relax, weights bound as constants
    inputs: list[tuple[str, tuple[int, ...], str]]
    torch_module: object | None = None
    onnx_model: object | None = None
    source: str = ""
    _onnx_cache: dict = field(default_factory=dict, repr=False)

    def example_inputs(self, seed: int = 0) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        return [rng.standard_normal(shape).astype(dtype) for _, shape, dtype in self.inputs]

    def onnx_proto(self):
        """The model as ONNX (exported from PyTorch once, if it came from there)."""
        if self.onnx_model is None and self.torch_module is not None and "proto" not in self._onnx_cache:
            import torch
            for name in ("torch.onnx", "torch.export", "onnxscript"):
                logging.getLogger(name).setLevel(logging.ERROR)
            args = tuple(torch.from_numpy(a) for a in self.example_inputs())
            with _quiet():
                self._onnx_cache["proto"] = torch.onnx.export(self.torch_module, args, dynamo=True,
                                                              verbose=False).model_proto
        return self.onnx_model if self.onnx_model is not None else self._onnx_cache.get("proto")

    def reference(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """The output computed outside TVM (float32, as the framework computes it)."""
        if self.torch_module is not None:
            import torch
            with torch.no_grad():
                out = self.torch_module(*[torch.from_numpy(a) for a in inputs])
            outs = out if isinstance(out, (tuple, list)) else [out]
            return [o.detach().numpy() for o in outs]
        if self.onnx_model is not None:
            sess = ort_session(self.onnx_model)
            return list(sess.run(None, {n: a for (n, _, _), a in zip(self.inputs, inputs)}))
        from .compile import run_vm, build_untuned      # a bare Relax module: TVM's own default build
        return run_vm(build_untuned(self), inputs)


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


def _check_shape(name: str, want, got) -> None:
    if got is not None and tuple(got) != tuple(want):
        raise ModelError(f"input shape mismatch: model input {name!r} is {list(want)}, got {list(got)}")


def _from_torch(module, example_shape, name: str, kind: str, source: str) -> Model:
    import torch
    from tvm.relax.frontend.torch import from_exported_program
    if not isinstance(module, torch.nn.Module):
        raise ModelError(f"{source}: not a torch.nn.Module (got {type(module).__name__})")
    module = module.eval()
    x = torch.randn(*example_shape)
    try:
        with _quiet():
            ep = torch.export.export(module, (x,))
    except Exception as e:              # shape errors from the model's own layers
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelError(f"input shape mismatch: {name} does not run on input {list(example_shape)} ({msg})") from None
    try:
        with _quiet():
            mod = from_exported_program(ep, keep_params_as_input=False)
    except Exception as e:
        msg = " ".join(str(e).split())[:300]
        raise ModelError(f"unsupported operator in {name}: {msg}") from None
    return Model(name, kind, mod, graph_inputs(mod), torch_module=module, source=source)


def _from_onnx(path: Path, input_shape) -> Model:
    import onnx
    from tvm.relax.frontend.onnx import from_onnx
    try:
        proto = onnx.load(str(path))
        onnx.checker.check_model(proto)
    except Exception as e:
        msg = " ".join(str(e).split())[:200] or type(e).__name__
        raise ModelError(f"malformed ONNX file {path}: {msg}") from None
    inits = {i.name for i in proto.graph.initializer}
    shapes = {}
    for inp in proto.graph.input:
        if inp.name in inits:
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in inp.type.tensor_type.shape.dim]
        if input_shape is not None and len(shapes) == 0:
            if len(dims) != len(input_shape) or any(d is not None and d != g for d, g in zip(dims, input_shape)):
                _check_shape(inp.name, [d if d is not None else "?" for d in dims], input_shape)
            dims = list(input_shape)
        if any(d is None for d in dims):
            raise ModelError(f"ONNX input {inp.name!r} has a dynamic shape {dims}; pass --input-shape")
        shapes[inp.name] = dims
    if not shapes:
        raise ModelError(f"ONNX file {path} has no inputs")
    try:
        with _quiet():
            mod = from_onnx(proto, shape_dict=shapes)
    except tvm.error.OpNotImplemented as e:
        raise ModelError(f"unsupported operator in {path.name}: {' '.join(str(e).split())}") from None
    except Exception as e:
        raise ModelError(f"cannot import {path}: {' '.join(str(e).split())[:300]}") from None
    return Model(path.stem, "onnx", mod, graph_inputs(mod), onnx_model=proto, source=str(path))


def _from_module_attr(spec: str, input_shape) -> Model:
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
    shape = input_shape or getattr(obj, "example_input_shape", None)
    if shape is None:
        raise ModelError(f"{spec}: pass --input-shape (or give the module an example_input_shape attribute)")
    return _from_torch(obj, tuple(shape), attr, "torch", spec)


def load_model(spec, input_shape=None) -> Model:
    """Resolve ``spec`` (zoo name, ``.onnx`` path, ``module:attr``, nn.Module or Relax IRModule)."""
    if isinstance(spec, tvm.IRModule):
        if not any(gv.name_hint == "main" and isinstance(f, relax.Function) for gv, f in spec.functions_items()):
            raise ModelError("Relax module has no 'main' function")
        return Model("relax-module", "relax", spec, graph_inputs(spec), source="IRModule")
    if not isinstance(spec, str):
        shape = input_shape or getattr(spec, "example_input_shape", None)
        if shape is None:
            raise ModelError("a PyTorch module needs input_shape")
        return _from_torch(spec, tuple(shape), type(spec).__name__, "torch", type(spec).__name__)
    if spec in zoo.MODELS:
        module, shape = zoo.build(spec)
        _check_shape("x", shape, input_shape)
        return _from_torch(module, shape, spec, "zoo", f"zoo:{spec}")
    path = Path(spec)
    if spec.endswith(".onnx") or path.exists():
        if not path.is_file():
            raise ModelError(f"model file not found: {spec}")
        return _from_onnx(path, input_shape)
    if ":" in spec:
        return _from_module_attr(spec, input_shape)
    raise ModelError(f"unknown model {spec!r}: not a zoo name ({', '.join(zoo.MODELS)}), "
                     "an .onnx file or a module:attr PyTorch model")
