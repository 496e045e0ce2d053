"""Woodpecker-DL's system-level exploration: per fused subgraph, our tuned kernel or the vendor's.

The vendor path is the one the fastest CPU runtimes take (torch.compile's freezing, ONNX Runtime's
NCHWc fusions): in the model's NHWC graph (``graph.optimise``) every convolution chain
``conv2d (+bias) (+residual add) (+ReLU / clip / GELU ...)`` and every dense chain
``matmul (+bias) (+activation | +residual add)`` with a constant weight can become ONE oneDNN call,
``torch.ops.mkldnn._convolution_pointwise`` or ``_linear_pointwise`` (their ``.binary`` forms for
the residual), whose weight is reordered to oneDNN's blocked layout once (at the first call,
cached by the weight's content and the call's attributes) instead of on every call.  A batched
matmul of two activations (attention's ``q @ k^T`` and ``p @ v``) can become one ``torch.matmul``,
attention's softmax and a layer norm one PyTorch call each.

* ``calls``: the library's kernels as packed functions, registered on import;
* ``op``: ``LibraryOp``, one chain's signature, and its call's time;
* ``patterns``: ``find_ops``, the fusable chains of the NHWC graph with call counts;
* ``lowering``: ``offload`` rewrites the chosen chains into
  ``R.call_pure_packed("adaptune.onednn.*", ...)``;
* ``choice``: ``plan``, per signature, the fused library call (and Winograd, ``winograd.py``, with
  its GEMMs on oneDNN or generated) timed against the best tuned kernel of the same subgraph (its
  task in the tuning database); a call that fails for its shape or attributes falls back to the
  generated kernel with one warning.

``compile.build_best`` then times the whole model built several ways and keeps the fastest (the
choice is checked on the whole model, not only per kernel).
"""
from .calls import CONV, onednn_conv2d, onednn_conv2d_add, onednn_linear, onednn_linear_add
from .choice import (LIBRARY_IMPLS, Choice, chosen, eligible, gemm_tasks, generated_choice, library_time,
                     plan, schedule_epilogues, task_floors)
from .lowering import chain_modules, offload
from .op import LibraryOp, workload_call
from .patterns import find_ops

__all__ = ["CONV", "Choice", "LIBRARY_IMPLS", "LibraryOp", "chain_modules", "chosen", "eligible", "find_ops",
           "gemm_tasks", "generated_choice", "library_time",
           "offload", "onednn_conv2d", "onednn_conv2d_add", "onednn_linear", "onednn_linear_add", "plan",
           "schedule_epilogues", "task_floors", "workload_call"]
