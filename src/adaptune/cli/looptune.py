"""``adaptune looptune M N K``: schedule one matmul's loop nest with LoopTune's trained policy
(default: no search, no measurement while choosing) or with one of its classic searches."""
from __future__ import annotations

from pathlib import Path

from .common import UsageError, fail, positive_int


def add_parser(sub) -> None:
    from ..looptune.search import SEARCHES
    q = sub.add_parser("looptune", help="schedule a matmul's loop nest with LoopTune's policy or searches")
    for dim in ("M", "N", "K"):
        q.add_argument(dim, type=int, help=f"matmul size {dim} (C[M,N] = A[M,K] @ B[K,N])")
    q.add_argument("--search", choices=list(SEARCHES),
                   help="run this search instead of the trained policy")
    q.add_argument("--policy", help="policy weights (default: the shipped ones)")
    q.add_argument("--time-limit", type=float, default=60.0, help="seconds a search may take (default 60)")
    q.add_argument("--steps", type=positive_int, default=10,
                   help="actions per path of a search (default 10, the paper's episode)")
    q.set_defaults(func=cmd_looptune)


def cmd_looptune(args) -> int:
    from ..looptune.evaluate import Evaluator, versus_numpy
    from ..looptune.nest import LoopNest, matmul
    from ..looptune.search import SEARCHES
    try:
        if min(args.M, args.N, args.K) < 1 or max(args.M, args.N, args.K) > 4096:
            raise UsageError(f"matmul sizes must be 1..4096, got {args.M} {args.N} {args.K}")
        if not args.time_limit > 0:   # also refuses nan
            raise UsageError(f"--time-limit must be positive, got {args.time_limit}")
        policy = None if args.search else _load_policy(args.policy)
    except UsageError as e:
        return fail(str(e))
    con = matmul(args.M, args.N, args.K)
    ev = Evaluator(con)
    start = LoopNest.initial(con)
    base = ev(start)
    if policy is not None:
        choice = policy.schedule(con)
        nest, actions, seconds, how = choice.nest, choice.actions, choice.seconds, "the policy"
    else:
        res = SEARCHES[args.search](start, ev, steps=args.steps, time_limit=args.time_limit)
        nest, actions, seconds, how = res.nest, res.actions, res.seconds, args.search
    gflops, npy = versus_numpy(ev, nest)
    print(nest.render())
    print(f"actions: {' '.join(actions) or '(none)'}")
    print(f"{con.name}: {gflops:.2f} GFLOPS (checked against numpy), untuned nest {base:.2f} GFLOPS, "
          f"speedup {gflops / base:.2f}x; numpy {npy:.2f} GFLOPS ({npy and gflops / npy:.2f}x; each the "
          f"best of 3 timings, alternated)")
    print(f"{how} chose it in {seconds:.3f} s ({ev.evaluations} nests built and timed in all)")
    return 0


def _load_policy(path: str | None):
    from ..looptune.dqn import WEIGHTS, Policy
    path = path or str(WEIGHTS)
    if not Path(path).is_file():
        raise UsageError(f"no policy weights at {path}")
    try:
        return Policy.load(path)
    except Exception as e:  # noqa: BLE001 - torch raises many kinds for a bad file
        raise UsageError(f"cannot load policy weights {path}: {str(e).splitlines()[0][:200]}") from e
