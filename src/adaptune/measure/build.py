"""The builder workers' build functions, in a module that imports nothing heavy.

MetaSchedule's ``default_build`` runs ``import tvm.s_tir.tensor_intrin``, which costs 10-25 s in
every fresh builder worker (under load the stock builder then times out on every candidate);
CPU float kernels use no tensor intrinsics.  Workers unpickle this function by reference, so
this module must stay light: it is imported in each of them.
"""


def fast_build(mod, target, _params):
    import tvm
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    from .pipeline import NAME      # registers adaptune's TIR pipeline in this worker

    return tvm.build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target, pipeline=NAME)


def build_export(mod, target, linked: bool = False) -> str:
    """Build ``mod`` and export it to a temporary file for the runner; returns its path.

    By default a tar of object files (MetaSchedule's ``_worker_func`` with ``fast_build`` and its
    ``default_export``): a remote device links it itself.  ``linked=True`` (local runs) links a
    shared library here instead: the runner would link the tar anyway, one candidate at a time,
    and the numerics check would link it a second time; here the builders link in parallel."""
    import os
    import tempfile

    from tvm.support.tar import tar

    path = os.path.join(tempfile.mkdtemp(), "tvm_tmp_mod." + ("so" if linked else tar.output_format))
    fast_build(mod, target, None).export_library(path, fcompile=None if linked else tar)   # None: TVM links
    return path
