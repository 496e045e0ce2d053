"""LoopTune's loop nest (§3.1, §3.3): a tensor contraction as an ordered list of loops and a cursor.

The agent sees only this: loops, each iterating one dimension of the contraction, in nest order,
with the agent's cursor on one of them.  Actions move the cursor (up, down), swap the loop under
it with a neighbour (swap_up, swap_down), or split it (split_2 .. split_64): the loop keeps the
outer part and a new loop of the split size goes directly under it.  A split that does not divide
the loop leaves a tail, as in LoopTool; TVM runs the same nest with a predicate on the last chunk
(``LoopNest.schedule``), which is what the ``tail`` feature records.

A nest is immutable (actions return a new one), hashable by what it computes (``key``, without
the cursor), and turns into a TVM schedule.  Kept free of timing so tests and searches can reason
about it cheaply.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

ACTIONS = ("up", "down", "swap_up", "swap_down",
           "split_2", "split_4", "split_8", "split_16", "split_32", "split_64")
MAX_LOOPS = 10           # compute-nest loops; a split past this is a no-op
HIST_BINS = 16           # stride histogram bins 2^0 .. 2^15 (the last also takes larger strides)
FEATURES = 4 + HIST_BINS  # cursor, size, tail, write-nest flag, histogram (§3.3: 20 per loop)
MAX_ROWS = 2 * MAX_LOOPS  # compute nest plus write nest


@dataclass(frozen=True)
class Access:
    """One tensor access in the nest body: per tensor axis, the coefficient of each dimension."""

    tensor: str
    shape: tuple[int, ...]
    index: tuple[tuple[tuple[str, int], ...], ...]

    def stride(self, dim: str) -> int:
        """Elements skipped in memory when ``dim``'s index grows by one (row-major)."""
        total = 0
        for axis, terms in enumerate(self.index):
            coef = dict(terms).get(dim, 0)
            total += coef * math.prod(self.shape[axis + 1:])
        return total


@dataclass(frozen=True)
class Contraction:
    """A tensor contraction: its dimensions (output ones first, as TE orders the block's loops),
    which of them are reductions, the accesses of its body and its output."""

    kind: str
    sizes: tuple[tuple[str, int], ...]
    reduce: tuple[str, ...]
    reads: tuple[Access, ...]
    write: Access

    @property
    def dims(self) -> tuple[str, ...]:
        return tuple(d for d, _ in self.sizes)

    def size(self, dim: str) -> int:
        return dict(self.sizes)[dim]

    @property
    def flops(self) -> int:
        return 2 * math.prod(n for _, n in self.sizes)

    @property
    def name(self) -> str:
        return f"{self.kind}_" + "x".join(str(n) for _, n in self.sizes)

    def te_func(self, pads: dict[str, int] | None = None):
        """The contraction as a TE PrimFunc module (TVM generates code from it).  ``pads``: output
        dimensions computed over a larger extent (``LoopNest.schedule`` picks it), into a buffer the
        output is copied from (``C_out``), so a split with a tail needs no bounds test, which would
        sit inside the register tile and, on the unit-stride dimension (matmul's j, convolution's
        x), on every lane and stop TVM from vectorising.  The unit-stride dimension reads a
        zero-padded copy of its input (``B_pad``, ``I_pad``); the others clamp their index into the
        input, computing rows that the copy to the output drops."""
        from .._tvm import tvm
        from tvm import te
        pads = pads or {}
        ext = {d: pads.get(d, n) for d, n in self.sizes}

        def clamp(dim, v):
            return te.min(v, self.size(dim) - 1) if dim in pads else v

        def finish(inputs, comp):
            if not pads:
                return tvm.IRModule({"main": te.create_prim_func([*inputs, comp])})
            shape = tuple(self.size(d) for d in self.dims if d not in self.reduce)
            out = te.compute(shape, lambda *ix: comp(*ix), name="C_out")
            return tvm.IRModule({"main": te.create_prim_func([*inputs, out])})

        if self.kind == "matmul":
            (_, m), (_, n), (_, k) = self.sizes
            a = te.placeholder((m, k), name="A")
            b = te.placeholder((k, n), name="B")
            rk = te.reduce_axis((0, k), name="k")
            bp = b if "j" not in pads else te.compute(
                (k, ext["j"]), lambda kk, j: te.if_then_else(j < n, b[kk, j], 0.0), name="B_pad")
            c = te.compute((ext["i"], ext["j"]), lambda i, j: te.sum(a[clamp("i", i), rk] * bp[rk, j], axis=rk),
                           name="C")
            return finish([a, b], c)
        f, y, x, c, r, s = (n for _, n in self.sizes)
        src = te.placeholder((c, y + r - 1, x + s - 1), name="I")
        w = te.placeholder((f, c, r, s), name="W")
        data = src if "x" not in pads else te.compute((c, y + r - 1, ext["x"] + s - 1), lambda cc, yy, xx: (
            te.if_then_else(xx < x + s - 1, src[cc, yy, xx], 0.0)), name="I_pad")
        rc, rr, rs = (te.reduce_axis((0, n), name=d) for d, n in (("c", c), ("r", r), ("s", s)))
        conv = te.compute((ext["f"], ext["y"], ext["x"]), lambda ff, yy, xx: te.sum(
            data[rc, clamp("y", yy) + rr, xx + rs] * w[clamp("f", ff), rc, rr, rs], axis=[rc, rr, rs]), name="C")
        return finish([src, w], conv)

    def random_inputs(self, rng: np.random.Generator) -> list[np.ndarray]:
        return [rng.standard_normal(a.shape, dtype=np.float32) for a in self.reads]

    def reference(self, inputs: list[np.ndarray]) -> np.ndarray:
        """numpy's answer, to check generated code against."""
        if self.kind == "matmul":
            return inputs[0] @ inputs[1]
        data, w = inputs
        _, r, s = w.shape[1:]
        win = np.lib.stride_tricks.sliding_window_view(data, (r, s), axis=(1, 2))  # c, y, x, r, s
        return np.einsum("cyxrs,fcrs->fyx", win, w, optimize=True).astype(np.float32)


def matmul(m: int, n: int, k: int) -> Contraction:
    """C[i, j] += A[i, k] * B[k, j]: the paper's benchmark contraction."""
    return Contraction(
        "matmul", (("i", m), ("j", n), ("k", k)), ("k",),
        reads=(Access("A", (m, k), ((("i", 1),), (("k", 1),))),
               Access("B", (k, n), ((("k", 1),), (("j", 1),)))),
        write=Access("C", (m, n), ((("i", 1),), (("j", 1),))))


def conv2d(c: int, h: int, w: int, f: int, r: int = 3, s: int = 3) -> Contraction:
    """Direct convolution, batch 1, stride 1, on an already padded C×H×W input:
    O[f, y, x] += I[c, y + r, x + s] * W[f, c, r, s] (the second kind of contraction)."""
    y, x = h - r + 1, w - s + 1
    if y < 1 or x < 1:
        raise ValueError(f"kernel {r}x{s} is larger than the input {h}x{w}")
    return Contraction(
        "conv2d", (("f", f), ("y", y), ("x", x), ("c", c), ("r", r), ("s", s)), ("c", "r", "s"),
        reads=(Access("I", (c, h, w), ((("c", 1),), (("y", 1), ("r", 1)), (("x", 1), ("s", 1)))),
               Access("W", (f, c, r, s), ((("f", 1),), (("c", 1),), (("r", 1),), (("s", 1),)))),
        write=Access("C", (f, y, x), ((("f", 1),), (("y", 1),), (("x", 1),))))


@dataclass(frozen=True)
class Loop:
    """One loop: the dimension it iterates, its trip count, the remainder its split left, and its
    place in that dimension's split chain (``chain``: outer splits sort first)."""

    dim: str
    extent: int
    tail: int = 0
    chain: tuple[int, ...] = ()


@dataclass(frozen=True)
class LoopNest:
    contraction: Contraction
    loops: tuple[Loop, ...]
    cursor: int = 0

    @classmethod
    def initial(cls, contraction: Contraction) -> "LoopNest":
        """The untiled nest, dimensions in their natural order, cursor on the outermost loop."""
        return cls(contraction, tuple(Loop(d, n) for d, n in contraction.sizes))

    # ---- actions (§3.1) -------------------------------------------------------------------
    def apply(self, action: int | str) -> "LoopNest":
        """The nest after one action; an action that cannot apply here leaves the nest as it is."""
        name = ACTIONS[action] if isinstance(action, (int, np.integer)) else action
        c, loops = self.cursor, list(self.loops)
        if name == "up":
            return replace(self, cursor=max(0, c - 1))
        if name == "down":
            return replace(self, cursor=min(len(loops) - 1, c + 1))
        if name in ("swap_up", "swap_down"):
            other = c - 1 if name == "swap_up" else c + 1
            if not 0 <= other < len(loops):
                return self
            loops[c], loops[other] = loops[other], loops[c]
            return replace(self, loops=tuple(loops), cursor=other)
        if not name.startswith("split_"):
            raise ValueError(f"unknown action {action!r}")
        factor, loop = int(name[len("split_"):]), loops[c]
        if factor >= loop.extent or len(loops) >= MAX_LOOPS:
            return self
        outer = Loop(loop.dim, -(-loop.extent // factor), loop.extent % factor, loop.chain + (0,))
        inner = Loop(loop.dim, factor, 0, loop.chain + (1,))
        loops[c:c + 1] = [outer, inner]
        return replace(self, loops=tuple(loops))

    # ---- what the nest computes ------------------------------------------------------------
    @cached_property
    def key(self) -> tuple:
        """Identifies the generated code: loop order, trip counts and split chains (no cursor)."""
        return tuple((lp.dim, lp.extent, self._chain_rank(lp)) for lp in self.loops)

    def _chain(self, dim: str) -> list[Loop]:
        return sorted((lp for lp in self.loops if lp.dim == dim), key=lambda lp: lp.chain)

    def _chain_rank(self, loop: Loop) -> int:
        return self._chain(loop.dim).index(loop)

    def step(self, loop: Loop) -> int:
        """How far ``loop``'s dimension index moves per iteration: the product of the trip counts
        of the loops inside it in its split chain (TVM's split semantics)."""
        chain = self._chain(loop.dim)
        return math.prod(lp.extent for lp in chain[chain.index(loop) + 1:])

    @property
    def write_loops(self) -> tuple[Loop, ...]:
        """The write nest: output loops below the first reduction loop, where TVM puts the
        initialisation of the output (``decompose_reduction``) and LoopTool its write-back."""
        first = self.first_reduction()
        return tuple(lp for lp in self.loops[first:] if lp.dim not in self.contraction.reduce)

    def first_reduction(self) -> int:
        return next(i for i, lp in enumerate(self.loops) if lp.dim in self.contraction.reduce)

    # ---- features (§3.3) -------------------------------------------------------------------
    def stride_histogram(self, loop: Loop, accesses, enclosing: int) -> np.ndarray:
        """Accesses produced by ``loop``, binned by stride into 2^0 .. 2^15 elements.

        Each access the loop moves (stride > 0) counts once per iteration of the loop, over all
        iterations of its enclosing loops (``enclosing`` is their trip-count product)."""
        hist = np.zeros(HIST_BINS, dtype=np.int64)
        step = self.step(loop)
        for acc in accesses:
            stride = acc.stride(loop.dim) * step
            if stride > 0:
                hist[min(HIST_BINS - 1, int(math.log2(stride)))] += enclosing * loop.extent
        return hist

    def features(self) -> np.ndarray:
        """20 numbers per loop, compute nest then write nest: cursor here, size, tail, in the write
        nest, stride histogram.  Raw integers; ``LoopTuneEnv`` log-scales them."""
        con = self.contraction
        body = con.reads + (con.write,)
        rows, enclosing = [], 1
        for i, lp in enumerate(self.loops):
            rows.append([int(i == self.cursor), lp.extent, lp.tail, 0, *self.stride_histogram(lp, body, enclosing)])
            enclosing *= lp.extent
        enclosing = math.prod(lp.extent for lp in self.loops[:self.first_reduction()])
        for lp in self.write_loops:
            rows.append([0, lp.extent, lp.tail, 1, *self.stride_histogram(lp, (con.write,), enclosing)])
            enclosing *= lp.extent
        return np.asarray(rows, dtype=np.int64)

    # ---- code generation (LoopNest's back end, appendix A) ----------------------------------
    def register_block(self, lanes: int, regs: int) -> int:
        """Where the register block starts: the index of the outermost loop of the largest innermost
        run of loops whose output tile is dense (each output dimension's loops in it are the innermost
        of its split chain) and fits the vector register file (``regs`` registers of ``lanes`` floats,
        four kept for operands).  Reduction loops add nothing to the tile, so the block takes
        them in and its tile stays in registers for their whole extent; ``len(loops)`` if even the
        innermost loop's tile does not fit."""
        con, spans = self.contraction, {}
        vec = self.vector_dim()
        start = len(self.loops)
        for i in range(len(self.loops) - 1, -1, -1):
            lp = self.loops[i]
            if lp.dim not in con.reduce:
                if self.step(lp) != spans.get(lp.dim, 1):
                    break   # the tile would be strided (an inner part of the chain is outside the block)
                spans[lp.dim] = spans.get(lp.dim, 1) * lp.extent
            tile = math.prod(-(-n // lanes) if d == vec and self._unit_in(d, self.loops[i:]) else n
                             for d, n in spans.items())
            if tile > regs - 4:
                break
            start = i
        return start

    def vector_dim(self) -> str | None:
        """The output dimension the output is unit-stride in (matmul's j, convolution's x)."""
        return next((d for d in self.contraction.dims if self.contraction.write.stride(d) == 1
                     and d not in self.contraction.reduce), None)

    def _overshoots(self, dim: str) -> bool:
        """Whether ``dim``'s split chain covers more than its extent: a split left a tail, which a
        later split of the same loop no longer shows in any ``Loop.tail``."""
        return math.prod(lp.extent for lp in self._chain(dim)) != self.contraction.size(dim)

    def _unit_in(self, dim: str, loops) -> bool:
        """Whether ``loops`` hold ``dim``'s step-1 loop (the one a vector can run along)."""
        return any(lp.dim == dim and self.step(lp) == 1 for lp in loops)

    def schedule(self, target=None):
        """The nest as a TVM schedule, finished as LoopNest finishes it: the agent's loop order and
        splits stay; the innermost block whose output tile fits the register file (``register_block``)
        accumulates in a local buffer (registers) over its reduction loops, its reduction loops
        outside its output loops, which are unrolled, the step-1 loop of the unit-stride output
        dimension innermost and vectorised; the outermost loop runs parallel when it is an output loop.
        Output dimensions whose split chain overshoots them are computed padded (``te_func``)."""
        from .._tvm import s_tir
        from ..measure.target import host_target
        from ..search.expert import vector_isa
        con = self.contraction
        lanes, regs = vector_isa(target if target is not None else host_target())
        vec = self.vector_dim()
        start = self.register_block(lanes, regs)
        # per dimension, the extent of its loops inside the register tile (innermost in its chain)
        span = {d: math.prod(lp.extent for lp in self.loops[start:] if lp.dim == d) for d in con.dims}
        # output dimensions whose split chain overshoots them (a tail, possibly split further since):
        # the unit-stride one is computed over the chain's whole extent, the others over whole
        # tiles, their chain's tail then a test on the loops outside the tile, where it skips tiles
        tailed = [d for d in con.dims if d not in con.reduce and self._overshoots(d)]
        pads = {d: math.prod(lp.extent for lp in self._chain(d)) if d == vec else -(-con.size(d) // span[d]) * span[d]
                for d in tailed if d == vec or con.size(d) % span[d]}
        sch = s_tir.Schedule(con.te_func(pads))
        block = sch.get_sblock("C")
        rvs = dict(zip(con.dims, sch.get_loops(block)))
        by_loop = {}
        for dim in con.dims:
            chain = self._chain(dim)
            inside = sum(1 for lp in self.loops[start:] if lp.dim == dim)
            if dim != vec and dim in tailed and inside:
                # whole tiles first (exact), then the chain's outer loops over them
                tiles, rows = sch.split(rvs[dim], factors=[None, span[dim]])
                outs, ins = chain[:-inside], chain[-inside:]
                parts = sch.split(tiles, factors=[lp.extent for lp in outs]) if len(outs) > 1 else [tiles]
                parts += sch.split(rows, factors=[lp.extent for lp in ins]) if len(ins) > 1 else [rows]
            else:
                parts = sch.split(rvs[dim], factors=[lp.extent for lp in chain]) if len(chain) > 1 else [rvs[dim]]
            by_loop.update(zip(chain, parts))
        outer, inner = list(self.loops[:start]), list(self.loops[start:])
        unit = [lp for lp in inner if lp.dim == vec and self.step(lp) == 1 and lp.extent > 1]   # 0 or 1 loop
        tile = [lp for lp in inner if lp.dim not in con.reduce and lp not in unit]
        reduce = [lp for lp in inner if lp.dim in con.reduce]
        order = outer + reduce + tile + unit
        sch.reorder(*(by_loop[lp] for lp in order))
        padded_input = ("B_pad" if con.kind == "matmul" else "I_pad") if vec in pads else None
        copies = [padded_input] if padded_input else []
        parallel = bool(outer) and outer[0].dim not in con.reduce and outer[0].extent > 1
        if reduce and tile + unit:
            # the tile's accumulators: a local buffer, written back after the block's reductions;
            # with padding the copy to the output is that write-back, bounds-tested per tile
            if pads:
                sch.set_scope(block, 0, "local")
                write = sch.get_sblock("C_out")
            else:
                write = sch.cache_write(block, 0, "local")
            if outer:
                sch.reverse_compute_at(write, by_loop[outer[-1]], preserve_unit_loops=True)
            if unit:
                sch.vectorize(sch.get_loops(write)[-1])
        elif pads:
            copies.append("C_out")
        par = by_loop[outer[0]] if parallel else None
        if padded_input and parallel:
            # each thread pads what it reads, once: the parallel loop runs one chunk per thread
            # (TVM's static partition of it) and the copy goes inside the chunk loop.  A copy the
            # main thread makes reaches the other core's cache line by line (65x200x120: 40 us
            # against 24 without padding); one per iteration of the parallel loop repeats it
            threads = int(os.environ.get("TVM_NUM_THREADS") or os.cpu_count() or 1)   # adaptune sets it
            if outer[0].extent > threads:
                par, _ = sch.split(par, factors=[threads, None])
            sch.compute_at(sch.get_sblock(padded_input), par, preserve_unit_loops=True)
        for name in copies:
            # the padding copies run serial, vectorised: a parallel launch costs more than they do
            # (90x90x90: 35 GFLOPS with parallel copies, 58-60 serial)
            sch.vectorize(sch.get_loops(sch.get_sblock(name))[-1])
        for lp in tile:
            if lp.extent > 1:
                sch.unroll(by_loop[lp])
        if unit:
            sch.vectorize(by_loop[unit[0]])
        if parallel:
            sch.parallel(par)
        first_reduction = next(lp for lp in order if lp.dim in con.reduce)
        init = sch.decompose_reduction(block, by_loop[first_reduction])
        if unit:
            sch.vectorize(sch.get_loops(init)[-1])     # the unit loop is the init's innermost too
        return sch

    def render(self) -> str:
        """The nest as text, like the paper's Fig. 5a."""
        lines = []
        for i, lp in enumerate(self.loops):
            tail = f" (tail {lp.tail})" if lp.tail else ""
            mark = "   <<< agent" if i == self.cursor else ""
            lines.append(f"{'  ' * i}for {lp.dim} in {lp.extent}{tail} [step {self.step(lp)}]{mark}")
        lines.append(f"{'  ' * len(self.loops)}{self.contraction.write.tensor} += ...")
        return "\n".join(lines)
