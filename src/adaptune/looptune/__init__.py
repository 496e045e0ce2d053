"""LoopTune (looptune.txt): scheduling a tensor contraction's loop nest by actions on a cursor.

``nest`` is the loop nest and its actions and features, ``evaluate`` builds and times nests with
TVM, ``env`` is the Gymnasium environment, ``search`` the paper's classic searches, ``dqn`` the
trained policy (DQN with prioritised replay) and how it is trained.
"""
from .nest import ACTIONS, Contraction, LoopNest, conv2d, matmul

__all__ = ["ACTIONS", "Contraction", "LoopNest", "conv2d", "matmul"]
