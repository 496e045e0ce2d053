"""Kernels that misbehave on purpose: fault injection for the measurement tests."""
from tvm.script import ir as I
from tvm.script import tirx as T


@I.ir_module
class Segfault:
    @T.prim_func
    def main(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        for i in range(16):
            # a write 2^42 floats past the buffer: the worker is killed by SIGSEGV
            B[T.int64(i) + T.int64(4398046511104)] = A[i]


@I.ir_module
class Hang:
    @T.prim_func
    def main(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        for i in range(T.int64(1) << T.int64(50)):  # ~10^15 dependent steps: runs for days
            B[0] = B[0] * A[i % T.int64(16)] + A[(i + T.int64(1)) % T.int64(16)]
