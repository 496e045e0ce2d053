"""``adaptune looptune M N K``: schedule one matmul's loop nest with a LoopTune search."""
from __future__ import annotations

from .cli import UsageError, _fail


def add_parser(sub) -> None:
    from .looptune.search import SEARCHES
    q = sub.add_parser("looptune", help="schedule a matmul's loop nest with LoopTune's searches")
    for dim in ("M", "N", "K"):
        q.add_argument(dim, type=int, help=f"matmul size {dim} (C[M,N] = A[M,K] @ B[K,N])")
    q.add_argument("--search", default="greedy2", choices=list(SEARCHES),
                   help="search to run (default greedy2; a trained policy is not shipped yet)")
    q.add_argument("--time-limit", type=float, default=60.0, help="seconds the search may take (default 60)")
    q.add_argument("--steps", type=int, default=10, help="actions per path (default 10, the paper's episode)")


def cmd_looptune(args) -> int:
    from .looptune.evaluate import Evaluator, numpy_gflops
    from .looptune.nest import LoopNest, matmul
    from .looptune.search import SEARCHES
    try:
        if min(args.M, args.N, args.K) < 1 or max(args.M, args.N, args.K) > 4096:
            raise UsageError(f"matmul sizes must be 1..4096, got {args.M} {args.N} {args.K}")
        if not args.time_limit > 0 or args.steps < 1:   # also refuses nan
            raise UsageError("--time-limit must be positive and --steps at least 1")
    except UsageError as e:
        return _fail(str(e))
    con = matmul(args.M, args.N, args.K)
    ev = Evaluator(con)
    start = LoopNest.initial(con)
    base = ev(start)
    res = SEARCHES[args.search](start, ev, steps=args.steps, time_limit=args.time_limit)
    print(res.nest.render())
    print(f"actions: {' '.join(res.actions) or '(none)'}")
    print(f"{con.name}: {res.gflops:.2f} GFLOPS (checked against numpy), untuned nest {base:.2f} GFLOPS, "
          f"speedup {res.gflops / base:.2f}x; numpy {numpy_gflops(con):.2f} GFLOPS")
    print(f"{args.search} chose it in {res.seconds:.2f} s ({ev.evaluations} nests built and timed)")
    return 0
