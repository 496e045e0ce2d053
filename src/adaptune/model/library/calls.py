"""The library's kernels as packed functions a compiled model calls: oneDNN's fused convolution
and dense calls (``torch.ops.mkldnn``, weights reordered once per call site), PyTorch's batched
matmul, softmax and layer norm.  Registered when this module is imported (``compile.load`` imports
it, so an exported library that calls them loads and runs in a fresh process).  NHWC tensors are
what oneDNN calls channels-last NCHW, so activations pass through DLPack with no copy.

On a GPU (tensors that live on CUDA) the same calls run PyTorch's CUDA ops: cuDNN's convolution
(channels-last weights, so it picks its NHWC kernels) and cuBLAS's GEMM, the epilogue as PyTorch's
in-place elementwise ops; both sides launch on CUDA's default stream, so no synchronisation."""
from __future__ import annotations

import functools
import hashlib

import numpy as np
import torch
import tvm
import tvm_ffi

CONV, CONV_ADD, LINEAR = "adaptune.onednn.conv2d", "adaptune.onednn.conv2d_add", "adaptune.onednn.linear"
LINEAR_ADD = "adaptune.onednn.linear_add"
BMM = "adaptune.onednn.bmm"
SOFTMAX, SOFTMAX_MASK = "adaptune.torch.softmax", "adaptune.torch.softmax_mask"
LAYER_NORM = "adaptune.torch.layer_norm"

_CALLS: dict = {}           # (kind, digest of op, weight and bias) -> what the call needs besides x


def _post(spec: str):
    """``"hardtanh:0:6"`` -> ("hardtanh", [0.0, 6.0], ""): a post-op, its scalars and its algorithm,
    as the op takes them (GELU names its algorithm: "none" is erf's, "tanh" the approximation)."""
    name, *scalars = spec.split(":")
    if name.startswith("gelu"):
        return "gelu", [], "tanh" if name == "gelu_tanh" else "none"
    return name, [float(s) for s in scalars], ""


_post = functools.lru_cache(maxsize=None)(_post)


def _nchw(t):
    """An NHWC TVM tensor as the channels-last NCHW torch tensor oneDNN expects (a view, no copy)."""
    return torch.from_dlpack(t).permute(0, 3, 1, 2)


def _to_tvm_nhwc(y):
    """oneDNN's channels-last NCHW output back to a compact NHWC TVM tensor (a view unless ambiguous)."""
    y = y.permute(0, 2, 3, 1)
    return tvm.runtime.from_dlpack(y if y.is_contiguous() else y.contiguous())


def _conv_call(key, tx, w, b, padding, stride, dilation, groups, post):
    """The conv call's fixed arguments, prepared once per call site: the weight reordered to
    oneDNN's blocked layout, the bias as a torch tensor of its own, the attributes as lists (the
    per-call conversions cost ~40 µs, more than a small MobileNet convolution)."""
    call = _CALLS.get(key)
    if call is None:
        args = [list(padding), list(stride), list(dilation), int(groups)]
        packed = torch.ops.mkldnn._reorder_convolution_weight(torch.from_dlpack(w).clone(), *args, list(tx.shape))
        call = _CALLS[key] = (packed, torch.from_dlpack(b).clone(), args, *_post(post))
    return call


def _torch_post(y, name: str, scalars, algorithm: str):
    """A post-op of ``_post`` as PyTorch's elementwise op on ``y`` (in place where there is one)."""
    if name == "none":
        return y
    if name == "hardtanh":
        return y.clamp_(*scalars)
    if name == "gelu":
        return torch.nn.functional.gelu(y, approximate=algorithm)
    if name == "swish":
        return torch.nn.functional.silu(y, inplace=True)
    if name in ("relu", "sigmoid", "tanh"):
        return getattr(y, name + "_")()
    raise ValueError(f"no PyTorch form of the post-op {name!r}")


def _cuda_conv(tx, w, b, padding, stride, dilation, groups, post, key, other=None):
    """The conv calls on a GPU: cuDNN's convolution with bias, then the residual add and the post-op."""
    call = _CALLS.get(("cuda-conv", key))
    if call is None:
        weight = torch.from_dlpack(w).to(tx.device, copy=True).contiguous(memory_format=torch.channels_last)
        args = [list(stride), list(padding), list(dilation), int(groups)]
        call = _CALLS["cuda-conv", key] = (weight, torch.from_dlpack(b).to(tx.device, copy=True), args, *_post(post))
    weight, bias, args, name, scalars, algorithm = call
    y = torch.nn.functional.conv2d(tx, weight, bias, *args)
    if other is not None:
        y = y.add_(_nchw(other))
    return _to_tvm_nhwc(_torch_post(y, name, scalars, algorithm))


def _cuda_linear(tx, w, b, post, key, other=None):
    """The dense calls on a GPU: cuBLAS's GEMM with bias, then the residual add and the post-op."""
    call = _CALLS.get(("cuda-linear", key))
    if call is None:
        call = _CALLS["cuda-linear", key] = (torch.from_dlpack(w).to(tx.device, copy=True),
                                             torch.from_dlpack(b).to(tx.device, copy=True), *_post(post))
    weight, bias, name, scalars, algorithm = call
    y = torch.nn.functional.linear(tx, weight, bias)
    if other is not None:
        y = y.add_(torch.from_dlpack(other))
    return tvm.runtime.from_dlpack(_torch_post(y, name, scalars, algorithm))


@tvm_ffi.register_global_func(CONV, override=True)
def onednn_conv2d(x, w, b, padding, stride, dilation, groups, post, key):
    """conv2d + bias + unary post-op in one oneDNN call; x NHWC, w OIHW (pre-packed once), b (C,)."""
    tx = _nchw(x)
    if tx.is_cuda:
        return _cuda_conv(tx, w, b, padding, stride, dilation, groups, post, key)
    pw, tb, args, name, scalars, algorithm = _conv_call(("conv", key), tx, w, b, padding, stride, dilation,
                                                        groups, post)
    return _to_tvm_nhwc(torch.ops.mkldnn._convolution_pointwise(tx, pw, tb, *args, name, scalars, algorithm))


@tvm_ffi.register_global_func(CONV_ADD, override=True)
def onednn_conv2d_add(x, other, w, b, padding, stride, dilation, groups, post, key):
    """conv2d + bias + residual add (+ReLU) in one oneDNN call (the ``.binary`` form)."""
    tx = _nchw(x)
    if tx.is_cuda:
        return _cuda_conv(tx, w, b, padding, stride, dilation, groups, post, key, other)
    pw, tb, args, name, scalars, _ = _conv_call(("conv", key), tx, w, b, padding, stride, dilation, groups, post)
    return _to_tvm_nhwc(torch.ops.mkldnn._convolution_pointwise.binary(
        tx, _nchw(other), pw, tb, *args, "add", None, None if name == "none" else name, scalars, None))


def _linear_call(key, tx, w, b, post):
    """The dense call's fixed arguments, prepared once per call site: the weight reordered to
    oneDNN's blocked layout for this batch, the bias, the post-op."""
    call = _CALLS.get(("linear", key))
    if call is None:
        packed = torch.ops.mkldnn._reorder_linear_weight(torch.from_dlpack(w).clone(), int(np.prod(tx.shape[:-1])))
        call = _CALLS[("linear", key)] = (packed, torch.from_dlpack(b).clone(), *_post(post))
    return call


@tvm_ffi.register_global_func(LINEAR, override=True)
def onednn_linear(x, w, b, post, key):
    """x @ w.T + b with a unary post-op in one oneDNN call; w (out, in), pre-packed once."""
    tx = torch.from_dlpack(x)
    if tx.is_cuda:
        return _cuda_linear(tx, w, b, post, key)
    packed, tb, name, scalars, algorithm = _linear_call(key, tx, w, b, post)
    return tvm.runtime.from_dlpack(torch.ops.mkldnn._linear_pointwise(tx, packed, tb, name, scalars, algorithm))


@tvm_ffi.register_global_func(LINEAR_ADD, override=True)
def onednn_linear_add(x, other, w, b, key):
    """x @ w.T + b + other (a transformer's residual) in one oneDNN call (the ``.binary`` form)."""
    tx = torch.from_dlpack(x)
    if tx.is_cuda:
        return _cuda_linear(tx, w, b, "none", key, other)
    packed, tb, *_ = _linear_call(key, tx, w, b, "none")
    return tvm.runtime.from_dlpack(torch.ops.mkldnn._linear_pointwise.binary(
        tx, torch.from_dlpack(other), packed, tb, "add"))


@tvm_ffi.register_global_func(BMM, override=True)
def torch_bmm(a, b):
    """A batched matmul of two activations (attention's q @ k^T and p @ v; an ONNX export keeps
    the heads as a fourth axis): ``torch.matmul``, which runs it as one batched GEMM on oneDNN or
    MKL as PyTorch chooses; both operands arrive through DLPack, no copy."""
    return tvm.runtime.from_dlpack(torch.matmul(torch.from_dlpack(a), torch.from_dlpack(b)))


def torch_softmax(x, scale, mask=None):
    """softmax(x * scale (+ mask)) over the last axis (attention's scores; ``mask`` broadcasts):
    PyTorch's vectorised ops on a tensor of our own, so TVM's pool does not wake between the
    batched matmuls PyTorch runs on either side."""
    t = torch.from_dlpack(x)
    if float(scale) != 1.0:
        t = t.mul(float(scale))
        if mask is not None:
            t.add_(torch.from_dlpack(mask))
    elif mask is not None:
        t = t.add(torch.from_dlpack(mask))                  # not in place: x is the model's tensor
    return tvm.runtime.from_dlpack(torch.softmax(t, -1))


tvm_ffi.register_global_func(SOFTMAX, lambda x, scale: torch_softmax(x, scale), override=True)
tvm_ffi.register_global_func(SOFTMAX_MASK, lambda x, mask, scale: torch_softmax(x, scale, mask), override=True)


@tvm_ffi.register_global_func(LAYER_NORM, override=True)
def torch_layer_norm(x, gamma, beta, eps):
    """A layer norm over the last axis: PyTorch's, on OpenMP's threads like the dense calls around
    it (a transformer runs one before every attention and MLP block)."""
    g = torch.from_dlpack(gamma)
    return tvm.runtime.from_dlpack(torch.nn.functional.layer_norm(
        torch.from_dlpack(x), g.shape, g, torch.from_dlpack(beta), float(eps)))


def digest(op, weight: np.ndarray, bias: np.ndarray) -> int:
    """A content key for a call site's prepared arguments (same call, weight and bias: same key)."""
    h = hashlib.blake2b(weight.tobytes(), digest_size=8)
    h.update(bias.tobytes())
    h.update(repr(op).encode())
    return int.from_bytes(h.digest(), "little", signed=True)
