"""ONNX files in: constants and shapes folded (onnxslim), ``Clip`` rewritten for TVM's importer,
and an operator TVM cannot import named with its node."""
from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import tvm

from .model import Model, ModelError, check_shape, check_specs, graph_inputs, one_line, quiet


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
        with quiet():
            slim = onnxslim.slim(fixed, skip_optimizations=["weight_tying"],
                                 skip_fusion_patterns=[p for p in DEFAULT_FUSION_PATTERNS if p != "FusionPadConv"])
    except Exception as e:          # simplification is an aid: TVM may still import the model
        logging.getLogger(__name__).debug("onnxslim failed (%s); importing the model as it is", one_line(e))
        slim = fixed
    return _clip_as_max_min(slim)


def _clip_as_max_min(proto):
    """``Clip(x, lo, hi)`` with constant bounds -> ``Min(Max(x, lo), hi)``.  TVM's ONNX importer
    emits ``Clip`` as opaque TE kernels (plus a NaN test of each bound), which the layout pass wraps
    in transposes and no library chain can take as ReLU6; ``Max``/``Min`` import as Relax's
    ``maximum``/``minimum``.  (onnxslim and onnxscript have no such rewrite.)"""
    import onnx
    from onnx import helper, numpy_helper
    wanted = {b for n in proto.graph.node if n.op_type == "Clip" for b in n.input[1:3] if b}   # decode only bounds
    consts = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer if i.name in wanted}
    consts.update({n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in proto.graph.node
                   if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"
                   and n.output[0] in wanted})
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


def _decode_constants(proto) -> None:
    """Decode every initializer and ``Constant`` tensor once: ONNX's checker does not, and a tensor
    whose data does not fill its shape (a damaged file) would otherwise fail deep in a graph pass."""
    from onnx import numpy_helper
    tensors = [*proto.graph.initializer, *(a.t for n in proto.graph.node if n.op_type == "Constant"
                                           for a in n.attribute if a.name == "value")]
    for t in tensors:
        try:
            numpy_helper.to_array(t)
        except Exception as e:      # noqa: BLE001 - any decoding error is a damaged tensor
            raise ValueError(f"tensor {t.name!r} does not decode ({one_line(e)})") from None


def from_onnx(path: Path, input_shape, inputs=None) -> Model:
    import onnx
    from tvm.relax.frontend.onnx import from_onnx
    try:
        proto = onnx.load(str(path))
        onnx.checker.check_model(proto)
        _decode_constants(proto)
    except Exception as e:
        msg = " ".join(str(e).split())[:200] or type(e).__name__
        raise ModelError(f"malformed ONNX file {path}: {msg}") from None
    specs = {s.name: s for s in inputs or ()}
    inits = {i.name for i in proto.graph.initializer}
    check_specs(path.name, {i.name: (None, onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type).name)
                             for i in proto.graph.input if i.name not in inits}, inputs)
    shapes = {}
    for inp in proto.graph.input:
        if inp.name in inits:
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in inp.type.tensor_type.shape.dim]
        given = specs[inp.name].shape if inp.name in specs else input_shape if not shapes else None
        if given is not None:
            if len(dims) != len(given) or any(d is not None and d != g for d, g in zip(dims, given)):
                check_shape(inp.name, [d if d is not None else "?" for d in dims], given)
            dims = list(given)
        if any(d is None for d in dims):
            raise ModelError(f"ONNX input {inp.name!r} has a dynamic shape {dims}; pass --input-shape "
                             "or --input NAME:SHAPE:DTYPE")
        shapes[inp.name] = dims
    if not shapes:
        raise ModelError(f"ONNX file {path} has no inputs")
    simple = _onnx_simplify(proto, shapes)
    try:
        with quiet():
            mod = from_onnx(simple, shape_dict=shapes)
    except tvm.error.OpNotImplemented as e:
        msg = str(e)        # TVM lists the operator types; name the first node of each
        first = {}
        for i, n in enumerate(simple.graph.node):
            if re.search(rf"\b{re.escape(n.op_type)}\b", msg):
                first.setdefault(n.op_type, _node_label(n, i))
        what = ", ".join(first.values()) or one_line(e)
        raise ModelError(f"unsupported operator{'s' if len(first) > 1 else ''} in {path.name}: {what}") from None
    except Exception as e:
        node = _failing_node(e)
        where = f" at {_node_label(node, list(simple.graph.node).index(node))}" if node is not None else ""
        raise ModelError(f"cannot import {path}{where}: {one_line(e)}") from None
    return Model(path.stem, "onnx", mod, graph_inputs(mod), onnx_model=proto, source=str(path),
                 output_names=[o.name for o in proto.graph.output])
