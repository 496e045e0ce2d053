"""Woodpecker-DL's searches: genetic (ga.py, §2.3) and measurement-driven PPO (rl_direct.py, §2.4)."""
import numpy as np
import pytest

from adaptune.search.strategies import STRATEGIES, make_strategy
from adaptune.search.strategies.ga import converged, crossover, mutate, roulette_select
from adaptune.search.strategies.rl_direct import moving_average, reward
from adaptune.tuner import TuneState
from adaptune.model.workloads import get_workload

DENSE = get_workload("tiny-dense")


@pytest.fixture(scope="module")
def dense_space(target):
    from adaptune.search.space import KnobSpace
    return KnobSpace(DENSE.mod(), target, seed=1)


class _Draws:
    """An rng whose ``random`` returns fixed numbers, to hit Eq. 2's interval ends exactly."""

    def __init__(self, *u):
        self.u = np.array(u)

    def random(self, k):
        return self.u[:k]


def test_roulette_wheel_follows_eqs_1_and_2():
    # p = (.25, .25, .5), P = (.25, .5, 1); v = 1 - u picks i with P(a_{i-1}) < v <= P(a_i)
    fitness = [1.0, 1.0, 2.0]
    assert roulette_select(fitness, 4, _Draws(0.8, 0.5, 0.49, 0.0)).tolist() == [0, 1, 2, 2]
    assert roulette_select([0.0, 1.0, 0.0], 3, _Draws(0.999, 0.5, 0.0)).tolist() == [1, 1, 1]


def test_roulette_favours_fitter_parents_and_never_picks_zero_fitness():
    picks = roulette_select([0.0, 1.0, 0.0, 3.0], 20_000, np.random.default_rng(0))
    counts = np.bincount(picks, minlength=4)
    assert counts[0] == counts[2] == 0
    assert counts[3] / counts[1] == pytest.approx(3.0, rel=0.08)
    all_failed = np.bincount(roulette_select([0.0, 0.0], 2000, np.random.default_rng(1)), minlength=2)
    assert all_failed.min() > 900                                  # no information: uniform


def test_uniform_crossover_and_per_knob_mutation():
    rng = np.random.default_rng(0)
    a, b = np.zeros(8, dtype=np.int64), np.ones(8, dtype=np.int64)
    kids = np.array([crossover(a, b, rng) for _ in range(2000)])
    assert set(np.unique(kids)) == {0, 1} and kids.mean() == pytest.approx(0.5, abs=0.02)
    sizes = np.array([5, 1, 7, 2, 9])
    c = np.array([4, 0, 3, 1, 0])
    assert (mutate(c, sizes, 0.0, rng) == c).all()
    for _ in range(200):
        m = mutate(c, sizes, 1.0, rng)
        assert ((m != c) == (sizes > 1)).all() and (m >= 0).all() and (m < sizes).all()


def test_convergence_is_a_small_spread_of_runtimes():
    assert converged([1.0, 1.01, 0.99, None], 0.05)
    assert not converged([1.0, 1.5, 0.8], 0.05)
    assert not converged([1.0, None], 0.05)                       # one runtime is no population


def test_eqs_3_and_4_by_hand():
    # alpha_t = (0.8 alpha_{t-1} + beta_t) / t, alpha_0 = 0
    assert moving_average(0.0, 2.0, 1) == pytest.approx(2.0)
    assert moving_average(2.0, 1.0, 2) == pytest.approx(1.3)      # (1.6 + 1) / 2
    assert moving_average(1.3, 0.5, 3) == pytest.approx(0.5133333333)   # (1.04 + 0.5) / 3
    # r_t = alpha_{t-1} - min(beta_t, 2 alpha_{t-1})
    assert reward(0.0, 5.0) == 0.0
    assert reward(2.0, 1.0) == pytest.approx(1.0)
    assert reward(2.0, 3.0) == pytest.approx(-1.0)
    assert reward(2.0, 10.0) == pytest.approx(-2.0)               # clamped at 2 alpha: -alpha
    assert reward(2.0, 4.0) == pytest.approx(-2.0)                # a failure counts as beta = 2 alpha


def _synthetic_search(space, name, monkeypatch, generations=12, n=8, **options):
    """Drive a strategy as the tuner does, on a latency surface where knob 2 small is fast and
    configs with an odd knob 3 are declared invalid; returns (state, strategy, proposals)."""
    monkeypatch.setattr(space, "is_valid", lambda c: int(np.atleast_2d(c)[0, 3]) % 2 == 0)
    state = TuneState(space, seed=0)
    strat = make_strategy(name, **options)
    strat.setup(state)
    proposals = []
    for _ in range(generations):
        out = strat.propose(n)
        keys = [tuple(int(x) for x in c) for c in out]
        assert 0 < len(out) <= n and len(set(keys)) == len(keys)
        assert not set(keys) & state.measured_keys()
        assert all(space.is_valid(c) for c in out)
        lat = list(1e-3 * (1 + 4 * space.normalized(out)[:, 2]))
        state.record(out, lat)
        strat.update(out, lat)
        proposals.append(out)
    return state, strat, proposals


def test_ga_breeds_only_valid_unmeasured_children_towards_fitter_parents(dense_space, monkeypatch):
    state, ga, proposals = _synthetic_search(dense_space, "ga", monkeypatch)
    first, last = (dense_space.normalized(np.concatenate(p))[:, 2].mean() for p in (proposals[:2], proposals[-4:]))
    assert last < first - 0.15                                    # selection pulls knob 2 down
    assert min(lat for _, lat in ga.population) == state.best_latency     # elitism keeps the best


def test_rl_direct_steps_parallel_environments_and_learns(dense_space, monkeypatch):
    state, rl, proposals = _synthetic_search(dense_space, "rl-direct", monkeypatch, update_every=16)
    assert len(rl.envs) == 8 and rl.updates >= 1
    assert rl.scale == pytest.approx(state.results[tuple(int(x) for x in proposals[0][0])])


def test_registered():
    assert {"ga", "rl-direct"} <= set(STRATEGIES)


@pytest.mark.parametrize("name,options", [("ga", {}), ("rl-direct", {"update_every": 4})])
def test_real_tune_returns_a_valid_checked_best(tmp_path, target, dense_space, name, options):
    from adaptune import tune_tir
    from adaptune.cli.ops import check_numerics

    res = tune_tir(DENSE.mod(), target, strategy=name, trials=6, batch_size=3, seed=0, work_dir=tmp_path,
                   strategy_options=options)
    assert res.trials == 6 and res.best_latency > 0 and not res.failures
    assert dense_space.is_valid(res.best_config)
    assert check_numerics(DENSE, res.best_schedule, target)[0]
