import numpy as np

from adaptune.strategies import STRATEGIES, make_strategy
from adaptune.strategies.sa import simulated_annealing
from adaptune.tuner import TuneState


def test_simulated_annealing_climbs_the_cost_model(conv_space):
    rng = np.random.default_rng(0)
    target = conv_space.random(1, np.random.default_rng(99))[0]
    norm_t = conv_space.normalized(target)[0]

    def score(c):
        return -((conv_space.normalized(c) - norm_t) ** 2).sum(1)

    start = conv_space.random(32, rng)
    top, _, steps = simulated_annealing(conv_space, score, rng, start, n_steps=200, plan_size=16)
    assert len(top) == 16 and steps > 0
    assert score(top).mean() > score(conv_space.random(500, rng)).max() - 0.05
    assert score(top).min() > score(start).mean()


def test_sa_proposes_unmeasured_configs_and_follows_the_model(conv_space):
    state = TuneState(conv_space, seed=0)
    configs = conv_space.random(60, state.rng)
    lat = 1e-3 * (1 + conv_space.normalized(configs)[:, 2])      # knob 2 small = fast
    state.record(configs, list(lat))
    state.refit()
    sa = make_strategy("sa", n_chains=32, n_steps=100)
    sa.setup(state)
    out = sa.propose(16)
    assert 0 < len(out) <= 16
    assert not ({tuple(c) for c in out} & set(state.results))
    assert conv_space.normalized(out)[:13, 2].mean() < conv_space.normalized(configs)[:, 2].mean()


def test_registry_knows_the_baselines():
    assert {"random", "sa"} <= set(STRATEGIES)
