"""The pieces a ``KnobSpace`` is made of: one ``Knob`` per sampling instruction of a MetaSchedule
trace, the perfect tilings TVM samples from, a trace's sampled decisions, the design spaces of a
workload (``space_generator``), and row keys of config arrays."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from .._tvm import ms, tvm


SPACE, TILE, CATEGORICAL, LOCATION = "space", "tile", "categorical", "location"


class Repaired(Exception):
    """TVM replaced a requested decision with another one."""


@dataclass
class Knob:
    kind: str
    name: str
    values: list                # the domain; a config stores an index into it
    extent: int = 0             # tile knobs: the loop extent
    _table: np.ndarray | None = field(default=None, repr=False)

    @property
    def size(self) -> int:
        return len(self.values)

    def decision(self, index: int):
        """The MetaSchedule decision for domain index ``index``."""
        if self.kind == TILE:
            return list(self.values[index])
        return int(index) if self.kind == CATEGORICAL else int(self.values[index])

    def index_of(self, decision) -> int:
        """The domain index of a MetaSchedule decision (ValueError if outside the domain)."""
        if self.kind == CATEGORICAL:
            if not 0 <= int(decision) < self.size:
                raise ValueError(decision)
            return int(decision)
        return self.values.index(tuple(decision) if self.kind == TILE else int(decision))

    def feature_table(self) -> np.ndarray:
        """Features for every domain value, rows indexed by knob value (cached)."""
        if self._table is None:
            if self.kind == TILE:
                scale = max(math.log2(self.extent), 1.0)
                t = np.log2(np.asarray(self.values, dtype=np.float64)) / scale
            elif self.kind == CATEGORICAL:
                v = np.log2(1.0 + np.asarray(self.values, dtype=np.float64))
                t = (v / max(v.max(), 1.0))[:, None]
            elif self.kind == SPACE:
                t = np.eye(self.size)
            else:
                t = (np.arange(self.size) / max(self.size - 1, 1))[:, None]
            self._table = t.astype(np.float32)
        return self._table


@lru_cache(maxsize=None)
def perfect_tilings(extent: int, n: int, max_innermost_factor: int) -> tuple[tuple[int, ...], ...]:
    """All ordered n-tuples with product ``extent`` and last factor <= max_innermost_factor (<=0: any)."""
    def rec(rem: int, k: int):
        if k == 1:
            yield (rem,)
            return
        for d in range(1, rem + 1):
            if rem % d == 0:
                for rest in rec(rem // d, k - 1):
                    yield (d,) + rest
    out = rec(extent, n)
    if max_innermost_factor > 0:
        out = (t for t in out if t[-1] <= max_innermost_factor)
    return tuple(out)


def row_keys(configs: np.ndarray) -> np.ndarray:
    """Each int64 row as one opaque value, so rows can be compared, sorted and looked up in bulk
    (``np.unique(axis=0)`` sorts lexicographically column by column: ~6x slower on 30k configs)."""
    a = np.ascontiguousarray(configs, dtype=np.int64)
    return a.view(np.dtype((np.void, 8 * a.shape[1]))).ravel()


def first_rows(configs: np.ndarray) -> np.ndarray:
    """Positions of the distinct rows of ``configs``, in first-seen order."""
    _, first = np.unique(row_keys(configs), return_index=True)
    return np.sort(first)


def _decision_value(d):
    return tuple(int(x) for x in d) if hasattr(d, "__len__") else int(d)


def sampled_decisions(trace) -> list[tuple[str, object]]:
    """(kind, decision) of every sampling instruction of a trace, in order."""
    out = []
    for inst in trace.insts:
        if inst.kind.name.startswith("Sample"):
            d = trace.decisions.get(inst)
            out.append((inst.kind.name, None if d is None else _decision_value(d)))
    return out


def simplified(trace):
    """The trace without dead instructions.  MetaSchedule's own search stores its records' traces
    simplified, so traces are compared with design spaces in this form."""
    return trace.simplified(remove_postproc=True)


def structure(trace) -> str:
    """A trace's instructions without decisions: identifies which design space it came from."""
    return str(trace.as_json(remove_postproc=True)[0])


def as_module(mod) -> "tvm.IRModule":
    """Accept a PrimFunc or an IRModule with one PrimFunc; return an IRModule whose ``main`` has a
    global symbol (a PrimFunc taken out of a Relax module has none and would not build)."""
    if isinstance(mod, tvm.tirx.PrimFunc):
        mod = tvm.IRModule({"main": mod})
    if not isinstance(mod, tvm.IRModule):
        raise TypeError(f"expected a TIR PrimFunc or IRModule, got {type(mod).__name__}")
    funcs = [(gv, f) for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    if len(funcs) != 1:
        raise ValueError(f"expected exactly one PrimFunc in the module, found {len(funcs)}")
    gv, func = funcs[0]
    if gv.name_hint != "main" or func.attrs is None or "global_symbol" not in func.attrs:
        mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    return mod


TENSOR_CORE_DTYPES = ("float16", "bfloat16", "int8", "uint8", "float8")


def space_generator(mod, target, spaces: str = "auto"):
    """The design spaces of ``mod`` on ``target`` as a MetaSchedule space generator.

    ``spaces``: ``generic`` is MetaSchedule's default space generator; ``expert`` the register-blocked
    x86 template of ``expert.py`` where it covers the workload (else the generic one); ``both`` the
    two as one union, whose design-space knob chooses; ``auto`` (default) is ``expert``.

    On CUDA MetaSchedule's default adds the tensor-core rules, which apply only to
    float16/bfloat16/int8/float8 operands and need TVM's CUDA tensor intrinsics registered (10-25 s
    per process, see ``_tvm``); for a workload without such operands its plain CUDA rules give the
    very same design spaces (checked on L1, L8 and a dense), so only a tensor-core workload pays for
    the intrinsics."""
    from .expert import SPACES, covers, expert_space_generator
    if spaces not in SPACES:
        raise ValueError(f"unknown design spaces {spaces!r}; use one of {', '.join(SPACES)}")
    dtypes = {str(a.dtype) for a in ms.arg_info.ArgInfo.from_prim_func(mod["main"])}
    if target.kind.name != "cuda" or any(d.startswith(TENSOR_CORE_DTYPES) for d in dtypes):
        generic = ms.space_generator.PostOrderApply()
    else:
        generic = ms.space_generator.PostOrderApply(sch_rules="cuda", postprocs="cuda", mutator_probs="cuda")
    if spaces == "generic" or not covers(mod, target):
        return generic
    if spaces == "both":
        return ms.space_generator.SpaceGeneratorUnion([generic, expert_space_generator(target)])
    return expert_space_generator(target)
