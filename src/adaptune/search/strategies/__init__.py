"""Search strategies, one per file, registered by name."""
from .base import STRATEGIES, Strategy, make_strategy, register
from . import chameleon
from . import ga
from . import random
from . import rl_direct
from . import sa  # noqa: F401  (registration)

__all__ = ["STRATEGIES", "Strategy", "make_strategy", "register"]
