import numpy as np

from adaptune.search.strategies.ppo import PPOAgent


def test_ppo_raises_predicted_reward_on_a_synthetic_surface():
    rng = np.random.default_rng(0)
    sizes = np.array([10, 20, 30, 40, 15, 25])
    optimum = rng.integers(0, sizes)

    def fitness(c):
        return -(((c - optimum) / (sizes - 1)) ** 2).sum(1)

    agent = PPOAgent(sizes, seed=0)
    starts = [(rng.random((64, 6)) * sizes).astype(np.int64) for _ in range(8)]
    visited = [agent.explore(s, fitness, max_steps=60) for s in starts]
    assert agent.history[-1] > agent.history[0] + 0.2       # mean reward along trajectories rose
    random_configs = (rng.random((len(visited[-1]), 6)) * sizes).astype(np.int64)
    assert fitness(visited[-1]).mean() > fitness(random_configs).mean() + 0.2   # it walks towards the optimum
    assert (visited[-1] >= 0).all() and (visited[-1] < sizes).all()


def test_episodes_stop_once_they_stop_moving():
    agent = PPOAgent(np.array([1, 1, 1]), seed=0)            # nothing can move
    out = agent.explore(np.zeros((4, 3), dtype=np.int64), lambda c: np.zeros(len(c)), max_steps=500)
    assert agent.last_steps == agent.patience and len(out) == 1


def test_episodes_stop_once_the_predicted_fitness_stops_improving():
    agent = PPOAgent(np.array([50, 50, 50]), seed=0, stall=20, chunk=5)
    calls = []

    def flat(c):                                               # nothing ever improves on the first step
        calls.append(len(c))
        return np.zeros(len(c))
    agent.explore(np.full((8, 3), 25, dtype=np.int64), flat, max_steps=500)
    assert agent.last_steps <= 20 + 5                          # stopped within one chunk of the stall limit
    assert len(calls) == -(-agent.last_steps // 5)             # the cost model was asked once per chunk


def test_the_rollouts_numpy_policy_is_the_torch_policy():
    import torch

    agent = PPOAgent(np.array([5, 9, 2, 30]), seed=1)
    obs = np.random.default_rng(0).random((16, 4)).astype(np.float32)
    logits = agent.net.numpy_policy()(obs)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    with torch.no_grad():
        want = agent.net(torch.from_numpy(obs))[0].exp().numpy()
    assert probs.shape == want.shape == (16, 4, 3)
    assert np.allclose(probs, want, atol=1e-5)


def test_a_deferred_update_is_the_same_update():
    """explore(learn=False) returns the same candidates and leaves the weights alone until learn(),
    which then does exactly what explore(learn=True) does (Chameleon runs it beside sampling)."""
    import torch

    sizes = np.array([10, 20, 30])
    init = np.random.default_rng(0).integers(0, sizes, (16, 3))
    fitness = lambda c: -((c / (sizes - 1) - 0.3) ** 2).sum(1)
    now, later = PPOAgent(sizes, seed=4), PPOAgent(sizes, seed=4)
    before = [p.detach().clone() for p in later.net.parameters()]
    a = now.explore(init, fitness, max_steps=40)
    b = later.explore(init, fitness, max_steps=40, learn=False)
    assert np.array_equal(a, b)
    assert all(torch.equal(p, q) for p, q in zip(before, later.net.parameters()))
    later.learn()
    assert all(torch.equal(p, q) for p, q in zip(now.net.parameters(), later.net.parameters()))
    assert not all(torch.equal(p, q) for p, q in zip(before, later.net.parameters()))
    assert np.array_equal(now.explore(init, fitness, max_steps=40), later.explore(init, fitness, max_steps=40))


def test_explore_can_return_each_candidates_reward():
    """With rewards=True every candidate comes with the cost model's score of it (what the
    caller would get by asking again), NaN only for start states no episode reached."""
    sizes = np.array([10, 20, 30])
    fitness = lambda c: -((c / (sizes - 1) - 0.3) ** 2).sum(1)
    init = np.random.default_rng(1).integers(0, sizes, (16, 3))
    configs, scores = PPOAgent(sizes, seed=2).explore(init, fitness, max_steps=30, rewards=True)
    assert len(configs) == len(scores) == len(np.unique(configs, axis=0)) > len(init)
    scored = ~np.isnan(scores)
    assert np.allclose(scores[scored], fitness(configs[scored]))
    assert {tuple(c) for c in configs[~scored].tolist()} <= {tuple(c) for c in init.tolist()}


def test_the_presets_are_chameleons_table_9_and_woodpeckers():
    from adaptune.search.strategies.ppo import CHAMELEON, WOODPECKER

    c = CHAMELEON
    assert (c.lr, c.gamma, c.gae_lambda, c.epochs, c.clip, c.vf_coef, c.ent_coef) == (1e-3, 0.9, 0.99, 3, 0.3, 1.0, 0.1)
    assert WOODPECKER.hidden == (512, 1024, 1024, 512) and WOODPECKER.vf_coef == 0.15     # its four FC layers, c1
