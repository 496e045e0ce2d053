"""Built-in operator workloads and the Chameleon paper's layers L1-L8.

The paper (Table 5) names its layers by network and task index but prints no shapes.  We number
each network's distinct convolution workloads in network order, 1-based, as AutoTVM's task
extraction deduplicates them:

* AlexNet (5 conv tasks): 1 = conv1 3->64 11x11/4 @224, 4 = conv4 384->256 3x3 @13.
* VGG-16 (9 distinct convs): 1 = 3->64 @224, 2 = 64->64 @224, 4 = 128->128 @112.
* ResNet-18 (11 distinct convs + dense = 12 tasks): 1 = 7x7 stem, 2 = 64->64 @56,
  3 = 64->128 3x3/2, 4 = 64->128 1x1/2, 5 = 128->128 @28, 6 = 128->256 3x3/2 @28,
  7 = 128->256 1x1/2, 8 = 256->256 @14, 9 = 256->512 3x3/2 @14, 10 = 256->512 1x1/2,
  11 = 512->512 @7.

Workload specs on the command line: a name above (``L1``..``L8``, ``resnet18-8`` ...), or
``conv2d:N,C,H,W,K,R,S[,stride[,pad]]``, ``depthwise:N,C,H,W,R[,stride[,pad]]``,
``dense:M,N,K`` (C = A·Bᵀ) and ``matmul:M,N,K`` (C = A·B).  ``conv2d_nhwc:`` and
``depthwise_nhwc:`` take the same numbers and build the convolution as a model runs it after our
layout pass: NHWC activations, OHWI weights marked layout-free, so the tuned kernel packs them once
(MetaSchedule's layout rewrite) as the expert x86 design space expects; ``linear:M,N,K`` is
``dense`` with its weight B marked layout-free the same way (a model's dense layer).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._tvm import tvm
from tvm import te, topi


class WorkloadError(ValueError):
    """An unknown workload name or a malformed / impossible shape."""


@dataclass(frozen=True)
class Workload:
    kind: str            # conv2d | depthwise | conv2d_nhwc | depthwise_nhwc | dense | linear | matmul
    shape: tuple         # kind-specific integers, see module docstring
    name: str = ""

    @property
    def label(self) -> str:
        return self.name or f"{self.kind}:{','.join(map(str, self.shape))}"

    @property
    def is_conv(self) -> bool:
        return self.kind in CONV_KINDS

    @property
    def nhwc(self) -> bool:
        return self.kind.endswith("_nhwc")

    @property
    def packed(self) -> bool:
        """Whether the weight is marked layout-free (packed once, as in a model)."""
        return self.nhwc or self.kind == "linear"

    def as_nhwc(self) -> "Workload":
        """The same convolution in the layout models run it in (NHWC, OHWI weights packed once)."""
        if self.kind not in ("conv2d", "depthwise"):
            raise WorkloadError(f"{self.label} is not an NCHW convolution")
        return Workload(self.kind + "_nhwc", self.shape, f"{self.name}-nhwc" if self.name else "")

    # -- shapes ---------------------------------------------------------------------------------
    def _conv_dims(self):
        if self.kind in ("conv2d", "conv2d_nhwc"):
            n, c, h, w, k, r, s, stride, pad = self.shape
        else:
            n, c, h, w, r, stride, pad = self.shape
            k, s = c, r
        oh = (h + 2 * pad - r) // stride + 1
        ow = (w + 2 * pad - s) // stride + 1
        return n, c, h, w, k, r, s, stride, pad, oh, ow

    def arg_shapes(self) -> list[tuple]:
        if self.is_conv:
            n, c, h, w, k, r, s, _, _, oh, ow = self._conv_dims()
            depthwise = self.kind.startswith("depthwise")
            if self.nhwc:
                return [(n, h, w, c), (c, r, s, 1) if depthwise else (k, r, s, c), (n, oh, ow, k)]
            return [(n, c, h, w), (c, 1, r, s) if depthwise else (k, c, r, s), (n, k, oh, ow)]
        m, n, k = self.shape
        return [(m, k), (k, n) if self.kind == "matmul" else (n, k), (m, n)]

    @property
    def flops(self) -> float:
        if self.is_conv:
            n, c, h, w, k, r, s, _, _, oh, ow = self._conv_dims()
            per_out = (1 if self.kind.startswith("depthwise") else c) * r * s
            return 2.0 * n * k * oh * ow * per_out
        m, n, k = self.shape
        return 2.0 * m * n * k

    # -- TVM --------------------------------------------------------------------------------------
    def mod(self) -> "tvm.IRModule":
        """The workload as a TIR PrimFunc ``main``.  NCHW convolutions and matmuls have no
        ``layout_free_buffers`` (weights keep their layout, as the paper's layers were tuned); the
        NHWC kinds mark the weight layout-free, as Relax marks a model's weights."""
        shapes = self.arg_shapes()
        a = te.placeholder(shapes[0], "float32", name="data" if self.is_conv else "A")
        b = te.placeholder(shapes[1], "float32", name="weight" if self.is_conv else "B")
        if self.nhwc:
            n, c, *_, stride, pad, _, _ = self._conv_dims()
            groups = c if self.kind.startswith("depthwise") else 1
            out = topi.nn.conv(a, b, stride, pad, 1, groups, "NHWC", "OHWI", out_dtype="float32")
        elif self.kind == "conv2d":
            _, _, _, _, _, _, _, stride, pad, _, _ = self._conv_dims()
            out = topi.nn.conv2d_nchw(a, b, stride, pad, 1, out_dtype="float32")
        elif self.kind == "depthwise":
            _, _, _, _, _, _, _, stride, pad, _, _ = self._conv_dims()
            out = topi.nn.depthwise_conv2d_nchw(a, b, stride, pad, 1, out_dtype="float32")
        else:
            m, n, k = self.shape
            rk = te.reduce_axis((0, k), name="k")
            if self.kind in ("dense", "linear"):
                out = te.compute((m, n), lambda i, j: te.sum(a[i, rk] * b[j, rk], axis=rk), name="T_dense")
            else:
                out = te.compute((m, n), lambda i, j: te.sum(a[i, rk] * b[rk, j], axis=rk), name="T_matmul")
        func = te.create_prim_func([a, b, out])
        if "layout_free_buffers" in (func.attrs or {}):
            func = func.without_attr("layout_free_buffers")
        if self.packed:
            func = func.with_attr("layout_free_buffers", [1])
        return tvm.IRModule({"main": func})

    # -- numerics ---------------------------------------------------------------------------------
    def random_inputs(self, seed: int = 0) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        return [rng.uniform(-1, 1, s).astype("float32") for s in self.arg_shapes()[:2]]

    def reference(self, inputs: list[np.ndarray]) -> np.ndarray:
        """numpy result computed in float64, independent of TVM."""
        a, b = (x.astype("float64") for x in inputs)
        if self.nhwc:     # the NCHW reference on transposed operands
            nchw = Workload(self.kind.removesuffix("_nhwc"), self.shape)
            out = nchw.reference([a.transpose(0, 3, 1, 2), b.transpose(0, 3, 1, 2)])
            return out.transpose(0, 2, 3, 1)
        if self.is_conv:
            n, c, h, w, k, r, s, stride, pad, oh, ow = self._conv_dims()
            ap = np.pad(a, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
            win = np.lib.stride_tricks.sliding_window_view(ap, (r, s), axis=(2, 3))[:, :, ::stride, ::stride]
            win = win[:, :, :oh, :ow]                      # (n, c, oh, ow, r, s)
            if self.kind == "conv2d":
                return np.einsum("ncyxrs,kcrs->nkyx", win, b, optimize=True)
            return np.einsum("ncyxrs,crs->ncyx", win, b[:, 0], optimize=True)
        return a @ (b if self.kind == "matmul" else b.T)


_ARITY = {"conv2d": (7, 9), "depthwise": (5, 7), "conv2d_nhwc": (7, 9), "depthwise_nhwc": (5, 7),
          "dense": (3, 3), "linear": (3, 3), "matmul": (3, 3)}
CONV_KINDS = ("conv2d", "depthwise", "conv2d_nhwc", "depthwise_nhwc")

PAPER_LAYERS = {
    # name: (conv2d N, C, H, W, K, R, S, stride, pad), source
    "L1": ((1, 3, 224, 224, 64, 11, 11, 4, 2), "AlexNet task 1 (conv1)"),
    "L2": ((1, 384, 13, 13, 256, 3, 3, 1, 1), "AlexNet task 4 (conv4)"),
    "L3": ((1, 3, 224, 224, 64, 3, 3, 1, 1), "VGG-16 task 1 (conv1_1)"),
    "L4": ((1, 64, 224, 224, 64, 3, 3, 1, 1), "VGG-16 task 2 (conv1_2)"),
    "L5": ((1, 128, 112, 112, 128, 3, 3, 1, 1), "VGG-16 task 4 (conv2_2)"),
    "L6": ((1, 128, 28, 28, 256, 3, 3, 2, 1), "ResNet-18 task 6 (layer3.0.conv1)"),
    "L7": ((1, 256, 14, 14, 512, 3, 3, 2, 1), "ResNet-18 task 9 (layer4.0.conv1)"),
    "L8": ((1, 512, 7, 7, 512, 3, 3, 1, 1), "ResNet-18 task 11 (layer4 3x3)"),
}
NAMED = {k: Workload("conv2d", v[0], k) for k, v in PAPER_LAYERS.items()}
NAMED["resnet18-8"] = Workload("conv2d", (1, 256, 14, 14, 256, 3, 3, 1, 1), "resnet18-8")
NAMED["tiny-conv"] = Workload("conv2d", (1, 16, 14, 14, 16, 3, 3, 1, 1), "tiny-conv")
NAMED["tiny-dense"] = Workload("dense", (64, 64, 64), "tiny-dense")
DEFAULT_WORKLOAD = "L8"


def get_workload(spec: str) -> Workload:
    """Parse a workload name or ``kind:dims`` spec; raise WorkloadError with a one-line reason."""
    spec = spec.strip()
    if spec in NAMED:
        return NAMED[spec]
    if ":" not in spec:
        raise WorkloadError(f"unknown workload {spec!r}; known: {', '.join(sorted(NAMED))}, or kind:dims "
                            f"with kind in {', '.join(_ARITY)}")
    kind, _, dims = spec.partition(":")
    if kind not in _ARITY:
        raise WorkloadError(f"unknown workload kind {kind!r}; use {', '.join(_ARITY)}")
    try:
        vals = [int(x) for x in dims.split(",")]
    except ValueError:
        raise WorkloadError(f"bad shape {dims!r}: expected comma-separated integers") from None
    lo, hi = _ARITY[kind]
    if not lo <= len(vals) <= hi:
        raise WorkloadError(f"{kind} needs {lo}{'' if lo == hi else f'-{hi}'} integers, got {len(vals)}")
    if kind in CONV_KINDS:
        vals += [1, 0][len(vals) - lo:]          # default stride 1, pad 0
    if any(v <= 0 for v in vals[:lo]) or (kind in CONV_KINDS and (vals[-2] <= 0 or vals[-1] < 0)):
        raise WorkloadError(f"bad shape {dims!r}: sizes must be positive (pad >= 0)")
    wl = Workload(kind, tuple(vals))
    if kind in CONV_KINDS:
        *_, oh, ow = wl._conv_dims()
        if oh <= 0 or ow <= 0:
            raise WorkloadError(f"bad shape {dims!r}: kernel larger than padded input")
    return wl
