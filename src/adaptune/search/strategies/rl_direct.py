"""Woodpecker-DL's RL-search (§2.4): model-free PPO rewarded by measured runtimes.

* observation (the paper's O_conv, for any operator): the workload's buffer shapes (log2, from
  its PrimFunc's signature; constant within one task, they matter to an agent shared across
  operators), the current knobs scaled to [0, 1], and the runtime moving average α;
* action: one knob one step down or up (2·ndim actions: "an action updates one parameter at a
  time"); moves off a knob's domain, or on knobs the config's design space does not use, are
  masked out;
* α_t (Eq. 3) and r_t (Eq. 4) exactly as printed, on runtimes in units of the first latency
  measured (both equations are homogeneous in runtime, so this only rescales rewards for PPO).
  As printed, Eq. 3 divides by the step t and so decays like β/t: episodes are kept short
  (``horizon``, 3 steps: on a synthetic latency surface 3 did at least as well as 4-8), each
  restarting with α_0 = 0 from one of the best configs measured so far or, half the time, a
  random one;
* network: policy and value each the paper's four tanh layers 512-1024-1024-512;
* PPO through ppo.py's ``gae`` and ``ppo_update`` with its ``WOODPECKER`` preset.

``propose(n)`` advances n environments one step each.  A step that lands on a kernel measured
before (keyed as the loop keys it, ``SearchContext.key``) takes its reward from that record and
steps again; one that lands on an invalid or failing config gets the failure reward
(β_t = 2α_{t-1}) and stays put; these steps are free, so at most ``free_steps`` per environment
and call.  Every other step costs a real measurement, so the agent learns only as fast as the
hardware measures: at budgets of tens of trials it is barely trained, and even in the paper it is
the slow, high-variance search (§3.2).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from ...measure.verify import signature
from .base import Strategy, register
from .ppo import WOODPECKER, PPOConfig, gae, ppo_update


def moving_average(alpha_prev: float, beta: float, t: int) -> float:
    """Eq. 3: α_t = (0.8·α_{t-1} + β_t) / t, with α_0 = 0 and t >= 1 the step in the episode."""
    return (alpha_prev * 0.8 + beta) / t


def reward(alpha_prev: float, beta: float) -> float:
    """Eq. 4: r_t = α_{t-1} - min(β_t, 2·α_{t-1})."""
    return alpha_prev - min(beta, 2 * alpha_prev)


def _mlp(sizes) -> nn.Sequential:
    layers = []
    for a, b in zip(sizes[:-2], sizes[1:-1]):
        layers += [nn.Linear(a, b), nn.Tanh()]
    return nn.Sequential(*layers, nn.Linear(sizes[-2], sizes[-1]))


class PolicyValue(nn.Module):
    """Separate policy and value MLPs; ``hidden`` is a width (two layers) or the layer widths."""

    def __init__(self, n_obs: int, n_actions: int, hidden: int | tuple = 64):
        super().__init__()
        widths = (hidden, hidden) if isinstance(hidden, int) else tuple(hidden)
        self.policy = _mlp((n_obs, *widths, n_actions))
        self.value = _mlp((n_obs, *widths, 1))

    def forward(self, obs, mask):
        logits = self.policy(obs).masked_fill(~mask, -1e9)
        return torch.distributions.Categorical(logits=logits), self.value(obs).squeeze(-1)


class Decision(NamedTuple):
    """One step the agent took: what it saw, what it did, with what probability and value."""
    obs: torch.Tensor
    mask: torch.Tensor
    action: torch.Tensor
    logp: torch.Tensor
    value: torch.Tensor


class Step(NamedTuple):
    """A decision with its reward (Eq. 4), once its outcome is known."""
    decision: Decision
    reward: float


@dataclass
class _Env:
    config: np.ndarray
    alpha: float = 0.0                              # α_{t-1}
    t: int = 0                                      # steps taken in this episode
    steps: list[Step] = field(default_factory=list)
    pending: tuple[Decision, tuple] | None = None   # the decision and the key it waits to see measured


@register("rl-direct")
class RLDirect(Strategy):
    def __init__(self, horizon: int = 3, free_steps: int = 8, update_every: int = 32, ppo: PPOConfig = WOODPECKER):
        self.horizon, self.free_steps, self.update_every, self.ppo = horizon, free_steps, update_every, ppo
        self.envs: list[_Env] = []
        self.episodes: list[list[Step]] = []        # finished episodes not learned from yet
        self.scale: float | None = None             # runtime unit: the first latency measured
        self.updates = 0

    def setup(self, context) -> None:
        super().setup(context)
        space = self.state.space
        dims = [d for shape, _ in signature(space.mod) for d in shape]
        self.shape_obs = (np.log2(1.0 + np.array(dims, dtype=np.float32)) / 10).astype(np.float32)
        seed = int(self.state.rng.integers(1 << 30))
        self.gen = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        self.net = PolicyValue(len(dims) + space.ndim + 1, 2 * space.ndim, self.ppo.hidden)
        self.opt = torch.optim.Adam(self.net.parameters(), lr=self.ppo.lr, eps=1e-5)

    # -- environment ----------------------------------------------------------------------------------
    def _observe(self, env: _Env):
        space = self.state.space
        obs = np.concatenate([self.shape_obs, space.normalized(env.config)[0], [env.alpha]]).astype(np.float32)
        movable = space.movable(env.config)
        mask = np.stack([movable & (env.config > 0), movable & (env.config < space.sizes - 1)], 1).ravel()
        return torch.from_numpy(obs), torch.from_numpy(mask if mask.any() else np.ones_like(mask))

    def _start(self) -> np.ndarray:
        st = self.state
        best = st.best(4)
        if len(best) and st.rng.random() < 0.5:
            return best[st.rng.integers(len(best))]
        for _ in range(16):
            c = st.space.random(1, st.rng)[0]
            if st.space.is_valid(c):
                return c
        return c

    def _finish(self, env: _Env, decision: Decision, key: tuple | None, latency: float | None) -> None:
        """Reward a decision whose outcome is known; move to ``key`` unless it failed."""
        if latency is not None and self.scale is None:
            self.scale = latency
        beta = 2 * env.alpha if latency is None else latency / self.scale
        env.t += 1
        env.steps.append(Step(decision, reward(env.alpha, beta)))
        env.alpha = moving_average(env.alpha, beta, env.t)
        if latency is not None:
            env.config = np.array(key, dtype=np.int64)
        if env.t == self.horizon:
            self.episodes.append(env.steps)
            env.config, env.alpha, env.t, env.steps = self._start(), 0.0, 0, []

    def _step(self, env: _Env, taken: set) -> np.ndarray | None:
        """Step ``env`` until it reaches an unmeasured valid config (returned, left pending) or
        runs out of free steps (None)."""
        st = self.state
        for _ in range(self.free_steps):
            obs, mask = self._observe(env)
            with torch.no_grad():
                dist, value = self.net(obs, mask)
                action = torch.multinomial(dist.probs, 1, generator=self.gen)[0]
            decision = Decision(obs, mask, action, dist.log_prob(action), value)
            knob, up = divmod(int(action), 2)
            new = env.config.copy()
            new[knob] += 1 if up else -1
            key = st.key(new)                                 # the kernel's key, as the loop records it
            if key is None or not st.space.is_valid(np.array(key)):
                self._finish(env, decision, key, None)
            elif key in taken:                                # another environment measures it now
                env.pending = decision, key
                return None
            elif key in st.outcomes:
                self._finish(env, decision, key, st.outcomes[key])
            else:
                env.pending = decision, key
                taken.add(key)
                return np.array(key, dtype=np.int64)
        return None

    def propose(self, n: int) -> np.ndarray:
        while len(self.envs) < n:
            self.envs.append(_Env(self._start()))
        taken = {env.pending[1] for env in self.envs if env.pending is not None}
        out = []
        for env in self.envs:
            if len(out) == n:
                break
            if env.pending is None and (new := self._step(env, taken)) is not None:
                out.append(new)
        return np.array(out, dtype=np.int64).reshape(-1, self.state.space.ndim)

    def update(self, configs: np.ndarray, latencies: list) -> None:
        measured = {tuple(int(x) for x in c): lat for c, lat in zip(configs, latencies)}
        for env in self.envs:
            if env.pending is None:
                continue
            decision, key = env.pending
            env.pending = None
            if key in measured:
                self._finish(env, decision, key, measured[key])
            elif key in self.state.outcomes:
                self._finish(env, decision, key, self.state.outcomes[key])
            # else: the loop did not measure it; the step is dropped
        if sum(map(len, self.episodes)) >= self.update_every:
            self._learn()

    # -- learning -------------------------------------------------------------------------------------
    def _learn(self) -> None:
        decisions = [s.decision for ep in self.episodes for s in ep]
        adv, ret = [], []
        for ep in self.episodes:
            r = torch.tensor([s.reward for s in ep], dtype=torch.float32)[:, None]
            a, rt = gae(r, torch.stack([s.decision.value for s in ep])[:, None], torch.ones_like(r, dtype=torch.bool),
                        self.ppo.gamma, self.ppo.gae_lambda)
            adv.append(a[:, 0])
            ret.append(rt[:, 0])
        self.episodes = []
        obs, mask, act, logp = (torch.stack(x) for x in list(zip(*decisions))[:4])

        def evaluate(idx):
            dist, value = self.net(obs[idx], mask[idx])
            return dist.log_prob(act[idx]), dist.entropy(), value
        ppo_update(self.net, self.opt, evaluate, logp, torch.cat(adv), torch.cat(ret), self.ppo, self.gen)
        self.updates += 1
