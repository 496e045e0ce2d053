"""What every registered strategy promises the loop, checked for each name in ``STRATEGIES``:
proposals are configs of the space, distinct, never measured (nor known aliases of a measured
kernel), at most the batch asked for, before and after the cost model has data; an update with
no configs changes nothing the contract needs; options no part takes are refused."""
import numpy as np
import pytest

from adaptune.search.state import TuneState
from adaptune.search.strategies import STRATEGIES, make_strategy

FAST = {"sa": {"n_chains": 16, "n_steps": 20}, "sa+as": {"n_chains": 16, "n_steps": 20, "pool": 64},
        "rl": {"episodes": 8, "max_steps": 20}, "rl+as": {"episodes": 8, "max_steps": 20, "pool": 64},
        "chameleon": {"episodes": 8, "max_steps": 20, "pool": 64}, "rl-direct": {"update_every": 8}}


def _check(state, out, n):
    space = state.space
    assert out.ndim == 2 and out.shape[1] == space.ndim and len(out) <= n
    assert ((out >= 0) & (out < space.sizes)).all()
    keys = [tuple(int(x) for x in c) for c in space.canonical(out)]
    assert len(set(keys)) == len(keys), "a config proposed twice"
    assert not set(keys) & state.measured_keys(), "a measured config proposed again"


def _measure(state, strategy, out):
    """What the loop does with a proposal: resolve it, record the valid ones, refit, update."""
    keys = [k for k in dict.fromkeys(state.resolve(out)) if k is not None and k not in state.results]
    configs = np.array(keys, dtype=np.int64).reshape(-1, state.space.ndim)
    state.after_measure(strategy, configs, list(1e-3 * (1 + state.space.normalized(configs)[:, 2])))


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_strategy_keeps_the_contract(name, conv_space):
    state = TuneState(conv_space, seed=0)
    strategy = make_strategy(name, **FAST.get(name, {}))
    strategy.setup(state.context)
    n = 8
    for _ in range(3):                  # the first batch without a model, then with one
        out = strategy.propose(n)
        _check(state, out, n)
        _measure(state, strategy, out)
    assert state.cost_model.trained
    strategy.update(np.empty((0, conv_space.ndim), dtype=np.int64), [])
    out = strategy.propose(n)
    _check(state, out, n)
    assert len(out) > 0


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_unknown_options_are_refused(name):
    with pytest.raises(TypeError):
        make_strategy(name, no_such_option=1)


def test_the_papers_variants_and_woodpeckers_searches_are_registered():
    assert {"random", "sa", "rl", "sa+as", "rl+as", "chameleon", "ga", "rl-direct"} <= set(STRATEGIES)
