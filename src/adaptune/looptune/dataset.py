"""The paper's benchmark set (§5): matmuls with M, N, K in 64..256, step 16 (13^3 = 2197 loop
nests), split once, reproducibly, into training and held-out test contractions; and sizes off
that grid, a fixed test set and a seeded validation draw, for what the grid never shows (tails)."""
from __future__ import annotations

import itertools

import numpy as np

from .nest import Contraction, matmul

SIZES = range(64, 257, 16)
# held out off the grid: `adaptune looptune M N K` on these is issue 35's off-grid check
OFF_GRID_TEST = ((100, 150, 200), (300, 200, 100), (72, 120, 90), (200, 300, 250), (50, 500, 64),
                 (128, 96, 160), (90, 90, 90), (150, 100, 70), (250, 130, 180), (65, 200, 120))


def paper_matmuls() -> list[Contraction]:
    return [matmul(m, n, k) for m, n, k in itertools.product(SIZES, repeat=3)]


def split(test: int = 50, seed: int = 0) -> tuple[list[Contraction], list[Contraction]]:
    """(train, test): ``test`` contractions drawn at random (seeded) are held out."""
    allm = paper_matmuls()
    order = np.random.default_rng(seed).permutation(len(allm))
    return [allm[i] for i in order[test:]], [allm[i] for i in order[:test]]


def off_grid(count: int, seed: int, lo: int = 64, hi: int = 256) -> list[Contraction]:
    """``count`` matmuls of random sizes in lo..hi with at least one size off the grid, none of
    them a test matmul (held out on the grid or ``OFF_GRID_TEST``)."""
    rng, out = np.random.default_rng(seed), []
    held = set(split()[1]) | {matmul(*s) for s in OFF_GRID_TEST}
    while len(out) < count:
        c = matmul(*map(int, rng.integers(lo, hi + 1, 3)))
        if c not in held and c not in out and any(n not in SIZES for _, n in c.sizes):
            out.append(c)
    return out


def training_pool(grid: int, off: int, seed: int, lo: int = 64, hi: int = 256) -> list[Contraction]:
    """What a training run sees: ``grid`` matmuls of the training split (a seeded draw) and ``off``
    sizes off the grid in lo..hi (``off_grid``, same seed)."""
    train = split()[0]
    return [train[i] for i in np.random.default_rng(seed).permutation(len(train))[:grid]] + off_grid(off, seed, lo, hi)
