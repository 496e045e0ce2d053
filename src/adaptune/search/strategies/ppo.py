"""The PPO agent of Chameleon's Adaptive Exploration (``exploration.py``): it moves every knob
down / stay / up.

Read top to bottom like a CleanRL script: network, rollout, reward, GAE, clipped update.
Hand-written rather than taken from torchrl: the rollout is a batch of episodes stepped together
on integer knob vectors with the reward computed in chunks from the cost model, which does not
fit torchrl's environment/collector shape, and GAE plus the clipped loss are a dozen lines here.
(``gae`` and ``ppo_update`` are module functions: Woodpecker's measurement-driven agent in
``rl_direct.py`` trains with them too.)

* observation: the config, each knob scaled to [0, 1];
* action: for every knob one of {decrement, stay, increment} (a factorised categorical);
* reward: the cost model's predicted fitness of the state reached, queried in one call per chunk
  of steps for all episodes, and standardised over the batch after the rollout (the model's
  scale drifts between refits; standardising keeps the PPO step size meaningful);
* an episode ends early once its config has not changed for ``patience`` steps, or once its
  predicted fitness has not improved for ``stall`` steps (the early stop AutoTVM's simulated
  annealing has too, 50 steps).  Scoring every ``chunk`` steps rather than once at the end
  gives the same rewards, and lets an iteration cost what the search needs instead of always
  128 x 500 steps;
* the rollout samples actions from a numpy copy of the policy (``ActorCritic.numpy_policy``: torch's
  per-call overhead dwarfs networks this small), and the update trains on at most
  ``max_batch`` of the iteration's transitions, drawn uniformly after GAE has used them all
  (most steps are near-copies of their neighbours).

Hyper-parameters are one ``PPOConfig``: ``CHAMELEON`` is the paper's Table 9, ``WOODPECKER``
the preset of Woodpecker-DL's measurement-driven agent.  The agent persists across calls, so it
keeps what it learned about the design space from one tuning iteration to the next.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from threadpoolctl import ThreadpoolController
from torch import nn

from ..knobs import first_rows


@dataclass(frozen=True)
class PPOConfig:
    """PPO's hyper-parameters: network width(s), Adam step size, discount, GAE parameter, and the
    clipped update's epochs, clip, value and entropy coefficients and minibatch size."""
    hidden: int | tuple = 64
    lr: float = 1e-3
    gamma: float = 0.9
    gae_lambda: float = 0.99
    epochs: int = 3
    clip: float = 0.3
    vf_coef: float = 1.0
    ent_coef: float = 0.1
    minibatch: int = 4096


CHAMELEON = PPOConfig()     # Table 9 (the paper gives no width or minibatch: 64, and one minibatch)
# Woodpecker-DL §2.4: four FC layers 512-1024-1024-512 and c1 = 0.15; entropy 0.01, not its c2 = 20,
# which against normalised advantages flattens the policy into a random walk
WOODPECKER = PPOConfig(hidden=(512, 1024, 1024, 512), epochs=4, clip=0.2, vf_coef=0.15, ent_coef=0.01,
                       minibatch=64)


class Rollout(NamedTuple):
    """A batch of episodes stepped together, each field shaped (steps, episodes, ...)."""
    obs: np.ndarray         # observation before the step
    action: np.ndarray      # per knob: 0 down, 1 stay, 2 up
    reached: np.ndarray     # the config the step reached
    alive: np.ndarray       # whether the step belongs to its episode
    reward: np.ndarray      # raw reward: the cost model's score of ``reached``


_threadpools: ThreadpoolController | None = None
_depth = 0      # one_thread blocks entered and not left (they nest: Chameleon's propose, the agent's explore)


@contextmanager
def one_thread():
    """Run torch and numpy's BLAS on one thread: the networks here are tiny, and a second thread
    only adds hand-off cost.  On a busy machine it is far worse: with another process holding
    both cores, OpenBLAS's spinning threads made one L7 ``propose`` take 0.75-31 s (mean 5.6 s)
    instead of 0.19-0.31 s (``threadpoolctl``, scikit-learn's own dependency, sets the limit).
    Its controller is made once: finding the loaded thread pools costs ~3 ms a time."""
    global _threadpools, _depth
    if _depth:                              # nested: the limits are in place already
        yield
        return
    if _threadpools is None:
        _threadpools = ThreadpoolController()
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    _depth += 1
    try:
        with _threadpools.limit(limits=1):
            yield
    finally:
        _depth -= 1
        torch.set_num_threads(before)


class ActorCritic(nn.Module):
    """First layer shared by the policy and value networks (Chameleon §3.2)."""

    def __init__(self, n_knobs: int, hidden: int = 64):
        super().__init__()
        self.n_knobs = n_knobs
        self.shared = nn.Sequential(nn.Linear(n_knobs, hidden), nn.Tanh())
        self.policy = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 3 * n_knobs))
        self.value = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, obs):
        """Log-probabilities of {decrement, stay, increment} per knob, (..., knobs, 3), and the value.

        A log-softmax rather than ``torch.distributions.Categorical``: the same numbers (the agent's
        candidates are identical), without the distribution object's re-normalising on every call;
        one ``explore`` on a 10-knob synthetic surface went from 0.39 s to 0.34 s."""
        h = self.shared(obs)
        logp = torch.log_softmax(self.policy(h).view(*obs.shape[:-1], self.n_knobs, 3), -1)
        return logp, self.value(h).squeeze(-1)

    def evaluate(self, obs, act):
        """(log-probability of the joint action, its entropy, value) for observations and actions."""
        logp, value = self(obs)
        taken = logp.gather(-1, act.unsqueeze(-1)).squeeze(-1).sum(-1)
        return taken, -(logp.exp() * logp).sum((-2, -1)), value

    def numpy_policy(self):
        """The policy's logits, (E, knobs, 3), as a numpy function of the observations.

        The rollout's networks see 128 configs of a few dozen knobs: torch's per-call overhead
        is ten times the arithmetic there (1.2 ms against ~0.1 ms per step), so the rollout
        samples its actions from a numpy copy of the weights, and the log-probabilities and
        values the update needs come from one batched torch pass afterwards."""
        layers = [m for m in (*self.shared, *self.policy) if isinstance(m, nn.Linear)]
        weights = [(m.weight.detach().numpy().T.copy(), m.bias.detach().numpy().copy()) for m in layers]

        def logits(obs: np.ndarray) -> np.ndarray:
            h = obs
            for i, (w, b) in enumerate(weights):
                h = h @ w + b
                if i < len(weights) - 1:
                    h = np.tanh(h)
            return h.reshape(len(obs), self.n_knobs, 3)
        return logits


def gae(rewards, values, alive, gamma: float, lam: float):
    """Generalised advantage estimation over time for (T, E) tensors; ``alive[t]`` marks the
    steps that belong to the episode, whose last live step bootstraps 0.  Returns (adv, returns).
    The backward recursion runs in numpy: a few hundred steps of tiny torch ops cost ~10x more."""
    r, v = rewards.detach().numpy(), values.detach().numpy()
    nonterminal = np.zeros_like(r)
    nonterminal[:-1] = alive[1:].numpy()
    next_value = np.zeros_like(r)
    next_value[:-1] = v[1:]
    delta = r + gamma * next_value * nonterminal - v
    adv = np.zeros_like(r)
    last = np.zeros_like(r[0])
    for t in reversed(range(len(r))):
        last = delta[t] + gamma * lam * nonterminal[t] * last
        adv[t] = last
    adv = torch.from_numpy(adv)
    return adv, adv + values


def ppo_update(net, opt, evaluate, old_logp, adv, ret, cfg: PPOConfig, gen: torch.Generator) -> None:
    """The clipped-surrogate PPO step over a batch of transitions, in shuffled minibatches.

    ``evaluate(idx)`` re-runs the network on transitions ``idx`` and returns their (log
    probability of the action taken, entropy, value) under the current weights."""
    n = len(old_logp)
    for _ in range(cfg.epochs):
        perm = torch.randperm(n, generator=gen)
        for start in range(0, n, cfg.minibatch):
            idx = perm[start:start + cfg.minibatch]
            logp, entropy, value = evaluate(idx)
            ratio = torch.exp(logp - old_logp[idx])
            a = adv[idx]
            a = (a - a.mean()) / (a.std() + 1e-8)
            pg_loss = torch.max(-a * ratio, -a * torch.clamp(ratio, 1 - cfg.clip, 1 + cfg.clip)).mean()
            v_loss = 0.5 * ((value - ret[idx]) ** 2).mean()
            loss = pg_loss + cfg.vf_coef * v_loss - cfg.ent_coef * entropy.mean()
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(net.parameters(), 0.5)
            opt.step()


class PPOAgent:
    """The agent: ``config``'s PPO, episodes ending after ``patience`` still steps or ``stall``
    steps without a better score (scored every ``chunk`` steps), updates on at most
    ``max_batch`` transitions."""

    def __init__(self, sizes, config: PPOConfig = CHAMELEON, *, seed: int = 0, patience: int = 3,
                 stall: int = 50, chunk: int = 10, max_batch: int = 4096):
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.config = config
        self.patience, self.stall, self.chunk, self.max_batch = patience, stall, chunk, max_batch
        self.gen = torch.Generator().manual_seed(seed)
        self.rng = np.random.default_rng(seed)
        torch.manual_seed(seed)
        self.net = ActorCritic(len(self.sizes), config.hidden)
        self.opt = torch.optim.Adam(self.net.parameters(), lr=config.lr, eps=1e-5)
        self.last_steps = self.converge_step = 0
        self._pending = None                # a rollout not learned from yet, see explore(learn=False)
        self.history: list[float] = []      # mean raw reward per explore() call

    def _obs(self, configs: np.ndarray) -> np.ndarray:
        return (configs / np.maximum(self.sizes - 1, 1)).astype(np.float32)

    def _rollout(self, init: np.ndarray, max_steps: int, reward_fn) -> Rollout:
        """Step all episodes together, scoring the states reached with the cost model every
        ``chunk`` steps."""
        policy = self.net.numpy_policy()
        cfg, still = init.copy(), np.zeros(len(init), dtype=np.int64)
        alive = np.ones(len(init), dtype=bool)
        best = np.full(len(init), -np.inf)
        last_gain = np.zeros(len(init), dtype=np.int64)             # step of each episode's last new best
        obs_l, act_l, next_l, alive_l, reward_l = [], [], [], [], []
        for t in range(max_steps):
            obs = self._obs(cfg)
            logits = policy(obs)                                    # Gumbel-max: a draw from softmax(logits)
            action = (logits - np.log(-np.log(self.rng.random(logits.shape)))).argmax(-1)
            nxt = np.clip(cfg + action - 1, 0, self.sizes - 1)
            obs_l.append(obs); act_l.append(action); next_l.append(nxt); alive_l.append(alive.copy())
            still = np.where((nxt != cfg).any(-1), 0, still + 1)
            cfg = np.where(alive[:, None], nxt, cfg)
            alive &= still < self.patience
            if (t + 1) % self.chunk == 0 or not alive.any() or t + 1 == max_steps:
                s0 = len(reward_l)                                  # score the chunk just walked
                live = np.stack(alive_l[s0:])
                r = np.full(live.shape, -np.inf)
                r[live] = np.asarray(reward_fn(np.stack(next_l[s0:])[live]), dtype=np.float64)
                for s, r_s in enumerate(r, s0):
                    last_gain = np.where(r_s > best, s, last_gain)
                    best = np.maximum(best, r_s)
                    reward_l.append(r_s)
                alive &= t - last_gain < self.stall
            if not alive.any():
                break
        return Rollout(*(np.stack(x) for x in (obs_l, act_l, next_l, alive_l, reward_l)))

    def explore(self, init_configs: np.ndarray, reward_fn, *, max_steps: int = 500,
                max_batch: int | None = None, learn: bool = True, rewards: bool = False):
        """Run one batch of episodes from ``init_configs`` and return every distinct config reached
        (the candidate set S_Θ), with ``rewards`` also each one's raw reward (NaN for a start
        state never reached), so the caller need not ask the cost model again; then learn from
        the batch (from at most ``max_batch`` transitions, default the agent's).  With
        ``learn=False`` the batch is kept for ``learn()``: the update does not change this batch's
        candidates, so Chameleon runs it on a second core while it clusters and decodes them."""
        with one_thread():
            init = np.asarray(init_configs, dtype=np.int64)
            ro = self._rollout(init, max_steps, reward_fn)
            self.last_steps = len(ro.reached)
            self.history.append(float(ro.reward[ro.alive].mean()))
            best_so_far = np.maximum.accumulate(ro.reward.max(1))
            self.converge_step = int((best_so_far < best_so_far[-1]).sum()) + 1   # step the best stopped improving
            self._pending = (ro, max_batch or self.max_batch)
            if learn:
                self.learn()
        states = np.concatenate([init, ro.reached[ro.alive]])
        first = first_rows(states)
        if not rewards:
            return states[first]
        return states[first], np.concatenate([np.full(len(init), np.nan), ro.reward[ro.alive]])[first]

    def learn(self) -> None:
        """The PPO update on the last ``explore(learn=False)``'s batch (no-op if none is pending)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            with one_thread():
                self._learn(*pending)

    def _learn(self, ro: Rollout, max_batch: int) -> None:
        raw = ro.reward[ro.alive]
        std = np.zeros_like(ro.reward, dtype=np.float32)
        std[ro.alive] = (raw - raw.mean()) / (raw.std() + 1e-8)
        obs, act, alive = torch.from_numpy(ro.obs), torch.from_numpy(ro.action), torch.from_numpy(ro.alive)
        live = torch.nonzero(alive.flatten()).squeeze(1)                 # episodes end at different steps
        obs, act = obs.flatten(0, 1)[live], act.flatten(0, 1)[live]
        val = torch.zeros(alive.numel())
        with torch.no_grad():                                            # GAE needs every live step's value
            val[live] = self.net.value(self.net.shared(obs)).squeeze(-1)
        adv, ret = gae(torch.from_numpy(std), val.view(alive.shape), alive, self.config.gamma,
                       self.config.gae_lambda)
        adv, ret = adv.flatten()[live], ret.flatten()[live]
        keep = torch.arange(len(live))
        if len(keep) > max_batch:          # neighbouring steps of an episode are near-duplicates
            keep = keep[torch.randperm(len(keep), generator=self.gen)[:max_batch]]
        b_obs, b_act, b_adv, b_ret = (x[keep] for x in (obs, act, adv, ret))
        with torch.no_grad():                                            # the update needs only its batch's
            b_logp = self.net.evaluate(b_obs, b_act)[0]                  # log-probs under the rollout policy

        def evaluate(idx):
            return self.net.evaluate(b_obs[idx], b_act[idx])
        ppo_update(self.net, self.opt, evaluate, b_logp, b_adv, b_ret, self.config, self.gen)
