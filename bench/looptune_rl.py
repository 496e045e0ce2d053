"""LoopTune's algorithm comparison (the paper's Fig. 7): Ray RLlib's PPO, DQN, APPO and IMPALA beside
adaptune's DQN with prioritised replay, all on the same Gymnasium environment (``LoopTuneEnv``: real
measurements of the generated code, reward = change in GFLOPS over the measured peak), the same
training matmuls and the same number of environment steps.  RLlib's environment runners measure in
parallel, one core each (``TVM_NUM_THREADS=1`` everywhere, ours too, so rewards are comparable).
Prints and plots the mean episode return against environment steps; the same script runs on a Ray
cluster with ``--address`` (the runners then measure on its machines).

    pip install -e ".[rllib]"                       # ray[rllib] 2.60 (it needs gymnasium 1.2)
    python bench/looptune_rl.py                     # 3000 steps each, 2 runners, 16 training matmuls
    python bench/looptune_rl.py --algos PPO ours --steps 1000

Writes OUT/curves.json and OUT/curves.png.
"""
from __future__ import annotations

import os

os.environ.setdefault("TVM_NUM_THREADS", "1")       # before TVM starts its pool, here and in the runners

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from adaptune.looptune.dataset import split  # noqa: E402
from adaptune.looptune.env import LoopTuneEnv  # noqa: E402

RLLIB = ("PPO", "DQN", "APPO", "IMPALA")
TIMING = {"warmup": 1, "repeat": 3, "min_repeat_ms": 1}      # as the shipped policy's training


def training_matmuls(count: int, seed: int = 0):
    train, _ = split()
    return [train[i] for i in np.random.default_rng(seed).permutation(len(train))[:count]]


class Env(LoopTuneEnv):
    """``LoopTuneEnv`` built from RLlib's ``env_config``: the training matmuls and the peak."""

    def __init__(self, config):
        super().__init__(training_matmuls(config["matmuls"], config["seed"]), peak=config["peak"], timing=TIMING)


def rllib_config(name: str, env_config: dict, runners: int, steps: int, seed: int):
    """The algorithm's RLlib config: defaults, except batch sizes scaled to a few thousand steps and,
    for DQN, the paper's pieces (prioritised replay, 3-step double DQN, ε 1 -> 0.05)."""
    if name == "PPO":
        from ray.rllib.algorithms.ppo import PPOConfig
        cfg = PPOConfig().training(train_batch_size_per_learner=200, minibatch_size=50, num_epochs=8, lr=3e-4)
    elif name == "DQN":
        from ray.rllib.algorithms.dqn import DQNConfig
        cfg = DQNConfig().training(
            replay_buffer_config={"type": "PrioritizedEpisodeReplayBuffer", "capacity": 50_000,
                                  "alpha": 0.6, "beta": 0.4},
            n_step=3, double_q=True, lr=5e-4, train_batch_size_per_learner=64,
            num_steps_sampled_before_learning_starts=256, target_network_update_freq=200,
            epsilon=[[0, 1.0], [int(0.6 * steps), 0.05]])
    elif name == "APPO":
        from ray.rllib.algorithms.appo import APPOConfig
        cfg = APPOConfig().training(train_batch_size_per_learner=100, lr=3e-4)
    elif name == "IMPALA":
        from ray.rllib.algorithms.impala import IMPALAConfig
        cfg = IMPALAConfig().training(train_batch_size_per_learner=100, lr=3e-4)
    else:
        raise ValueError(f"unknown algorithm {name}")
    return (cfg.environment(Env, env_config=env_config)
            .env_runners(num_env_runners=runners, num_envs_per_env_runner=1, rollout_fragment_length=10)
            .reporting(min_sample_timesteps_per_iteration=100)     # a point on the curve every ~100 steps
            .debugging(seed=seed))


def _metric(result: dict, key: str):
    runners = result.get("env_runners", {})
    return runners.get(key, result.get(key))


def run_rllib(name, env_config, runners, steps, seed, minutes) -> list[tuple[int, float, float]]:
    """(env steps, mean episode return, wall s) after each training iteration."""
    algo = rllib_config(name, env_config, runners, steps, seed).build_algo()
    curve, t0 = [], time.perf_counter()
    try:
        while True:
            result = algo.train()
            done = int(_metric(result, "num_env_steps_sampled_lifetime") or 0)
            ret = _metric(result, "episode_return_mean")
            if ret is not None and np.isfinite(ret):
                curve.append((done, float(ret), time.perf_counter() - t0))
                print(f"  {name}: {done} steps, mean return {ret:.4f}, {curve[-1][2]:.0f} s", flush=True)
            if done >= steps or time.perf_counter() - t0 > 60 * minutes:
                break
    finally:
        algo.stop()
    return curve


def run_ours(env_config, steps, seed, minutes) -> list[tuple[int, float, float]]:
    """adaptune's DQN (``adaptune.looptune.dqn``) on the same environment, one process."""
    from adaptune.looptune.dqn import Config, train
    env = Env(env_config)
    cfg = Config(episodes=steps // env.steps, seed=seed)
    curve, t0 = [], time.perf_counter()

    class Stop(Exception):
        pass

    def on_episode(ep, hist, q):
        if (ep + 1) % 10 == 0:
            ret = float(np.mean([(g - b) / env.peak for _, b, g in hist.rows[-20:]]))
            curve.append(((ep + 1) * env.steps, ret, time.perf_counter() - t0))
            print(f"  ours: {curve[-1][0]} steps, mean return {ret:.4f}, {curve[-1][2]:.0f} s", flush=True)
        if time.perf_counter() - t0 > 60 * minutes:
            raise Stop

    try:
        train(env, cfg, on_episode=on_episode)
    except Stop:
        pass
    return curve


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--algos", nargs="+", default=[*RLLIB, "ours"], choices=[*RLLIB, "ours"])
    ap.add_argument("--steps", type=int, default=3000, help="environment steps per algorithm")
    ap.add_argument("--minutes", type=float, default=12.0, help="wall-time cap per algorithm")
    ap.add_argument("--runners", type=int, default=2, help="RLlib environment runners (parallel measurements)")
    ap.add_argument("--matmuls", type=int, default=16, help="training matmuls (of the paper's training split)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--address", default=None, help="a Ray cluster's address (default: a local one)")
    ap.add_argument("--out", default="bench/out/looptune_rl")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from adaptune.looptune.evaluate import peak_gflops
    env_config = {"matmuls": args.matmuls, "seed": args.seed, "peak": peak_gflops()}
    curves = {}
    if any(a in RLLIB for a in args.algos):
        try:
            import ray
        except ImportError:
            print("looptune_rl.py: error: Ray RLlib is not installed (pip install -e '.[rllib]')", file=sys.stderr)
            return 2
        ray.init(address=args.address, num_cpus=None if args.address else args.runners + 1,
                 include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"TVM_NUM_THREADS": os.environ["TVM_NUM_THREADS"]}})
    for name in args.algos:
        print(f"{name}: {args.steps} steps", flush=True)
        if name == "ours":
            curves[name] = run_ours(env_config, args.steps, args.seed, args.minutes)
        else:
            curves[name] = run_rllib(name, env_config, args.runners, args.steps, args.seed, args.minutes)
        (out / "curves.json").write_text(json.dumps({"env_config": env_config, "curves": curves}))
    plot(curves, out / "curves.png", env_config)
    print(f"\n{'algorithm':10s} {'steps':>6s} {'final return':>12s} {'best return':>12s} {'wall s':>7s}")
    for name, c in curves.items():
        if c:
            print(f"{name:10s} {c[-1][0]:6d} {c[-1][1]:12.4f} {max(r for _, r, _ in c):12.4f} {c[-1][2]:7.0f}")
        else:
            print(f"{name:10s} no finished episode")
    print(f"plot: {out / 'curves.png'}")
    return 0


def plot(curves, path: Path, env_config) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, c in curves.items():
        if c:
            ax.plot([s for s, _, _ in c], [r for _, r, _ in c], label=name)
    ax.set_xlabel("environment steps (measured nests)")
    ax.set_ylabel("mean episode return (GFLOPS gained / peak)")
    ax.set_title(f"LoopTune algorithms, {env_config['matmuls']} training matmuls")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
