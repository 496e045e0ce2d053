"""Search strategies, one per file, registered by name."""
from .base import STRATEGIES, Strategy, make_strategy, register
from . import chameleon, ga, random, rl_direct, sa  # noqa: F401  (registration)

__all__ = ["STRATEGIES", "Strategy", "make_strategy", "register"]
