import numpy as np
import pytest

from adaptune.search.cost_model import CostModel


def _synthetic_latency(space, configs):
    """A smooth surface over the features: the model should learn to rank it."""
    x = space.features(configs)
    w = np.linspace(-1, 1, x.shape[1])
    return np.exp(x @ w) * 1e-3


@pytest.mark.parametrize("objective", ["reg", "rank"])
def test_cost_model_learns_a_ranking(conv_space, objective):
    rng = np.random.default_rng(0)
    train, test = conv_space.random(300, rng), conv_space.random(300, rng)
    model = CostModel(conv_space, objective=objective)
    assert not model.trained and (model.predict(test) == 0).all()
    model.fit(train, list(_synthetic_latency(conv_space, train)))
    pred = model.predict(test)
    truth = -_synthetic_latency(conv_space, test)          # higher fitness = lower latency
    rank_corr = np.corrcoef(np.argsort(np.argsort(pred)), np.argsort(np.argsort(truth)))[0, 1]
    assert rank_corr > 0.8


def test_targets_are_normalised_throughput():
    y = CostModel.targets([2.0, 1.0, None, 4.0, float("inf")])
    assert y.tolist() == [0.5, 1.0, 0.0, 0.25, 0.0]
