"""The paper's benchmark set (§5): matmuls with M, N, K in 64..256, step 16 (13^3 = 2197 loop
nests), split once, reproducibly, into training and held-out test contractions."""
from __future__ import annotations

import itertools

import numpy as np

from .nest import Contraction, matmul

SIZES = range(64, 257, 16)


def paper_matmuls() -> list[Contraction]:
    return [matmul(m, n, k) for m, n, k in itertools.product(SIZES, repeat=3)]


def split(test: int = 50, seed: int = 0) -> tuple[list[Contraction], list[Contraction]]:
    """(train, test): ``test`` contractions drawn at random (seeded) are held out."""
    allm = paper_matmuls()
    order = np.random.default_rng(seed).permutation(len(allm))
    return [allm[i] for i in order[test:]], [allm[i] for i in order[:test]]
