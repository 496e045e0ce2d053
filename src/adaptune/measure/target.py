"""Targets: the host CPU with its ``mcpu`` set, or an NVIDIA GPU with its limits set.

An llvm target without ``mcpu`` emits SSE-only code (2-4x slower kernels), so the default target
always names the host CPU as LLVM sees it.  A bare ``{"kind": "cuda"}`` lacks the limits that
MetaSchedule's GPU rules need (``max_threads_per_block``, ``max_shared_memory_per_block``, ...),
so a CUDA target gets them, and its ``arch``, from the visible GPU, or Hopper's when none is seen
(CUDA kernels build without a GPU; they only run on one).
"""
from __future__ import annotations

import json
import re

import psutil

from .._tvm import tvm


class TargetError(ValueError):
    """A target description that TVM cannot use."""


def host_target(num_cores: int | None = None) -> "tvm.target.Target":
    cores = num_cores or psutil.cpu_count(logical=False) or psutil.cpu_count() or 1
    mcpu = tvm.target.codegen.llvm_get_system_cpu()
    return tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": int(cores)})


# what the H100 tag (``nvidia/nvidia-h100``) gives, less ``sm_90a``'s arch-specific features
CUDA_DEFAULTS = {"arch": "sm_90", "max_threads_per_block": 1024, "max_shared_memory_per_block": 49152,
                 "registers_per_block": 65536, "thread_warp_size": 32, "l2_cache_size_bytes": 52428800}


def gpu_visible() -> bool:
    """Whether this process sees a CUDA GPU (TVM's runtime asks the driver; no torch import)."""
    try:
        return bool(tvm.cuda(0).exist)
    except Exception:  # noqa: BLE001 - no driver library at all
        return False


def cuda_defaults() -> dict:
    """``arch`` and the limits of the visible GPU, ``CUDA_DEFAULTS`` where none is seen.
    ``max_shared_memory_per_block`` stays at 48 KiB, the static shared memory a kernel may use
    without opting in, even where the device reports more."""
    out = dict(CUDA_DEFAULTS)
    if gpu_visible():
        dev = tvm.cuda(0)
        major, _, minor = str(dev.compute_version).partition(".")
        out.update(arch=f"sm_{major}{minor}", max_threads_per_block=int(dev.max_threads_per_block),
                   thread_warp_size=int(dev.warp_size))
        l2 = dev.l2_cache_size_bytes
        if l2:
            out["l2_cache_size_bytes"] = int(l2)
    return out


def parse_target(spec: "str | dict | tvm.target.Target | None") -> "tvm.target.Target":
    """``None``/"host" -> host CPU; a JSON dict string or dict -> that target; "llvm" gets ``mcpu``,
    "cuda" the visible GPU's ``arch`` and limits (see ``cuda_defaults``)."""
    if spec is None or spec == "host":
        return host_target()
    if isinstance(spec, tvm.target.Target):
        return spec
    if isinstance(spec, str):
        if spec.strip().startswith("{"):
            try:
                spec = json.loads(spec)
            except json.JSONDecodeError as e:
                raise TargetError(f"bad target JSON: {e}") from None
        else:
            spec = {"kind": spec}
    if not isinstance(spec, dict):
        raise TargetError(f"bad target {spec!r}")
    given, spec = dict(spec), dict(spec)
    if spec.get("kind") == "llvm":
        spec.setdefault("mcpu", tvm.target.codegen.llvm_get_system_cpu())
        spec.setdefault("num-cores", psutil.cpu_count(logical=False) or 1)
    elif spec.get("kind") == "cuda":
        spec = {**cuda_defaults(), **spec}
        if not re.fullmatch(r"sm_\d+[a-z]?", str(spec["arch"])):
            raise TargetError(f"bad target {json.dumps(given)}: arch must name a compute capability such as sm_90, "
                              f"got {spec['arch']!r}")
    try:
        return tvm.target.Target(spec)
    except Exception as e:  # TVM raises several error types for a bad target
        msg = str(e).strip().splitlines()
        raise TargetError(f"bad target {json.dumps(given)}: {msg[-1] if msg else type(e).__name__}") from None


def device_type(target: "tvm.target.Target") -> str:
    """The runner's device string ("cpu", "cuda", ...) for a target."""
    kind = target.kind.name
    return "cpu" if kind in ("llvm", "c") else kind


def is_cuda(target: "tvm.target.Target") -> bool:
    return target.kind.name == "cuda"


def device(target: "tvm.target.Target") -> "tvm.runtime.Device":
    """The local device that kernels built for ``target`` run on."""
    return tvm.device(device_type(target), 0)


def reference_target(target: "tvm.target.Target") -> "tvm.target.Target":
    """Where an unscheduled PrimFunc can be built to compute a reference result: the target
    itself for a CPU, the host CPU for a GPU (GPU code needs its loops bound to threads first)."""
    return host_target() if is_cuda(target) else target


def check_runnable(target: "tvm.target.Target", remote: bool = False) -> None:
    """Raise TargetError (one line) if kernels for ``target`` cannot run here: a CUDA target needs
    a visible GPU unless a remote device (``--rpc``) runs them."""
    if is_cuda(target) and not remote and not gpu_visible():
        raise TargetError("target cuda needs an NVIDIA GPU to run kernels on, and this machine shows none "
                          "(tvm.cuda(0).exist is False)")
