"""LoopTune's policy (§4.2, §5.2): DQN with prioritised experience replay, trained once on the
paper's matmuls, then scheduling a new contraction in milliseconds with no search and no measurement.

The paper found APEX-DQN best and prioritised replay the part that mattered.  This is APEX's
learner in one process, read top to bottom: double DQN with n-step returns (n = 3, as APEX),
proportional prioritised replay (α 0.6, β annealed 0.4 → 1, priorities |TD error|), ε-greedy
exploration decaying to 0.05, a target network synced every ``target_every`` updates.  APEX's many
actors are left out: on 2 cores the measurements, not the actors, are the bottleneck.

Rewards are real measurements (``LoopTuneEnv``: ΔGFLOPS / measured peak), one cached ``Evaluator``
per training contraction, so a nest seen again costs nothing.  The network also sees the fraction
of the episode left: the horizon is fixed (10 actions), so what is worth doing depends on it.

The replay buffer is hand-written: torchrl 0.14's ``PrioritizedReplayBuffer`` needs its compiled
sum tree, which does not load beside torch 2.13 here ("SumSegmentTreeFp32 is not available"), and
with a few ten thousand transitions numpy's cumulative sums sample fast enough.

    # seed 5 of nine runs, kept by --select on validation matmuls: the first teacher of the expert
    # iteration (imitate.py) whose sixth round is the shipped policy.pt
    python -m adaptune.looptune.dqn --episodes 1500 --seed 5 --off-grid 64 --off-grid-range 48 512
"""
from __future__ import annotations

import argparse
import copy
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn

from .env import LoopTuneEnv, observe
from .nest import ACTIONS, FEATURES, MAX_ROWS, Contraction, LoopNest

WEIGHTS = Path(__file__).with_name("policy.pt")
OBS = MAX_ROWS * FEATURES + 1          # the nest's features and the fraction of the episode left
log = logging.getLogger(__name__)


def policy_input(nest: LoopNest, left: float) -> np.ndarray:
    """The environment's observation (log2 counts, up to ~24) scaled to about 0..1, and ``left``."""
    return np.append(observe(nest) / 16.0, np.float32(left))


class QNetwork(nn.Module):
    """Q-values of the ten actions from one observation."""

    def __init__(self, hidden: int = 256):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(OBS, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, len(ACTIONS)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class PrioritizedReplay:
    """Proportional prioritised replay (Schaul et al. 2016): P(i) ∝ p_i^α, importance weights
    (N·P(i))^-β normalised by their maximum; new transitions get the largest priority so far."""

    def __init__(self, capacity: int, alpha: float = 0.6, eps: float = 1e-3, seed: int = 0):
        self.capacity, self.alpha, self.eps = capacity, alpha, eps
        self.obs = np.zeros((capacity, OBS), np.float32)
        self.next_obs = np.zeros((capacity, OBS), np.float32)
        self.action = np.zeros(capacity, np.int64)
        self.reward = np.zeros(capacity, np.float32)       # discounted n-step return
        self.discount = np.zeros(capacity, np.float32)     # γ^n, or 0 where the episode ended
        self.priority = np.zeros(capacity, np.float64)
        self.size = self.pos = 0
        self.rng = np.random.default_rng(seed)

    def add(self, obs, action, reward, next_obs, discount) -> None:
        i = self.pos
        self.obs[i], self.action[i], self.reward[i], self.next_obs[i], self.discount[i] = \
            obs, action, reward, next_obs, discount
        self.priority[i] = self.priority[:self.size].max() if self.size else 1.0
        self.pos, self.size = (i + 1) % self.capacity, min(self.size + 1, self.capacity)

    def sample(self, batch: int, beta: float):
        """(indices, transitions as tensors, importance weights)."""
        p = self.priority[:self.size] ** self.alpha
        p /= p.sum()
        idx = self.rng.choice(self.size, size=batch, p=p)
        w = (self.size * p[idx]) ** -beta
        t = lambda a: torch.as_tensor(a[idx])  # noqa: E731
        return idx, (t(self.obs), t(self.action), t(self.reward), t(self.next_obs), t(self.discount)), \
            torch.as_tensor(w / w.max(), dtype=torch.float32)

    def update(self, idx: np.ndarray, td: np.ndarray) -> None:
        self.priority[idx] = np.abs(td) + self.eps


@dataclass
class Config:
    episodes: int = 600
    steps: int = 10                  # actions per episode (the paper's)
    gamma: float = 0.99              # rewards telescope: γ near 1 values the final nest
    n_step: int = 3
    lr: float = 5e-4
    batch: int = 64
    buffer: int = 50_000
    learning_starts: int = 256       # transitions before the first update
    target_every: int = 200          # updates between target-network syncs
    eps_end: float = 0.05
    eps_decay: float = 0.6           # fraction of the episodes over which ε falls from 1 to eps_end
    beta0: float = 0.4
    hidden: int = 256
    seed: int = 0


@dataclass
class History:
    """Per episode: the contraction, its untuned GFLOPS and the GFLOPS after the last action."""

    rows: list[tuple[str, float, float]] = field(default_factory=list)

    def recent_speedup(self, n: int = 20) -> float:
        tail = self.rows[-n:]
        return float(np.exp(np.mean([np.log(max(g, 1e-9) / max(b, 1e-9)) for _, b, g in tail]))) if tail else 0.0


def train(env: LoopTuneEnv, cfg: Config = Config(), *, on_episode: Callable[[int, History, QNetwork], None] | None = None
          ) -> tuple[QNetwork, History]:
    """Train a Q-network on ``env`` (any contraction mix, any ``gflops`` scorer)."""
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    q = QNetwork(cfg.hidden)
    target = copy.deepcopy(q)
    opt = torch.optim.Adam(q.parameters(), lr=cfg.lr)
    replay = PrioritizedReplay(cfg.buffer, seed=cfg.seed)
    history, updates = History(), 0
    for ep in range(cfg.episodes):
        eps = max(cfg.eps_end, 1.0 - (1.0 - cfg.eps_end) * ep / max(1.0, cfg.eps_decay * cfg.episodes))
        _, info = env.reset(seed=int(rng.integers(2**31)))
        first = info["gflops"]
        traj = [policy_input(env.nest, 1.0)]       # observations o_0 .. o_T
        acts, rews = [], []
        for t in range(cfg.steps):
            if rng.random() < eps:
                a = int(rng.integers(len(ACTIONS)))
            else:
                with torch.no_grad():
                    a = int(q(torch.as_tensor(traj[-1])[None]).argmax())
            _, r, _, _, info = env.step(a)
            acts.append(a)
            rews.append(r)
            traj.append(policy_input(env.nest, 1.0 - (t + 1) / cfg.steps))
            # the n-step transition that starts n-1 actions back is complete now
            s = t + 1 - cfg.n_step
            if s >= 0:
                _add_n_step(replay, traj, acts, rews, s, cfg)
            if replay.size >= cfg.learning_starts:
                beta = cfg.beta0 + (1.0 - cfg.beta0) * ep / cfg.episodes
                _learn(q, target, opt, replay, cfg, beta)
                updates += 1
                if updates % cfg.target_every == 0:
                    target.load_state_dict(q.state_dict())
        for s in range(max(0, cfg.steps - cfg.n_step + 1), cfg.steps):   # the episode's last, shorter returns
            _add_n_step(replay, traj, acts, rews, s, cfg)
        history.rows.append((env.nest.contraction.name, first, info["gflops"]))
        if on_episode:
            on_episode(ep, history, q)
    return q, history


def _add_n_step(replay: PrioritizedReplay, traj, acts, rews, s: int, cfg: Config) -> None:
    """The transition from o_s: up to n discounted rewards, then the bootstrap discount."""
    end = cfg.steps
    n = min(cfg.n_step, end - s)
    ret = sum(cfg.gamma ** i * rews[s + i] for i in range(n))
    discount = 0.0 if s + n >= end else cfg.gamma ** n          # the fixed horizon ends the episode
    replay.add(traj[s], acts[s], ret, traj[s + n], discount)


def _learn(q: QNetwork, target: QNetwork, opt, replay: PrioritizedReplay, cfg: Config, beta: float) -> None:
    """One double-DQN step on a prioritised batch, weighted by importance, priorities refreshed."""
    idx, (obs, act, ret, nxt, disc), w = replay.sample(cfg.batch, beta)
    with torch.no_grad():
        best = q(nxt).argmax(1, keepdim=True)
        y = ret + disc * target(nxt).gather(1, best).squeeze(1)
    pred = q(obs).gather(1, act[:, None]).squeeze(1)
    td = y - pred
    loss = (w * nn.functional.smooth_l1_loss(pred, y, reduction="none")).mean()
    opt.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(q.parameters(), 10.0)
    opt.step()
    replay.update(idx, td.detach().numpy())


@dataclass
class Choice:
    nest: LoopNest
    actions: list[str]
    seconds: float


class QEnsemble(nn.Module):
    """Q-networks of several training runs acting as one, on the mean of their Q-values: a candidate
    for ``--select`` against seed-to-seed spread.  Measured, it scored below its members (mean
    Q-values of different runs give action sequences none of them takes; docs/decisions.md)."""

    def __init__(self, members: Sequence[QNetwork]):
        super().__init__()
        self.members = nn.ModuleList(members)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([q(x) for q in self.members]).mean(0)


class Policy:
    """A trained Q-network (or ensemble) acting greedily: ``steps`` actions from the untuned nest,
    no measurement."""

    def __init__(self, q: nn.Module, steps: int = 10, meta: dict | None = None):
        self.q, self.steps, self.meta = q.eval(), steps, meta or {}

    @classmethod
    def load(cls, path: str | Path = WEIGHTS) -> "Policy":
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        members = []
        for state in ckpt.get("members", [ckpt.get("state_dict")]):
            members.append(QNetwork(ckpt["config"]["hidden"]))
            members[-1].load_state_dict(state)
        return cls(members[0] if "members" not in ckpt else QEnsemble(members), ckpt["config"]["steps"], ckpt)

    def save(self, path: str | Path, cfg: Config, **meta) -> None:
        tmp = Path(f"{path}.tmp")
        weights = ({"members": [q.state_dict() for q in self.q.members]} if isinstance(self.q, QEnsemble)
                   else {"state_dict": self.q.state_dict()})
        torch.save({**weights, "config": asdict(cfg), **meta}, tmp)
        tmp.replace(path)                      # never a half-written weights file

    @classmethod
    def ensemble(cls, paths: Sequence[str | Path]) -> "Policy":
        """One policy from several weight files (same network size and episode length), with what
        they were trained on merged: the pools' union, episodes and measurements summed."""
        runs = [cls.load(p) for p in paths]
        meta = {"pool": sorted({c for r in runs for c in r.meta.get("pool", [])}),
                "ensemble_of": [str(p) for p in paths]}
        for key in ("episodes", "nests_measured", "seconds"):
            meta[key] = sum(r.meta.get(key, 0) for r in runs)
        return cls(QEnsemble([q for r in runs for q in getattr(r.q, "members", [r.q])]), runs[0].steps,
                   {**runs[0].meta, **meta})

    def schedule(self, contraction: Contraction) -> Choice:
        t0 = time.perf_counter()
        nest, actions = LoopNest.initial(contraction), []
        with torch.no_grad():
            for t in range(self.steps):
                a = int(self.q(torch.as_tensor(policy_input(nest, 1.0 - t / self.steps))[None]).argmax())
                nest = nest.apply(a)
                actions.append(ACTIONS[a])
        return Choice(nest, actions, time.perf_counter() - t0)


def select(policies: dict[str, Policy], contractions: Sequence[Contraction], rounds: int = 2
           ) -> dict[str, float]:
    """Each policy's score on ``contractions`` (a validation set): the geometric mean of its nests'
    GFLOPS over numpy's, the policies and numpy timed in alternation, the best of ``rounds`` each.
    DQN's results vary from seed to seed, so the shipped weights are the best of several runs here,
    never picked on the test matmuls."""
    from .evaluate import Evaluator, numpy_gflops
    logs = {w: [] for w in policies}
    for con in contractions:
        nests = {w: p.schedule(con).nest for w, p in policies.items()}
        best, npy = dict.fromkeys(policies, 0.0), 0.0
        for _ in range(rounds):
            for w, nest in nests.items():
                best[w] = max(best[w], Evaluator(con)(nest))
            npy = max(npy, numpy_gflops(con))
        for w in policies:
            logs[w].append(np.log(max(best[w], 1e-9) / npy))
        log.info("%s: numpy %.0f GFLOPS, %s", con.name, npy, ", ".join(f"{best[w] / npy:.2f}x" for w in policies))
    return {w: float(np.exp(np.mean(v))) for w, v in logs.items()}


def main(argv: Sequence[str] | None = None) -> int:
    """Reproduce the shipped policy: train on the paper's matmuls (held-out split excluded) with
    real measurements, saving the weights as it goes."""
    from .dataset import training_pool
    from .evaluate import peak_gflops
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--episodes", type=int, default=Config.episodes)
    ap.add_argument("--pool", type=int, default=128,
                    help="training matmuls drawn from the training split (fewer: more cache hits)")
    ap.add_argument("--off-grid", type=int, default=0,
                    help="also train on this many matmuls of random sizes off the grid")
    ap.add_argument("--off-grid-range", type=int, nargs=2, default=(64, 256), metavar=("LO", "HI"),
                    help="the sizes --off-grid draws from (default: the grid's range, 64 256)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(WEIGHTS))
    ap.add_argument("--select", nargs="+", metavar="WEIGHTS",
                    help="train nothing: score these weights on the validation set (training-split grid "
                         "matmuls outside every pool, and off-grid sizes) and copy the best to --out")
    ap.add_argument("--ensemble", nargs="+", metavar="WEIGHTS",
                    help="train nothing: write one policy acting on the mean Q-values of these to --out")
    ap.add_argument("--validation", type=int, default=16, help="--select: grid and off-grid matmuls, this many each")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.select:
        return _select(args.select, Path(args.out), count=args.validation)
    if args.ensemble:
        policy = Policy.ensemble(args.ensemble)
        cfg = Config(**policy.meta["config"])
        policy.save(args.out, cfg, **{k: v for k, v in policy.meta.items() if k not in ("config", "state_dict", "members")})
        log.info("wrote %s: the mean Q-values of %d networks", args.out, len(policy.q.members))
        return 0
    torch.set_num_threads(1)       # a small network; keep torch's threads from spinning beside TVM's timed runs
    cfg = Config(episodes=args.episodes, seed=args.seed)
    pool = training_pool(args.pool, args.off_grid, args.seed, *args.off_grid_range)
    peak = peak_gflops()
    # quicker timing than the benchmark's: training measures thousands of states
    env = LoopTuneEnv(pool, steps=cfg.steps, peak=peak, timing={"warmup": 1, "repeat": 3, "min_repeat_ms": 1})
    t0 = time.perf_counter()

    def report(ep: int, hist: History, q: QNetwork) -> None:
        built = sum(e.evaluations for e in env.evaluators.values())
        if (ep + 1) % 20 == 0:
            log.info("episode %d/%d: last-20 speedup over untuned %.2fx, %d nests measured, %.0f s",
                     ep + 1, cfg.episodes, hist.recent_speedup(), built, time.perf_counter() - t0)
        if (ep + 1) % 100 == 0 or ep + 1 == cfg.episodes:     # a killed run keeps what it learned
            Policy(q, cfg.steps).save(args.out, cfg, peak_gflops=peak, pool=[c.name for c in pool],
                                      episodes=ep + 1, seconds=time.perf_counter() - t0, nests_measured=built,
                                      last50_speedup=hist.recent_speedup(50))

    train(env, cfg, on_episode=report)
    log.info("wrote %s", args.out)
    return 0


def _select(weights: Sequence[str], out: Path, seed: int = 1000, count: int = 16) -> int:
    """``--select``: validation = ``count`` grid matmuls of the training split that no candidate
    trained on, and ``count`` off-grid sizes in 32..512, wider than the grid's range as users' sizes
    are (seeded apart from training's draws)."""
    from .dataset import off_grid, split
    torch.set_num_threads(1)
    policies = {str(w): Policy.load(w) for w in weights}
    trained_on = {name for p in policies.values() for name in p.meta.get("pool", [])}
    grid = [c for c in split()[0] if c.name not in trained_on]
    grid = [grid[i] for i in np.random.default_rng(seed).permutation(len(grid))[:count]]
    scores = select(policies, grid + off_grid(count, seed, 32, 512))
    for w, v in sorted(scores.items(), key=lambda kv: -kv[1]):
        log.info("%s: %.3fx numpy (geomean over %d validation matmuls)", w, v, 2 * count)
    best = max(scores, key=scores.get)
    if Path(best).resolve() != out.resolve():
        tmp = Path(f"{out}.tmp")
        tmp.write_bytes(Path(best).read_bytes())
        tmp.replace(out)
    log.info("kept %s as %s", best, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
