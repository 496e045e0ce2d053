"""The builder workers' build function, in a module that imports nothing heavy.

MetaSchedule's ``default_build`` runs ``import tvm.s_tir.tensor_intrin``, which costs 10-25 s in
every fresh builder worker (under load the stock builder then times out on every candidate);
CPU float kernels use no tensor intrinsics.  Workers unpickle this function by reference, so
this module must stay light: it is imported in each of them.
"""


def fast_build(mod, target, _params):
    import tvm
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    return tvm.build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target)
