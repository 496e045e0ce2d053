"""Distilling search into the policy: expert iteration for LoopTune.

DQN's policy is trained on rewards alone, and its results swing from seed to seed; the searches
(§4) find better nests but spend seconds per contraction.  Here the searches become the teacher,
as in expert iteration (Anthony et al. 2017): for each training contraction a search and the
current policy propose action paths, the faster nest's path is kept as a demonstration, and the
network learns to take the demonstrated action from every state along it (behaviour cloning; the
ten outputs trained as logits, so ``Policy`` acts on them unchanged).  Scheduling stays a forward
pass per action: the search's time is paid once, offline.

A demonstration shorter than the episode is padded with ``up``: moving the cursor never changes
what the nest computes, so the padded path ends on the search's nest.

    # three rounds from DQN's seed 5 (dqn.py), 16-27 min of search each here
    python -m adaptune.looptune.imitate demos --out round1.jsonl --pool 96 --off-grid 64 --seed 7 --teacher seed5.pt
    python -m adaptune.looptune.imitate train --demos round1.jsonl --init seed5.pt --out r1.pt
    python -m adaptune.looptune.imitate demos --out round2.jsonl --pool 64 --off-grid 96 --seed 8 --teacher r1.pt
    python -m adaptune.looptune.imitate train --demos round1.jsonl round2.jsonl --init r1.pt --out r2.pt
    python -m adaptune.looptune.imitate demos --out round3.jsonl --pool 32 --off-grid 64 --seed 9 --teacher r2.pt
    python -m adaptune.looptune.imitate train --demos round1.jsonl round2.jsonl round3.jsonl --init r2.pt --out r3.pt
    # then each round cloned all demonstrations so far from scratch, every path also replayed on 4
    # sizes near its own (--augment); rounds 5 and 6 off the grid only, searched by beam BFS
    python -m adaptune.looptune.imitate demos --out round4.jsonl --pool 16 --off-grid 96 --seed 10 --teacher r3.pt
    python -m adaptune.looptune.imitate train --demos round[1-4].jsonl --augment 4 --out r4.pt
    python -m adaptune.looptune.imitate demos --out round5.jsonl --pool 0 --off-grid 48 --seed 11 --search beam-bfs2 --teacher r4.pt
    python -m adaptune.looptune.imitate train --demos round[1-5].jsonl --augment 4 --out r5.pt
    python -m adaptune.looptune.imitate demos --out round6.jsonl --pool 0 --off-grid 64 --seed 12 --search beam-bfs2 --teacher r5.pt
    python -m adaptune.looptune.imitate train --demos round[1-6].jsonl --augment 4 --out policy.pt    # shipped

The demonstrations of those rounds are in ``demos/`` (rounds 3-6 measured on the back end that
pads every tail and with TVM's workers spinning; 5 and 6 with each thread padding once); training
from them is deterministic.
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import nn

from .dqn import WEIGHTS, Config, Policy, QNetwork, policy_input
from .evaluate import Evaluator
from .nest import ACTIONS, Contraction, LoopNest, matmul
from .search import SEARCHES

log = logging.getLogger(__name__)
PAD = "up"


def demonstrate(con: Contraction, teacher: Policy | None, *, search: str = "beam-dfs2",
                time_limit: float = 10.0, steps: int = 10, timing: dict | None = None) -> dict:
    """The best path of ``search`` and ``teacher``'s path on ``con``, whichever nest measured faster,
    padded to ``steps`` actions: {"sizes", "actions", "gflops", "source", "measured"} (nests built)."""
    ev = Evaluator(con, **(timing or {}))
    found = SEARCHES[search](LoopNest.initial(con), ev, steps=steps, time_limit=time_limit)
    best = (found.gflops, found.actions, search)
    if teacher is not None:
        choice = teacher.schedule(con)
        value = ev(choice.nest)
        if value > best[0]:
            best = (value, choice.actions, "policy")
    gflops, actions, source = best
    return {"sizes": [n for _, n in con.sizes], "actions": list(actions) + [PAD] * (steps - len(actions)),
            "gflops": gflops, "source": source, "measured": ev.evaluations}


def samples(demos: Sequence[dict], steps: int = 10, *, augment: int = 0, scale: tuple[float, float] = (0.6, 1.6),
            seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(observations, demonstrated actions) at every state along the demonstrations, each path also
    replayed, unmeasured, on ``augment`` sizes near its own (each dimension scaled by a factor drawn
    from ``scale``, kept in 32..512): a path that is good at one size is good near it, and the network
    that sees only the measured sizes learns their exact features instead (off the grid it chose
    1-row register tiles)."""
    rng = np.random.default_rng(seed)
    obs, acts = [], []
    for d in demos:
        near = [[int(np.clip(round(n * rng.uniform(*scale)), 32, 512)) for n in d["sizes"]] for _ in range(augment)]
        for sizes in [d["sizes"], *near]:
            nest = LoopNest.initial(matmul(*sizes))
            for t, a in enumerate(d["actions"][:steps]):
                obs.append(policy_input(nest, 1.0 - t / steps))
                acts.append(ACTIONS.index(a))
                nest = nest.apply(a)
    return torch.as_tensor(np.stack(obs)), torch.as_tensor(acts)


def clone(demos: Sequence[dict], *, init: QNetwork | None = None, hidden: int = 256, epochs: int = 300,
          lr: float = 1e-3, weight_decay: float = 1e-4, seed: int = 0, augment: int = 0) -> QNetwork:
    """A network whose argmax takes the demonstrated action (cross-entropy, full batch, Adam);
    ``init`` starts it from trained weights instead of random ones."""
    torch.manual_seed(seed)
    q = QNetwork(hidden)
    if init is not None:
        q.load_state_dict(init.state_dict())
    x, y = samples(demos, augment=augment, seed=seed)
    opt = torch.optim.Adam(q.parameters(), lr=lr, weight_decay=weight_decay)
    for epoch in range(epochs):
        loss = nn.functional.cross_entropy(q(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if (epoch + 1) % 100 == 0:
            with torch.no_grad():
                acc = float((q(x).argmax(1) == y).float().mean())
            log.info("epoch %d: loss %.3f, %.0f%% of demonstrated actions taken", epoch + 1, loss.item(), 100 * acc)
    return q.eval()


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def main(argv: Sequence[str] | None = None) -> int:
    from ..measure.workdir import repair_jsonl
    from .dataset import training_pool
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demos", help="search training contractions; append one demonstration per line to --out")
    d.add_argument("--out", required=True)
    d.add_argument("--pool", type=int, default=96, help="grid matmuls of the training split")
    d.add_argument("--off-grid", type=int, default=48, help="random sizes off the grid")
    d.add_argument("--off-grid-range", type=int, nargs=2, default=(48, 512), metavar=("LO", "HI"))
    d.add_argument("--search", default="beam-dfs2", choices=sorted(SEARCHES))
    d.add_argument("--time-limit", type=float, default=10.0, help="seconds of search per contraction")
    d.add_argument("--teacher", default=str(WEIGHTS), help="policy whose path competes with the search's ('' for none)")
    d.add_argument("--seed", type=int, default=7)
    t = sub.add_parser("train", help="clone the demonstrations into a policy")
    t.add_argument("--demos", nargs="+", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--init", default="", help="start from these weights (default: random)")
    t.add_argument("--epochs", type=int, default=300)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--augment", type=int, default=0, help="also replay each path on this many sizes near its own")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)
    if args.cmd == "demos":
        pool = training_pool(args.pool, args.off_grid, args.seed, *args.off_grid_range)
        out = Path(args.out)
        repair_jsonl(out)                                        # a run killed mid-write loses one line
        done = {tuple(r["sizes"]) for r in _read(out)}          # resumable: a line per finished contraction
        try:
            teacher = Policy.load(args.teacher) if args.teacher else None
        except (OSError, RuntimeError, KeyError) as e:
            ap.error(f"cannot load --teacher weights {args.teacher}: {e}")
        t0 = time.perf_counter()
        for i, con in enumerate(pool):
            if tuple(n for _, n in con.sizes) in done:
                continue
            rec = demonstrate(con, teacher, search=args.search, time_limit=args.time_limit,
                              timing={"warmup": 1, "repeat": 3, "min_repeat_ms": 1})
            with out.open("a") as f:
                f.write(json.dumps(rec) + "\n")
            log.info("%d/%d %s: %.1f GFLOPS from %s, %.0f s", i + 1, len(pool), con.name, rec["gflops"],
                     rec["source"], time.perf_counter() - t0)
        return 0
    try:
        demos = [r for p in args.demos for r in _read(Path(p))]
        for r in demos:
            for a in r["actions"]:
                ACTIONS.index(a)
        init = Policy.load(args.init) if args.init else None
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
        ap.error(f"cannot read demonstrations or --init weights: {e}")
    if not demos:
        ap.error(f"no demonstrations in {' '.join(args.demos)}")
    q = clone(demos, init=init.q if init else None, epochs=args.epochs, seed=args.seed, augment=args.augment)
    cfg = Config(seed=args.seed)
    # what the weights learned from: the initial network's training, then the demonstrations
    prior = init.meta if init else {}
    pool = sorted(set(prior.get("pool", [])) | {matmul(*r["sizes"]).name for r in demos})
    Policy(q, cfg.steps).save(args.out, cfg, pool=pool, demonstrations=len(demos), init=args.init, augment=args.augment,
                              episodes=prior.get("episodes", 0),
                              nests_measured=prior.get("nests_measured", 0) + sum(r.get("measured", 0) for r in demos))
    log.info("wrote %s from %d demonstrations", args.out, len(demos))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
