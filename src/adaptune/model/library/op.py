"""``LibraryOp``: one fusable chain's signature (kind, shapes, attributes, epilogue), its label
and FLOPs, and the time of its library call through the path the model uses."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm

from ..timing import time_callable
from .calls import (digest, onednn_conv2d, onednn_conv2d_add, onednn_linear, onednn_linear_add, torch_bmm,
                    torch_layer_norm, torch_softmax)


def shape_of(expr) -> tuple[int, ...]:
    return tuple(int(d) for d in expr.ty.shape)


@dataclass(frozen=True)
class LibraryOp:
    """One fusable chain's signature: kind, shapes, attributes and epilogue."""
    kind: str                           # "conv2d" | "linear" | "bmm" | "softmax" | "layer_norm"
    data: tuple[int, ...]               # conv2d: NHWC; linear: (..., in); bmm: (batch..., m, k); softmax: x
    weight: tuple[int, ...]             # as the vendor op takes it: OIHW | (out, in); bmm: (batch..., k, n);
                                        # softmax: the mask's shape, () without one; layer_norm: (C,)
    out: tuple[int, ...]
    attrs: tuple = ()                   # conv2d: (padding (h, w), strides, dilation, groups); softmax: (scale,);
                                        # layer_norm: (eps,)
    residual: bool = False              # a residual tensor added before the post-op (softmax: the mask)
    post: str = "none"                  # unary post-op, scalars after colons ("hardtanh:0:6")

    @property
    def label(self) -> str:
        tail = ("+add" if self.residual else "") + ("" if self.post == "none" else "+" + self.post.split(":")[0])
        if self.kind == "conv2d":
            pad, (sh, _), _, g = self.attrs
            return (f"conv2d {self.data[3]}->{self.weight[0]} {self.weight[2]}x{self.weight[3]} s{sh} p{pad[0]}"
                    f"{f' g{g}' if g > 1 else ''} @{self.data[1]}x{self.data[2]}{tail}")
        if self.kind == "bmm":
            return f"bmm {'x'.join(map(str, self.data))} @ {'x'.join(map(str, self.weight))}"
        if self.kind == "softmax":
            scale = f" *{self.attrs[0]:.4g}" if self.attrs[0] != 1.0 else ""
            return f"softmax {'x'.join(map(str, self.data))}{scale}{'+mask' if self.residual else ''}"
        if self.kind == "layer_norm":
            return f"layer_norm {'x'.join(map(str, self.data))}"
        return f"linear {'x'.join(map(str, self.data))} -> {self.weight[0]}{tail}"

    def vendor(self, gpu: bool = False) -> str:
        """Whose kernel the library call runs: oneDNN's fused conv/dense calls, PyTorch's own ops
        for the rest (its batched matmul picks oneDNN or MKL itself); on a GPU cuDNN and cuBLAS."""
        if self.kind in ("conv2d", "linear"):
            return ("cuDNN" if self.kind == "conv2d" else "cuBLAS") if gpu else "oneDNN"
        return "PyTorch"

    @property
    def flops(self) -> float:
        if self.kind == "softmax":
            return 5.0 * np.prod(self.out)                   # scale, mask, max, exp, sum, divide
        if self.kind == "layer_norm":
            return 8.0 * np.prod(self.out)                   # mean, variance, normalise, scale, shift
        if self.kind == "conv2d":
            return 2.0 * np.prod(self.out) * np.prod(self.weight[1:])
        return 2.0 * np.prod(self.out) * (self.weight[-2] if self.kind == "bmm" else self.weight[1])   # k; in

    def time(self, *, repeat: int = 5, dev=None) -> float:
        """Seconds per call of the fused library kernel, through the DLPack path the model uses,
        on ``dev`` (default the CPU; on a GPU each timed call waits for the device)."""
        dev = dev or tvm.cpu()
        rng = np.random.default_rng(0)

        def timed(call):
            return time_callable(lambda: (call(), dev.sync()), repeat=repeat, min_repeat_ms=100)

        def tensors(*shapes):
            arrays = [rng.standard_normal(s).astype("float32") for s in shapes]
            return arrays, [tvm.runtime.tensor(a, dev) for a in arrays]
        if self.kind == "softmax":
            _, (x, mask) = tensors(self.data, self.weight)
            return timed(lambda: torch_softmax(x, self.attrs[0], mask if self.residual else None))
        if self.kind == "layer_norm":
            _, (x, g, b) = tensors(self.data, self.weight, self.weight)
            return timed(lambda: torch_layer_norm(x, g, b, self.attrs[0]))
        arrays, (x, w, b, other) = tensors(self.data, self.weight, (self.weight[0],), self.out)
        if self.kind == "bmm":
            return timed(lambda: torch_bmm(x, w))
        key = digest(self, arrays[1], arrays[2])
        if self.kind == "linear" and self.residual:
            return timed(lambda: onednn_linear_add(x, other, w, b, key))
        if self.kind == "linear":
            return timed(lambda: onednn_linear(x, w, b, self.post, key))
        if self.residual:
            return timed(lambda: onednn_conv2d_add(x, other, w, b, *self.attrs, self.post, key))
        return timed(lambda: onednn_conv2d(x, w, b, *self.attrs, self.post, key))


def workload_call(wl) -> tuple:
    """oneDNN's fused call (zero bias, pre-packed weight, NHWC activations: the model's library
    path) on an operator workload's shape and random inputs, checked against the workload's numpy
    reference: ``(callable, relative error)``.  Convolutions (either layout) and dense layers; a
    matmul whose B is not transposed has no such call (ValueError)."""
    from ...measure.verify import relative_error
    inputs = wl.random_inputs()
    ref = wl.reference(inputs)
    key = hash((wl.kind, wl.shape))
    if wl.is_conv:
        n, c, h, w, k, r, s, stride, pad, oh, ow = wl._conv_dims()
        x, weight = inputs
        if wl.nhwc:
            weight = weight.transpose(0, 3, 1, 2)                 # OHWI -> OIHW
        else:
            x, ref = x.transpose(0, 2, 3, 1), ref.transpose(0, 2, 3, 1)
        groups = c if wl.kind.startswith("depthwise") else 1
        args = [tvm.runtime.tensor(np.ascontiguousarray(a)) for a in (x, weight, np.zeros(k, "float32"))]
        call = lambda: onednn_conv2d(*args, (pad, pad), (stride, stride), (1, 1), groups, "none", key)  # noqa: E731
    elif wl.kind in ("dense", "linear"):
        args = [tvm.runtime.tensor(a) for a in (*inputs, np.zeros(wl.shape[1], "float32"))]
        call = lambda: onednn_linear(*args, "none", key)  # noqa: E731
    else:
        raise ValueError(f"no oneDNN call for {wl.kind}")
    return call, relative_error(call().numpy(), ref)
