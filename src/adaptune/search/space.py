"""KnobSpace: MetaSchedule design spaces seen as Chameleon's knob vectors Θ ∈ D_Θ.

MetaSchedule describes a design space as a trace whose sampling instructions carry decisions.
We turn every sampling instruction into an integer knob over an explicit domain, plus one knob that
picks the design space, so search strategies work on plain ``int64`` vectors:

* ``SamplePerfectTile`` -> index into all ordered factorizations of the loop extent whose innermost
  factor respects ``max_innermost_factor`` (exactly the set TVM samples from);
* ``SampleCategorical`` -> index into its candidates;
* ``SampleComputeLocation`` -> the raw decision, a loop position of the consumer (-2 inline, -1
  root, 0.. outermost first).  TVM settles a position that is not a valid location on the nearest
  valid one outside it (the largest valid decision below), so every value decodes and no probing
  is needed; the canonical config holds the settled position.  (Indexing the valid locations
  instead cost one ~9 ms TVM probe per valid location on every decode: 70% of decoding.)

Knobs with the same meaning in several design spaces (same kind, extent/candidates, occurrence)
are shared, so a config is ``[space, knob_1, ..., knob_n]`` with the knobs a space does not use
held at 0 (canonical form).  Decoding replays the trace with the chosen decisions and runs the
postprocessors; TVM silently repairs some impossible decisions, so a config whose decisions come
back changed is reported invalid rather than measured as something else.
"""
from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .._tvm import ms, s_tir
from .knobs import (CATEGORICAL, LOCATION, SPACE, TILE, Knob, Repaired, as_module, perfect_tilings, sampled_decisions,
                    simplified, space_generator, structure)

class KnobSpace:
    """The union of a workload's MetaSchedule design spaces as integer knob vectors.  ``spaces``
    picks them (``knobs.space_generator``): the expert x86 template where it covers the workload,
    MetaSchedule's generic ones, or both."""

    def __init__(self, mod, target, *, seed: int = 0, design_spaces=None, postprocs=None,
                 num_threads: int = 1, spaces: str = "auto"):
        self.mod = as_module(mod)
        self.target = target
        self.seed = seed
        if design_spaces is None or postprocs is None:
            ctx = ms.TuneContext(mod=self.mod, target=target, space_generator=space_generator(self.mod, target, spaces),
                                 task_name="main", rand_state=max(seed, 1), num_threads=num_threads)
            design_spaces = design_spaces or ctx.generate_design_space()
            postprocs = postprocs or ctx.space_generator.postprocs
        self.traces = [sch.trace for sch in design_spaces]
        self.postprocs = list(postprocs)
        self.structures = [structure(simplified(t)) for t in self.traces]
        self.knobs: list[Knob] = [Knob(SPACE, "space", list(range(len(self.traces))))]
        self._space_insts: list[list[tuple[object, int]]] = []   # per space: (instruction, knob index)
        self._fixed_kinds: set[str] = set()
        self._cache: dict[tuple, tuple] = {}
        self.decode_threads = min(2, os.cpu_count() or 1)
        self._pool: ThreadPoolExecutor | None = None
        self._build_knobs()
        self.sizes = np.array([k.size for k in self.knobs], dtype=np.int64)
        self.active = np.zeros((len(self.traces), len(self.knobs)), dtype=bool)
        self.active[:, 0] = True
        for s, pairs in enumerate(self._space_insts):
            for _, k in pairs:
                self.active[s, k] = True
        self._bounds = [self._thread_bounds(s) for s in range(len(self.traces))]
        self._tables: dict[tuple[int, int], np.ndarray] = {}

    # -- construction -------------------------------------------------------------------------------
    def _build_knobs(self) -> None:
        index: dict[tuple, int] = {}
        for s, trace in enumerate(self.traces):
            seen: dict[tuple, int] = {}
            pairs = []
            for inst in trace.insts:
                kind = inst.kind.name
                if not kind.startswith("Sample"):
                    continue
                if kind == "SamplePerfectTile":
                    n, max_inner = int(inst.attrs[0]), int(inst.attrs[1])
                    extent = math.prod(int(x) for x in trace.decisions[inst])
                    sig = (TILE, extent, n, max_inner)
                elif kind == "SampleCategorical":
                    sig = (CATEGORICAL, tuple(int(c) for c in inst.attrs[0]))
                elif kind == "SampleComputeLocation":
                    sig = (LOCATION, self._loop_count(trace, inst))
                else:   # a sampling kind we do not model keeps the design space's decision
                    self._fixed_kinds.add(kind)
                    continue
                occ = seen.get(sig, 0)
                seen[sig] = occ + 1
                key = sig + (occ,)
                if key not in index:
                    index[key] = len(self.knobs)
                    self.knobs.append(self._make_knob(sig, len(self.knobs)))
                pairs.append((inst, index[key]))
            self._space_insts.append(pairs)

    @staticmethod
    def _make_knob(sig: tuple, i: int) -> Knob:
        if sig[0] == TILE:
            _, extent, n, max_inner = sig
            return Knob(TILE, f"k{i}:tile{extent}/{n}", list(perfect_tilings(extent, n, max_inner)), extent)
        if sig[0] == CATEGORICAL:
            return Knob(CATEGORICAL, f"k{i}:cat{list(sig[1])}", list(sig[1]))
        return Knob(LOCATION, f"k{i}:loc", list(range(-2, sig[1])))

    def _loop_count(self, trace, inst) -> int:
        """Loops around the first consumer of a compute-location block: the positions it can be
        computed at.  Tiling splits keep unit loops, so the count does not depend on the tiling."""
        count = 0

        def provider(i, inputs, _attrs, decision):
            nonlocal count
            if i.same_as(inst):
                consumers = sch.get_consumers(inputs[0])
                count = len(sch.get_loops(consumers[0])) if consumers else 0
            return decision
        sch = s_tir.Schedule(self.mod, seed=1, debug_mask="none")
        trace.apply_to_schedule(sch, remove_postproc=True, decision_provider=provider)
        return count

    def _thread_bounds(self, s: int) -> list[tuple[int, int, list[tuple[int, int]]]]:
        """GPU spaces: ``(low, high, [(knob, level), ...])`` for each loop bound to threadIdx.x in
        design space ``s``: its extent, the product of those tile factors, must lie in the bounds
        MultiLevelTiling annotates (32..1024).  Read off the trace (sample -> split -> fuse ->
        bind); empty for a CPU space.  (vthread.x extents are not bounded: configs with up to 64
        vthreads pass VerifyGPUCode.)"""
        limits = {"threadIdx.x": [1, 1 << 30]}
        knob_of = dict(self._space_insts[s])
        factors, loops, bound = [], [], []      # (random variable, what it carries)

        def find(pairs, rv):
            return next((v for r, v in pairs if rv is not None and r.same_as(rv)), None)
        for inst in self.traces[s].insts:
            kind = inst.kind.name
            if kind == "SamplePerfectTile" and inst in knob_of:
                factors += [(out, (knob_of[inst], level)) for level, out in enumerate(inst.outputs)]
            elif kind == "Split":
                loops += [(out, [f]) for out, f in ((o, find(factors, rv)) for o, rv in zip(inst.outputs, inst.inputs[1:]))
                          if f is not None]
            elif kind == "Fuse":
                loops.append((inst.outputs[0], [f for rv in inst.inputs for f in find(loops, rv) or []]))
            elif kind == "Bind" and str(inst.attrs[0]) in limits:
                parts = find(loops, inst.inputs[0])
                if parts:
                    bound.append((str(inst.attrs[0]), parts))
            elif kind == "Annotate" and str(inst.attrs[0]).startswith("meta_schedule.thread_extent_"):
                side = 0 if str(inst.attrs[0]).endswith("low_inclusive") else 1
                limits["threadIdx.x"][side] = int(inst.inputs[1])
        return [(*limits[axis], parts) for axis, parts in bound]

    def _level_table(self, k: int, level: int) -> np.ndarray:
        """Tile knob ``k``'s factor at ``level`` for each of its values (cached)."""
        if (k, level) not in self._tables:
            self._tables[k, level] = np.asarray([v[level] for v in self.knobs[k].values], dtype=np.float64)
        return self._tables[k, level]

    def plausible(self, configs: np.ndarray) -> np.ndarray:
        """Per row, whether its thread-block extent is within the bounds of ``_thread_bounds``: a
        necessary condition of passing the GPU postprocessors (no config outside them decoded in
        3000 uniform draws on L8 or a dense) that costs a table lookup instead of a ~10 ms
        decode; on L8 2.7% of uniform configs decode, 14% of those within it.  All True on a CPU
        space."""
        configs = np.atleast_2d(configs)
        ok = np.ones(len(configs), dtype=bool)
        for s, bounds in enumerate(self._bounds):
            rows = configs[:, 0] == s
            for low, high, parts in bounds:
                extent = np.ones(int(rows.sum()))
                for k, level in parts:
                    extent *= self._level_table(k, level)[configs[rows, k]]
                ok[rows] &= (low <= extent) & (extent <= high)
        return ok

    # -- vectors ------------------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.knobs)

    def canonical(self, configs: np.ndarray) -> np.ndarray:
        """Zero the knobs the chosen design space does not use, so equal schedules compare equal."""
        configs = np.atleast_2d(np.asarray(configs, dtype=np.int64))
        configs = np.clip(configs, 0, self.sizes - 1)
        return np.where(self.active[configs[:, 0]], configs, 0)

    def random(self, n: int, rng: np.random.Generator, rounds: int = 16) -> np.ndarray:
        """``n`` configs drawn uniformly per knob (design space first); on a GPU space, uniformly
        among those within its thread limits (``plausible``) as far as ``rounds`` draws of ``8n``
        find them, the rest unfiltered."""
        configs = self.canonical((rng.random((n, self.ndim)) * self.sizes).astype(np.int64))
        if not any(self._bounds):
            return configs
        ok = self.plausible(configs)
        keep = [configs[ok]]
        for _ in range(rounds):
            if sum(map(len, keep)) >= n:
                break
            more = self.canonical((rng.random((8 * n, self.ndim)) * self.sizes).astype(np.int64))
            keep.append(more[self.plausible(more)])
        return np.concatenate(keep + [configs[~ok]])[:n]

    def sample_prior(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` configs drawn the way MetaSchedule draws its initial population: each design space
        replayed with fresh decisions from TVM's own samplers, then encoded as knobs.

        TVM's tile sampler favours balanced factorizations, which are far more often fast than
        the uniform draw over all of them (on L8 its 25th-percentile latency is half the uniform
        draw's); a cold start without a cost model should use it.  About 0.1 s per config, so
        for first batches only."""
        out = []
        for _ in range(n):
            s = int(rng.integers(len(self.traces)))
            sch = s_tir.Schedule(self.mod, seed=int(rng.integers(1, 1 << 30)), debug_mask="none")
            try:
                s_tir.schedule.Trace(self.traces[s].insts, {}).apply_to_schedule(sch, remove_postproc=True)
            except Exception:  # noqa: BLE001 - TVM drew something it cannot apply; draw again next time
                continue
            config = self.encode(sch.trace)
            if config is not None:
                out.append(config)
        return np.array(out, dtype=np.int64).reshape(-1, self.ndim)

    def movable(self, configs: np.ndarray) -> np.ndarray:
        """Per row, the knobs a move can change: used by its design space and with more than one value."""
        configs = np.asarray(configs)
        return self.active[configs[..., 0]] & (self.sizes > 1)

    def random_walk(self, configs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """AutoTVM's neighbour move: one active knob of each config set to a different random value."""
        configs = np.array(configs, dtype=np.int64, copy=True)
        n = len(configs)
        movable = self.movable(configs)
        weights = movable / np.maximum(movable.sum(1, keepdims=True), 1)
        k = np.array([rng.choice(self.ndim, p=w) if w.sum() > 0 else 0 for w in weights])
        size = self.sizes[k]
        step = 1 + (rng.random(n) * np.maximum(size - 1, 1)).astype(np.int64)
        configs[np.arange(n), k] = (configs[np.arange(n), k] + step) % size
        return self.canonical(configs)

    def normalized(self, configs: np.ndarray) -> np.ndarray:
        """Each knob index scaled to [0, 1]: the RL agent's observation."""
        configs = np.atleast_2d(configs)
        return (configs / np.maximum(self.sizes - 1, 1)).astype(np.float32)

    def features(self, configs: np.ndarray) -> np.ndarray:
        """Cost-model features: log2 tile factors / log2 extent, log unroll, location, space one-hot.

        A table lookup per knob, so scoring tens of thousands of configs costs microseconds."""
        configs = np.atleast_2d(configs)
        return np.concatenate([k.feature_table()[configs[:, i]] for i, k in enumerate(self.knobs)], axis=1)

    def describe(self, config) -> dict:
        """Human-readable decisions of a config."""
        s = int(config[0])
        return {"space": s, **{self.knobs[k].name: self.knobs[k].values[int(config[k])]
                               for _, k in self._space_insts[s]}}

    # -- schedules ----------------------------------------------------------------------------------
    def _replay(self, s: int, choose) -> tuple["s_tir.Schedule", dict]:
        """Replay design space ``s``; ``choose(knob_index, knob)`` gives each decision.

        Returns the schedule and, per knob, the index of the decision TVM took: a location may
        settle on another loop (canonicalisation), any other repaired decision raises Repaired."""
        sch = s_tir.Schedule(self.mod, seed=max(self.seed, 1), debug_mask="none")
        knob_of = dict(self._space_insts[s])
        asked: dict[int, object] = {}

        def provider(inst, _inputs, _attrs, decision):
            k = knob_of.get(inst)
            if k is None:
                return decision
            asked[k] = choose(k, self.knobs[k])
            return asked[k]

        self.traces[s].apply_to_schedule(sch, remove_postproc=True, decision_provider=provider)
        got = [d for kind, d in sampled_decisions(sch.trace) if kind not in self._fixed_kinds]
        used: dict[int, int] = {}
        for (_, k), d in zip(self._space_insts[s], got):
            knob, want = self.knobs[k], asked[k]
            if knob.kind != LOCATION and (tuple(want) if isinstance(want, list) else want) != d:
                raise Repaired()
            used[k] = knob.index_of(d)
        return sch, used

    def decode(self, config) -> tuple["s_tir.Schedule | None", str, np.ndarray]:
        """Replay the config's design space with its decisions and run the postprocessors.

        Returns ``(schedule, "ok", canonical_config)`` or ``(None, reason, canonical_config)`` for a
        config TVM rejects or repairs, or a postprocessor refuses.  The canonical config holds the
        compute locations TVM settled on, so two configs that give the same schedule have the same
        canonical form."""
        key = tuple(int(x) for x in self.canonical(config)[0])
        hit = self._cache.get(key)
        if hit is None:
            if len(self._cache) > 4096:
                self._cache.clear()
            hit = self._cache[key] = self._decode(key)
        return hit

    def decode_many(self, configs) -> list[tuple]:
        """``decode`` for each row, in order, on ``decode_threads`` threads.

        Replaying a trace and running the postprocessors is C++ work that releases the GIL
        between the decision callbacks, so two threads decode ~1.5x faster on 2 cores.  The
        postprocessors are shared by the threads, as MetaSchedule's own evolutionary search
        shares them across its threads (``ThreadedTraceApply``)."""
        rows = [tuple(int(x) for x in c) for c in self.canonical(configs)]
        todo = [r for r in dict.fromkeys(rows) if r not in self._cache]
        if len(todo) > 1 and self.decode_threads > 1:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.decode_threads, thread_name_prefix="adaptune-decode")
            if len(self._cache) + len(todo) > 4096:
                self._cache.clear()
            for r, hit in zip(todo, self._pool.map(self._decode, todo)):
                self._cache[r] = hit
        return [self.decode(r) for r in rows]

    def _decode(self, config: tuple) -> tuple:
        def choose(k, knob):
            return knob.decision(config[k])

        canon = np.array(config, dtype=np.int64)
        try:
            sch, used = self._replay(config[0], choose)
        except Repaired:
            return None, "decisions repaired by TVM (impossible combination)", canon
        except Exception as e:  # noqa: BLE001 - TVM raises several types for a bad decision
            lines = str(e).strip().splitlines()
            return None, f"replay failed: {lines[-1][:160] if lines else type(e).__name__}", canon
        for k, i in used.items():
            canon[k] = i
        sch.enter_postproc()
        for p in self.postprocs:
            if not p.apply(sch):
                return None, f"postproc {type(p).__name__} rejected it", canon
        return sch, "ok", canon

    def is_valid(self, config) -> bool:
        return self.decode(config)[0] is not None

    def encode(self, trace) -> np.ndarray | None:
        """The canonical config of a measured schedule's trace, or None if not from this space."""
        try:
            trace = simplified(trace)
            shape = structure(trace)
        except Exception:  # noqa: BLE001
            return None
        if shape not in self.structures:
            return None
        s = self.structures.index(shape)
        decisions = [d for kind, d in sampled_decisions(trace) if kind not in self._fixed_kinds]
        if len(decisions) != len(self._space_insts[s]):
            return None
        wanted = {k: d for (_, k), d in zip(self._space_insts[s], decisions)}

        def choose(k, knob):
            knob.index_of(wanted[k])        # a decision outside our domains raises
            return list(wanted[k]) if knob.kind == TILE else wanted[k]
        try:
            _, used = self._replay(s, choose)
        except Exception:  # noqa: BLE001 - a decision outside our domains
            return None
        config = np.zeros(self.ndim, dtype=np.int64)
        config[0] = s
        for k, i in used.items():
            config[k] = i
        return config
