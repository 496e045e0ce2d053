import numpy as np
import pytest

from adaptune.search.sampling import _first_fresh, adaptive_sample, choose_k, coverage_probe, greedy_top_k, refine_on_model
from adaptune.search.space import KnobSpace


def blobs(n_clusters, seed=0, d=6, per=40, spread=0.01):
    rng = np.random.default_rng(seed)
    centers = rng.random((n_clusters, d))
    return np.concatenate([c + spread * rng.standard_normal((per, d)) for c in centers])


@pytest.mark.parametrize("true_k", [8, 9])
def test_choose_k_finds_well_separated_clusters(true_k):
    k, losses, centers = choose_k(blobs(true_k, seed=true_k))
    assert k == true_k and len(centers) == true_k
    # it stopped right after the knee: the last loss barely improved on the knee's
    assert losses[-1] * 2.5 >= losses[-2]
    assert all(a > 2.5 * b for a, b in zip(losses[:-2], losses[1:-1]))


def test_choose_k_stops_early_on_a_smooth_cloud():
    rng = np.random.default_rng(1)
    k, losses, _ = choose_k(rng.random((500, 6)))
    assert k == 8 and len(losses) == 2


def _grid_candidates(seed=0, n=400):
    """Integer configs in 4 tight groups, sizes 32 per knob."""
    rng = np.random.default_rng(seed)
    centers = rng.integers(4, 28, (10, 5))
    return np.clip(np.concatenate([c + rng.integers(-1, 2, (n // 10, 5)) for c in centers]), 0, 31)


def test_adaptive_sample_measures_centroids_never_visited_never_twice():
    cands = _grid_candidates()
    sizes = np.full(5, 32)
    out = adaptive_sample(cands, sizes, set(), seed=0)
    assert 8 <= len(out) <= 64
    assert len({tuple(c) for c in out}) == len(out)
    assert {tuple(c) for c in out} <= {tuple(c) for c in cands}      # snapped to real candidates
    visited = {tuple(int(x) for x in c) for c in out}
    again = adaptive_sample(cands, sizes, visited, seed=0)
    assert not ({tuple(int(x) for x in c) for c in again} & visited)
    assert len(again) == len(out)


def test_sample_synthesis_replaces_a_visited_centroid_with_the_mode():
    rng = np.random.default_rng(3)
    cands = np.concatenate([np.tile([5, 5, 5], (30, 1)) + rng.integers(0, 2, (30, 3)) for _ in range(10)])
    cands = np.concatenate([cands, rng.integers(0, 20, (60, 3))])
    sizes = np.full(3, 20)
    first = adaptive_sample(cands, sizes, set(), seed=1)
    visited = {tuple(int(x) for x in c) for c in first}
    mode = tuple(int(np.bincount(col).argmax()) for col in np.unique(cands, axis=0).T)
    second = adaptive_sample(cands, sizes, visited, seed=1)
    keys = {tuple(int(x) for x in c) for c in second}
    assert not (keys & visited)
    if mode not in visited:
        assert mode in keys                     # a visited centroid was replaced by the mode config
    # with every candidate visited, only synthesised (new) configs can come back
    all_seen = {tuple(int(x) for x in c) for c in cands}
    rest = adaptive_sample(cands, sizes, all_seen, seed=1)
    assert len(rest) > 0 and not ({tuple(int(x) for x in c) for c in rest} & all_seen)


def even(configs):
    """A resolver under which configs with an odd first knob are invalid."""
    return [tuple(int(x) for x in c) if c[0] % 2 == 0 else None for c in configs]


def test_synthesis_respects_validity():
    cands = _grid_candidates(seed=2)
    first = adaptive_sample(cands, np.full(5, 32), set(), seed=0)
    visited = {tuple(int(x) for x in c) for c in first}
    out = adaptive_sample(cands, np.full(5, 32), visited, seed=0, resolve=even)
    synthesised = [c for c in out if tuple(int(x) for x in c) not in {tuple(x) for x in cands.tolist()}]
    assert all(c[0] % 2 == 0 for c in synthesised)


def test_first_fresh_resolved_in_chunks_picks_what_one_at_a_time_picks():
    """Resolving several tries per call (the decodes run side by side) must not change the pick:
    the first try, in order, that is valid under a key not taken."""
    rng = np.random.default_rng(3)
    tries = rng.integers(0, 4, (40, 3))
    canon = lambda cs: [None if c[0] == 3 else (int(c[0]), int(c[1]), 0) for c in cs]   # rejects, aliases
    for seed in range(20):
        taken = {(int(a), int(b), 0) for a, b in np.random.default_rng(seed).integers(0, 4, (6, 2))}
        one = _first_fresh(tries, taken, canon, chunk=1)
        for chunk in (2, 3, 4, 7):
            got = _first_fresh(tries, taken, canon, chunk=chunk)
            assert (got is None) == (one is None) and (got is None or (tuple(got[0]), got[1]) == (tuple(one[0]), one[1]))
    assert one is not None and tuple(one[0]) != tuple(tries[0])    # the test means something: it skipped some


def test_picks_snap_to_valid_members():
    """A cluster whose best member is invalid measures its next-best valid member instead: the
    batch keeps its size, every pick is valid and a real candidate."""
    cands = _grid_candidates(seed=6)
    scores = np.random.default_rng(6).random(len(cands))
    plain = adaptive_sample(cands, np.full(5, 32), set(), seed=0, scores=scores)
    out = adaptive_sample(cands, np.full(5, 32), set(), seed=0, scores=scores, resolve=even)
    assert len(out) == len(plain) and all(c[0] % 2 == 0 for c in out)
    assert {tuple(c) for c in out.tolist()} <= {tuple(c) for c in cands.tolist()}
    assert any(c[0] % 2 for c in plain)     # the test means something: some plain picks were invalid


def test_resolved_keys_count_as_visited():
    """Two configs TVM measures as the same schedule are one: a config resolving to a visited key
    is never picked (the resolver maps knob 4 to 0, as TVM canonicalises compute locations)."""
    cands = _grid_candidates(seed=7)
    first = adaptive_sample(cands, np.full(5, 32), set(), seed=0)
    canon = lambda cs: [tuple(int(x) for x in c[:4]) + (0,) for c in cs]
    visited = set(canon(first))
    out = adaptive_sample(cands, np.full(5, 32), visited, seed=0, resolve=canon)
    assert len(out) and not (set(canon(out)) & visited) and len(set(canon(out))) == len(out)


def test_deterministic_under_seed():
    cands = _grid_candidates(seed=5)
    a = adaptive_sample(cands, np.full(5, 32), set(), seed=7)
    b = adaptive_sample(cands, np.full(5, 32), set(), seed=7)
    assert (a == b).all()


def test_greedy_top_k_skips_visited_and_duplicates():
    cands = np.array([[0, 0], [1, 1], [1, 1], [2, 2], [3, 3]])
    out = greedy_top_k(cands, np.array([5.0, 4.0, 4.0, 3.0, 1.0]), {(0, 0)}, 2)
    assert out.tolist() == [[1, 1], [2, 2]]


def test_with_scores_each_cluster_gives_its_best_predicted_member():
    cands = _grid_candidates(seed=4)
    rng = np.random.default_rng(4)
    scores = rng.random(len(cands))
    out = adaptive_sample(cands, np.full(5, 32), set(), seed=0, scores=scores)
    best = {}
    for c, s in zip(map(tuple, cands.tolist()), scores):      # a config's score (duplicates share one)
        best[c] = max(best.get(c, -1.0), s)
    centroid = adaptive_sample(cands, np.full(5, 32), set(), seed=0)
    assert len(out) == len(centroid) and len({tuple(c) for c in out}) == len(out)
    # every pick is its cluster's maximum, so on average it beats the centroid-nearest pick
    assert np.mean([best[tuple(c)] for c in out.tolist()]) > np.mean([best[tuple(c)] for c in centroid.tolist()])
    # groups are tight: each pick's score is the best among candidates within one step of it
    for c in out:
        near = [s for k, s in best.items() if np.abs(np.array(k) - c).max() <= 1]
        assert best[tuple(int(x) for x in c)] == max(near)


class _TwoSpaces:
    """Knob 0 picks one of two design spaces; knob 2 exists only in space 0."""
    sizes = np.array([2, 4, 6])
    active = np.array([[True, True, True], [True, True, False]])

    def canonical(self, configs):
        configs = np.clip(np.atleast_2d(configs), 0, self.sizes - 1)
        return np.where(self.active[configs[:, 0]], configs, 0)

    movable = KnobSpace.movable


def test_coverage_probe_tries_the_least_measured_value_at_the_best_config():
    space, best = _TwoSpaces(), np.array([0, 2, 3])
    # knob 1 measured: value 2 five times, 1 three times, 0 once, 3 never; the space-1 rows count too
    measured = np.array([[0, 2, 1]] * 5 + [[0, 1, 1]] * 3 + [[1, 0, 0]] + [[0, 2, 4]])
    score = lambda c: -c[:, 1].astype(float)          # the model prefers low values of knob 1
    resolve = lambda rows: [tuple(int(x) for x in r) for r in rows]
    taken = {tuple(r) for r in measured.tolist()}
    c, key = coverage_probe(best, 1, space, measured, taken, resolve, score)
    assert c.tolist() == [0, 3, 3]                    # never measured beats the model's favourite
    c, _ = coverage_probe(best, 1, space, measured, taken | {(0, 3, 3)}, resolve, score)
    assert c.tolist() == [0, 0, 3]                    # then the next least measured
    rejects = lambda rows: [None if r[1] == 0 else tuple(int(x) for x in r) for r in rows]
    c, _ = coverage_probe(best, 1, space, measured, taken | {(0, 3, 3)}, rejects, score)
    assert c.tolist() == [0, 1, 3]                    # an invalid probe gives way to the next
    # the design-space knob: the other space, with the knobs it does not use zeroed
    c, key = coverage_probe(best, 0, space, measured, taken, resolve, score)
    assert c.tolist() == [1, 2, 0] and key not in taken
    # ties in the count go to the model's choice
    c, _ = coverage_probe(best, 2, space, measured, taken, resolve, lambda c: c[:, 2].astype(float))
    assert c.tolist() == [0, 2, 5]
    assert coverage_probe(best, 1, space, measured, taken | {(0, v, 3) for v in range(4)}, resolve, score) is None


def test_refine_on_model_moves_the_probe_to_its_partner_values_and_keeps_the_probed_knob():
    space = _TwoSpaces()
    # the model likes knob 2 equal to knob 1, and a little the higher knob 1
    score = lambda c: -np.abs(c[:, 2] - c[:, 1]).astype(float) + 0.1 * c[:, 1]
    assert refine_on_model(np.array([0, 1, 5]), 1, space, score).tolist() == [0, 1, 1]   # knob 1 stays
    assert refine_on_model(np.array([0, 1, 5]), 2, space, score).tolist() == [0, 3, 5]   # knob 2 stays
    # the design-space knob never moves, and a knob the space does not use stays zero
    assert refine_on_model(np.array([1, 0, 4]), 1, space, score).tolist() == [1, 0, 0]
    assert refine_on_model(np.array([1, 0, 0]), 2, space, lambda c: c[:, 1].astype(float)).tolist() == [1, 3, 0]
