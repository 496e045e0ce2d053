"""Search strategies, registered by name: Chameleon's explorer x sampler variants, random
search and Woodpecker-DL's genetic and measurement-driven RL searches."""
from .base import STRATEGIES, Strategy, make_strategy, register
from . import chameleon
from . import ga
from . import random
from . import rl_direct  # noqa: F401  (registration)

__all__ = ["STRATEGIES", "Strategy", "make_strategy", "register"]
