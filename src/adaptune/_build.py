"""The builder workers' build functions, in a module that imports nothing heavy.

MetaSchedule's ``default_build`` runs ``import tvm.s_tir.tensor_intrin``, which costs 10-25 s in
every fresh builder worker (under load the stock builder then times out on every candidate);
CPU float kernels use no tensor intrinsics.  Workers unpickle this function by reference, so
this module must stay light: it is imported in each of them.
"""


def fast_build(mod, target, _params):
    import tvm
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    return tvm.build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target)


def build_export(mod, target) -> str:
    """Build ``mod`` and export it to a temporary tar file for the runner; returns its path
    (MetaSchedule's ``_worker_func`` with ``fast_build`` and its ``default_export``)."""
    import os
    import tempfile

    from tvm.support.tar import tar

    path = os.path.join(tempfile.mkdtemp(), "tvm_tmp_mod." + tar.output_format)
    fast_build(mod, target, None).export_library(path, fcompile=tar)
    return path
