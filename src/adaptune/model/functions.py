"""A rewrite applied to every Relax function of a module, PrimFuncs left as they are: the graph
passes, the x86 kernel rewrites and the constant folds all work one Relax function at a time."""
from __future__ import annotations

import tvm
from tvm import relax


def each_function(mod, rewrite) -> "tvm.IRModule":
    """``mod`` with ``rewrite(function) -> function`` applied to each of its Relax functions."""
    return tvm.IRModule({gv: rewrite(f) if isinstance(f, relax.Function) else f for gv, f in mod.functions_items()},
                        attrs=mod.attrs)


def mutate_each(mod, mutator_class) -> "tvm.IRModule":
    """``mod`` with ``mutator_class(mod)``'s rewrite (a Relax ``PyExprMutator``) applied to each Relax
    function, dead bindings removed."""
    mutator = mutator_class(mod)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gv, mutator.visit_expr(func))
    return relax.transform.DeadCodeElimination()(mutator.builder_.get())
