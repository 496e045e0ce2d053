"""Constant folding without a compile per call: Relax's ``FoldConstant`` builds every call it folds
with LLVM on its own (ResNet-50: ~55 weight-packing kernels, 3.9 s of each build; BatchNorm folding
and the layout pass's weight arithmetic, most of ``optimise``).  Here the float arithmetic, reshapes
and transposes of constants are computed with numpy (``fold_constants``), and the kernels whose
arguments are all constants, such as the weight packing ``SplitLayoutRewritePreproc`` splits off,
are built as one module and run once each (``fold_calls``).  ``FoldConstant`` then finds next to
nothing left; the result is the module it would give, constants bit for bit."""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from .functions import mutate_each

_FOLD = {"relax.sqrt": np.sqrt, "relax.negative": np.negative, "relax.add": np.add, "relax.subtract": np.subtract,
         "relax.multiply": np.multiply, "relax.divide": np.divide}      # numpy's float ops are IEEE's, as TVM's


@relax.expr_functor.mutator
class _NumpyFold(relax.PyExprMutator):
    """Float arithmetic, reshapes and transposes of constants, computed with numpy."""

    def _constant(self, expr):
        if isinstance(expr, relax.Var):
            expr = self.lookup_binding(expr)
        if not isinstance(expr, tvm.ir.expr.Constant):
            return None
        value = expr.value                          # a 0-d constant's value is a Python scalar
        return value.numpy() if hasattr(value, "numpy") else np.asarray(value, dtype=str(expr.ty.dtype))

    def visit_call_(self, op):
        call = self.visit_expr_post_order(op)
        name = getattr(call.op, "name", None)
        if name not in _FOLD and name not in ("relax.reshape", "relax.permute_dims"):
            return call
        data = self._constant(call.args[0])
        if data is None or not str(data.dtype).startswith("float") or str(call.ty.dtype) != str(data.dtype):
            return call
        if name == "relax.reshape":
            return relax.const(data.reshape([int(d) for d in call.ty.shape]))
        if name == "relax.permute_dims":
            axes = None if call.attrs.axes is None else [int(a) for a in call.attrs.axes]
            return relax.const(np.ascontiguousarray(data.transpose(axes)))
        args = [data] + [self._constant(a) for a in call.args[1:]]
        if any(a is None or a.dtype != data.dtype for a in args):
            return call
        return relax.const(np.asarray(_FOLD[name](*args), dtype=data.dtype))


def fold_constants(mod) -> "tvm.IRModule":
    """Relax's ``FoldConstant``, with the float arithmetic, reshapes and transposes of constants
    (BatchNorm folding's, the layout pass's weight transposes) computed with numpy first."""
    return relax.transform.FoldConstant()(mutate_each(mod, _NumpyFold))


def _inputs(call) -> list:
    """A ``call_tir``'s input arguments."""
    return list(call.args[1].fields) if isinstance(call.args[1], relax.Tuple) else [call.args[1]]


def _outputs(call) -> list:
    """A ``call_tir``'s output tensor types (one, or a tuple's fields)."""
    return list(call.ty.fields) if hasattr(call.ty, "fields") else [call.ty]


def _constant_calls(mod) -> list:
    """The ``call_tir`` calls of ``mod``'s Relax functions whose arguments are all tensor constants
    and whose outputs have static shapes."""
    calls = []
    for func in mod.functions.values():
        if not isinstance(func, relax.Function):
            continue
        for block in func.body.blocks:
            for binding in block.bindings:
                call = binding.value
                if not (isinstance(call, relax.Call) and getattr(call.op, "name", None) == "relax.call_tir"
                        and len(call.args) == 2):           # no symbolic-shape third argument
                    continue
                if all(isinstance(a, tvm.ir.expr.Constant) for a in _inputs(call)) and all(
                        all(isinstance(d, tvm.tirx.IntImm) for d in o.shape) for o in _outputs(call)):
                    calls.append(call)
    return calls


def fold_calls(mod) -> "tvm.IRModule":
    """``mod`` with every ``call_tir`` on constants replaced by its result: the kernels are built as
    one LLVM module (for the host, as ``FoldConstant`` builds them) and each call runs once."""
    calls = _constant_calls(mod)
    if not calls:
        return mod
    names = sorted({c.args[0].name_hint for c in calls})
    try:
        kernels = tvm.tirx.build(tvm.IRModule({n: mod[n].with_attr("global_symbol", n) for n in names}),
                                 target="llvm")
    except (tvm.error.InternalError, RuntimeError, ValueError, TypeError):
        return mod                      # a kernel the host cannot build (a GPU one): FoldConstant decides
    results = {}
    for call in calls:
        outs = [tvm.runtime.empty([int(d) for d in o.shape], o.dtype, tvm.cpu()) for o in _outputs(call)]
        kernels[call.args[0].name_hint](*[a.value for a in _inputs(call)], *outs)
        consts = [relax.const(o.numpy()) for o in outs]
        results[call] = relax.Tuple(consts) if hasattr(call.ty, "fields") else consts[0]

    @relax.expr_functor.mutator
    class _Results(relax.PyExprMutator):
        def visit_call_(self, op):
            folded = results.get(op)
            return self.visit_expr_post_order(op) if folded is None else folded
    return mutate_each(mod, _Results)
