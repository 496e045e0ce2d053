"""Models in: a zoo name, an ONNX file, a PyTorch ``module:attr``, or a Relax IRModule.

Every frontend ends in the same ``Model``: a Relax IRModule with the weights bound as constants,
its input signature, and a *reference* that computes the true output outside TVM (PyTorch for
PyTorch and zoo models, ONNX Runtime for ONNX files, the untuned TVM build for a bare Relax
module), against which every compiled model is checked before it is timed.
"""
from __future__ import annotations

from pathlib import Path

from ... import _tvm  # noqa: F401  (fast TVM import, before tvm itself)
from .. import zoo

import tvm
from tvm import relax
from .model import (InputSpec, Model, ModelError, check_shape, check_specs, embedding_vocab, graph_inputs, ort_session,
                    output_count)
from .onnx import from_onnx
from .pytorch import from_module_attr, from_torch, torch_example

__all__ = ["InputSpec", "Model", "ModelError", "embedding_vocab", "graph_inputs", "load_model", "ort_session"]


def _apply_specs(model: Model, inputs) -> Model:
    """Check the user's input specs against the loaded model and keep their ranges."""
    check_specs(model.name, {n: (s, d) for n, s, d in model.inputs}, inputs)
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
        n = output_count(spec)
        return Model("relax-module", "relax", spec, graph_inputs(spec), source="IRModule",
                     output_names=["output"] if n == 1 else [f"output{i}" for i in range(n)])
    if not isinstance(spec, str):
        shape = input_shape or getattr(spec, "example_input_shape", None)
        if shape is None and not inputs:
            raise ModelError("a PyTorch module needs input_shape or inputs")
        return from_torch(spec, *torch_example(inputs, shape), type(spec).__name__, "torch", type(spec).__name__)
    if spec in zoo.MODELS:
        module, shape = zoo.build(spec)
        if isinstance(shape, dict):            # named inputs (BERT's token ids and mask)
            if input_shape is not None:
                raise ModelError(f"{spec} takes named inputs ({', '.join(shape)}); give them with --input")
            inputs = inputs or [InputSpec(n, s, d) for n, (s, d) in shape.items()]
            return from_torch(module, *torch_example(inputs, None), spec, "zoo", f"zoo:{spec}")
        check_shape("x", shape, input_shape)
        return from_torch(module, *torch_example(inputs, shape), spec, "zoo", f"zoo:{spec}")
    path = Path(spec)
    if spec.endswith(".onnx") or path.exists():
        if not path.is_file():
            raise ModelError(f"model file not found: {spec}")
        return from_onnx(path, input_shape, inputs)
    if ":" in spec:
        return from_module_attr(spec, input_shape, inputs)
    raise ModelError(f"unknown model {spec!r}: not a zoo name ({', '.join(zoo.MODELS)}), "
                     "an .onnx file or a module:attr PyTorch model")
