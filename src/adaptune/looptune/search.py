"""LoopTune's classic searches (§4): greedy with lookahead, beam DFS, beam BFS and random.

Each search starts from a nest, takes at most ``steps`` actions along any path (the episode
length), evaluates states through ``gflops`` (an ``Evaluator``, so identical nests are measured
once), stops when its time limit is spent, and returns the best state it saw.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .nest import ACTIONS, LoopNest

Score = Callable[[LoopNest], float]


@dataclass
class SearchResult:
    nest: LoopNest
    gflops: float
    actions: list[str]
    seconds: float
    evaluated: int = 0            # states scored (cached ones included)


class _Budget(Exception):
    pass


@dataclass
class _Run:
    """Shared bookkeeping: the clock, and the best state seen with the path to it."""

    gflops: Score
    time_limit: float
    start: float = field(default_factory=time.perf_counter)
    best: tuple[float, LoopNest, tuple[str, ...]] | None = None
    evaluated: int = 0

    def score(self, nest: LoopNest, path: tuple[str, ...]) -> float:
        if self.best is not None and time.perf_counter() - self.start > self.time_limit:
            raise _Budget
        value = self.gflops(nest)
        self.evaluated += 1
        if self.best is None or value > self.best[0]:
            self.best = (value, nest, path)
        return value

    def children(self, nest: LoopNest, path: tuple[str, ...]):
        """(value, child, path) for every action that changes the state, best first."""
        seen, out = {(nest.key, nest.cursor)}, []
        for a in ACTIONS:
            child = nest.apply(a)
            if (child.key, child.cursor) in seen:
                continue
            seen.add((child.key, child.cursor))
            out.append((self.score(child, path + (a,)), child, path + (a,)))
        out.sort(key=lambda t: -t[0])
        return out

    def result(self) -> SearchResult:
        value, nest, path = self.best
        return SearchResult(nest, value, list(path), time.perf_counter() - self.start, self.evaluated)


def _run(body, start: LoopNest, gflops: Score, time_limit: float) -> SearchResult:
    run = _Run(gflops, time_limit)
    run.score(start, ())
    try:
        body(run)
    except _Budget:
        pass
    return run.result()


def greedy(start: LoopNest, gflops: Score, *, lookahead: int = 1, steps: int = 10,
           time_limit: float = 60.0) -> SearchResult:
    """Move toward the best state reachable in ``lookahead`` actions, one action at a time;
    stop when no such state beats the current one."""
    def body(run: _Run):
        nest, path = start, ()
        for _ in range(steps):
            here, best = run.gflops(nest), None
            for seq in itertools.product(ACTIONS, repeat=lookahead):
                s = nest
                for i, a in enumerate(seq):
                    s = s.apply(a)
                    v = run.score(s, path + seq[:i + 1])
                    if best is None or v > best[0]:
                        best = (v, seq[0])
            if best is None or best[0] <= here:
                return
            nest, path = nest.apply(best[1]), path + (best[1],)
    return _run(body, start, gflops, time_limit)


def beam_dfs(start: LoopNest, gflops: Score, *, width: int = 2, steps: int = 10,
             time_limit: float = 60.0) -> SearchResult:
    """Depth first through the ``width`` best children of every state, even when they are worse
    than their parent, down to ``steps`` actions."""
    def visit(run: _Run, nest: LoopNest, path: tuple[str, ...]):
        if len(path) < steps:
            for _, child, p in run.children(nest, path)[:width]:
                visit(run, child, p)
    return _run(lambda run: visit(run, start, ()), start, gflops, time_limit)


def beam_bfs(start: LoopNest, gflops: Score, *, width: int = 2, steps: int = 10,
             time_limit: float = 60.0) -> SearchResult:
    """Level by level: every state of a level contributes its ``width`` best children to the
    next, so short good sequences are found before long ones."""
    def body(run: _Run):
        level = [(start, ())]
        for _ in range(steps):
            nxt, seen = [], set()
            for nest, path in level:
                for _, child, p in run.children(nest, path)[:width]:
                    if (child.key, child.cursor) not in seen:
                        seen.add((child.key, child.cursor))
                        nxt.append((child, p))
            level = nxt
    return _run(body, start, gflops, time_limit)


def random_search(start: LoopNest, gflops: Score, *, steps: int = 10, time_limit: float = 60.0,
                  seed: int = 0, max_episodes: int | None = None) -> SearchResult:
    """Random action sequences of ``steps`` actions, until the time limit."""
    rng = np.random.default_rng(seed)

    def body(run: _Run):
        for _ in itertools.count() if max_episodes is None else range(max_episodes):
            nest, path = start, ()
            for a in rng.integers(len(ACTIONS), size=steps):
                nest, path = nest.apply(int(a)), path + (ACTIONS[a],)
                run.score(nest, path)
    return _run(body, start, gflops, time_limit)


SEARCHES: dict[str, Callable[..., SearchResult]] = {
    "greedy1": lambda s, g, **kw: greedy(s, g, lookahead=1, **kw),
    "greedy2": lambda s, g, **kw: greedy(s, g, lookahead=2, **kw),
    "beam-dfs2": lambda s, g, **kw: beam_dfs(s, g, width=2, **kw),
    "beam-dfs4": lambda s, g, **kw: beam_dfs(s, g, width=4, **kw),
    "beam-bfs2": lambda s, g, **kw: beam_bfs(s, g, width=2, **kw),
    "beam-bfs4": lambda s, g, **kw: beam_bfs(s, g, width=4, **kw),
    "random": random_search,
}
