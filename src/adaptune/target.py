"""Targets: the host CPU with its ``mcpu`` set.

An llvm target without ``mcpu`` emits SSE-only code (2-4x slower kernels), so the default target
always names the host CPU as LLVM sees it.
"""
from __future__ import annotations

import json

import psutil

from ._tvm import tvm


class TargetError(ValueError):
    """A target description that TVM cannot use."""


def host_target(num_cores: int | None = None) -> "tvm.target.Target":
    cores = num_cores or psutil.cpu_count(logical=False) or psutil.cpu_count() or 1
    mcpu = tvm.target.codegen.llvm_get_system_cpu()
    return tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": int(cores)})


def parse_target(spec: "str | dict | tvm.target.Target | None") -> "tvm.target.Target":
    """``None``/"host" -> host CPU; a JSON dict string or dict -> that target; "llvm" gets ``mcpu``."""
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
    spec = dict(spec)
    if spec.get("kind") == "llvm":
        spec.setdefault("mcpu", tvm.target.codegen.llvm_get_system_cpu())
        spec.setdefault("num-cores", psutil.cpu_count(logical=False) or 1)
    try:
        return tvm.target.Target(spec)
    except Exception as e:  # TVM raises several error types for a bad target
        msg = str(e).strip().splitlines()
        raise TargetError(f"bad target {json.dumps(spec)}: {msg[-1] if msg else type(e).__name__}") from None


def device_type(target: "tvm.target.Target") -> str:
    """The runner's device string ("cpu", "cuda", ...) for a target."""
    kind = target.kind.name
    return "cpu" if kind in ("llvm", "c") else kind
