"""PyTorch models in: a ``module:attr`` (a module, or a factory returning ``(module, example_inputs)``),
exported with ``torch.export`` and imported into Relax; outputs of any structure are flattened."""
from __future__ import annotations

import importlib
import os
import sys

import numpy as np

from .model import (TENSOR, Model, ModelError, _draw, graph_inputs, one_line, output_count, quiet, tensor_leaves,
                    tensor_outputs_only)


def register_dataclasses(out) -> None:
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


def without_cache(module, kwargs: dict) -> None:
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


def _describe(args, kwargs) -> str:
    """The inputs a module was called with, for messages: ``input float32[1, 3], mask=int64[1, 8]``."""
    def one(t):
        return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}" if hasattr(t, "shape") else repr(t)
    return "input " + ", ".join([one(a) for a in args] + [f"{k}={one(v)}" for k, v in kwargs.items()])


def from_torch(module, args, kwargs, name: str, kind: str, source: str, given: bool = False) -> Model:
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
    without_cache(module, kwargs)
    try:
        with torch.no_grad(), quiet():
            out = module(*args, **kwargs)
    except Exception as e:
        raise ModelError(f"{name} does not run on {_describe(args, kwargs)}: {one_line(e)}") from None
    register_dataclasses(out)
    names = [n for n, _ in tensor_leaves(out)]
    if not names:
        raise ModelError(f"{name} returns no tensor (got {type(out).__name__})")
    try:
        with quiet():
            ep = torch.export.export(module, args, kwargs)
    except Exception as e:
        raise ModelError(f"torch.export cannot export {name}: {type(e).__name__}: {one_line(e)}") from None
    user = [TENSOR if isinstance(s.arg, TensorArgument) else s.arg.value
            for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    try:
        with quiet():
            mod = tensor_outputs_only(from_exported_program(ep, keep_params_as_input=False))
    except Exception as e:
        raise ModelError(f"unsupported operator in {name}: {one_line(e)}") from None
    if output_count(mod) != len(names):
        raise ModelError(f"{name}: TVM's import returns {output_count(mod)} outputs, the module {len(names)}")
    values = [t.numpy() for t in tree_flatten(ep.example_inputs)[0] if isinstance(t, torch.Tensor)]
    return Model(name, kind, mod, graph_inputs(mod), torch_module=module, source=source, output_names=names,
                 given_inputs=values if given else None, torch_signature=(ep.call_spec.in_spec, user))


def torch_example(inputs, shape) -> tuple[tuple, dict]:
    """Example call for a module: the ``--input`` specs as keyword tensors (named like the
    forward's parameters), or one float tensor of ``shape``."""
    import torch
    if inputs:
        rng = np.random.default_rng(0)
        return (), {s.name: torch.from_numpy(_draw(rng, s.name, s.shape, s.dtype, s.range)) for s in inputs}
    return (torch.randn(*shape),), {}


def from_module_attr(spec: str, input_shape, inputs=None) -> Model:
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
        return from_torch(obj, args, kwargs, attr, "torch", spec, given=True)
    shape = input_shape or getattr(obj, "example_input_shape", None)
    if shape is None and not inputs:
        raise ModelError(f"{spec}: pass --input-shape or --input NAME:SHAPE:DTYPE (or give the module an "
                         "example_input_shape attribute, or make the factory return (module, example_inputs))")
    return from_torch(obj, *torch_example(inputs, shape), attr, "torch", spec)
