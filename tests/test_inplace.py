"""Residual adds written in place (``model.inplace``): only where the residual dies with the call and
the kernel reads each residual element where it writes the same output element."""
from __future__ import annotations

import pytest
import tvm

from adaptune._tvm import ms
from adaptune.model import compile as C
from adaptune.model.frontends import load_model
from adaptune.model.graph import fuse, optimise
from adaptune.model.inplace import _elementwise_aligned, inplace_residuals


def _scheduled(fused, target):
    """``fused`` with each kernel replaced by the first schedule of MetaSchedule's CPU design space
    (elementwise epilogues inlined, as in every tuned kernel)."""
    out = tvm.IRModule(dict(fused.functions_items()), attrs=fused.attrs)
    for gv, func in fused.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc):
            ctx = ms.TuneContext(mod=tvm.IRModule({"main": func}), target=target,
                                 space_generator="post-order-apply", task_name=gv.name_hint)
            scheduled = ctx.generate_design_space()[0].mod["main"]
            for key, value in (func.attrs or {}).items():
                scheduled = scheduled.with_attr(key, value)
            out[gv] = scheduled
    return out


def _inplace_calls(mod) -> list:
    op = tvm.ir.Op.get("relax.call_tir_inplace")
    calls = []
    tvm.relax.analysis.post_order_visit(
        mod["main"], lambda e: calls.append(e) if isinstance(e, tvm.relax.Call) and e.op.same_as(op) else None)
    return calls


@pytest.fixture(scope="module")
def blocks():
    """Residual adds fused into convolutions: ``y`` dies with its add, ``w`` is read again afterwards
    (by a convolution), and the last add's residual is the other convolution's fresh output."""
    import torch

    class Blocks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c, self.d, self.e, self.f, self.g = (
                torch.nn.Conv2d(16, 16, k, padding=k // 2) for k in (1, 3, 1, 1, 1, 1, 1))

        def forward(self, x):
            y = torch.relu(self.a(x))
            z = torch.relu(self.c(torch.relu(self.b(y))) + y)          # y dies here: in place
            w = torch.relu(self.e(z))
            u = torch.relu(self.d(z) + w)                               # w is read again below
            return self.f(u) + self.g(w)                                # one conv's output dies: in place

    torch.manual_seed(0)
    return load_model(Blocks().eval(), input_shape=(1, 16, 8, 8))


def _used_after(main, call) -> set:
    """The vars that bindings after ``call``'s read."""
    bindings = [b for block in main.body.blocks for b in block.bindings]
    i = next(k for k, b in enumerate(bindings) if b.value.same_as(call))
    later = set()
    for b in bindings[i + 1:]:
        later |= set(tvm.relax.analysis.free_vars(b.value))
    return later | set(tvm.relax.analysis.free_vars(main.body.body))


def test_a_residual_that_dies_with_its_add_is_overwritten_and_the_model_still_matches(blocks, target):
    mod = _scheduled(fuse(optimise(blocks.mod), target), target)
    rewritten = inplace_residuals(mod)
    calls = _inplace_calls(rewritten)
    assert len(calls) == 2                                               # y's add and the last one, not w's
    for call in calls:
        residual = call.args[1].fields[int(call.attrs.inplace_indices[0])]
        assert residual not in _used_after(rewritten["main"], call)
        kernel, original = rewritten[call.args[0]], mod[call.args[0].name_hint.rsplit("_inplace", 1)[0]]
        assert len(kernel.params) == len(original.params) - 1            # no output buffer
    assert C.check(tvm.compile(rewritten, target=target), blocks) < 1e-5


def test_an_unscheduled_kernel_whose_relu_reads_the_add_from_a_buffer_apart_is_left_out_of_place(blocks, target):
    """In TVM's plain kernels the add writes a buffer of its own and the ReLU reads it: the residual
    is not read where the output is written, so only the last add (no ReLU behind it) is rewritten."""
    calls = _inplace_calls(inplace_residuals(fuse(optimise(blocks.mod), target)))
    assert len(calls) == 1 and "relu" not in calls[0].args[0].name_hint


def test_only_a_kernel_reading_each_residual_element_where_it_writes_it_may_overwrite_it():
    from tvm import te
    a, r = te.placeholder((4, 8), name="A"), te.placeholder((4, 8), name="R")

    def aligned(out):
        func = te.create_prim_func([a, r, out])
        return _elementwise_aligned(func, func.params[1], func.params[2])

    assert aligned(te.compute((4, 8), lambda i, j: a[i, j] * 2 + r[i, j]))
    assert not aligned(te.compute((4, 8), lambda i, j: a[i, j] + r[i, 7 - j]))        # read elsewhere
    k = te.reduce_axis((0, 8))
    assert not aligned(te.compute((4, 8), lambda i, j: te.sum(a[i, k] * r[i, j], axis=k)))  # accumulates
    c = te.compute((4, 8), lambda i, j: a[i, j] * r[i, j])
    assert not aligned(te.compute((4, 8), lambda i, j: c[i, j] + r[i, j]))            # read by another block
