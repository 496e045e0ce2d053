"""Winograd F(4x4, 3x3) and F(2x2, 3x3) for the NHWC graph's 3x3 convolutions: generated transforms
around oneDNN's GEMM or a tuned one.

ResNet's 3x3 stride-1 convolutions already run at the machine's FMA peak as direct convolutions
(oneDNN and ONNX Runtime's MLAS both do), so the only way past the fastest CPU runtimes there is
less arithmetic.  Winograd's minimal filtering (Lavin & Gray, 2016) computes each 4x4 output tile
from a 6x6 input tile with 36 multiplies per channel pair instead of 144:

* input transform ``V = Bᵀ d B`` per tile: generated here as TIR (tiles in parallel on the GEMM's
  OpenMP threads, 16 channels per vector, the transform unrolled with its zero coefficients left
  out);
* 36 independent GEMMs ``M[ξ,ν] = V[ξ,ν] · U[ξ,ν]`` on the weight transformed once at compile time
  (``U = G g Gᵀ``): one oneDNN grouped 1x1 convolution (36 groups), pre-packed like every library
  weight (``library.onednn_conv2d``), or one batched matmul that adaptune tunes (``gemm``, a task of
  the model like any other: the all-generated model runs Winograd too);
* output transform ``Y = Aᵀ M A`` fused with the chain's bias, residual add and ReLU / clip
  (generated TIR, as the input transform).

F(2x2, 3x3) (4x4 input tiles, 16 GEMMs) does 16 multiplies per 2x2 tile, 1.8x F(4x4)'s, on a
transformed weight 16/9 of the direct kernel's instead of 4x: the form for large weights that would
otherwise stream from DRAM on every inference (``forms``).

The transform matrices are TVM's own Cook-Toom construction (``topi.nn.winograd_util``).  Written
by hand because no CPU library we can call exposes a Winograd convolution (PyTorch's oneDNN ops
run the direct algorithm only; its NNPACK fails to initialise on these machines) and TVM's Relax
legalisation has none.  ``library.plan`` times this path per chain beside the direct oneDNN call
and the tuned kernel and keeps the fastest; the whole model is checked against its reference.
"""
from __future__ import annotations

import functools

import numpy as np

import tvm
from tvm import relax

M, R = 4, 3                   # output tile (the default; 2 is the other), kernel size
LANES = 16                    # channels per vector (one zmm, two ymm)


def tile(impl: str) -> int:
    """The output tile of a Winograd implementation name: ``winograd[-generated]-f2`` is F(2x2, 3x3)."""
    return 2 if impl.endswith("-f2") else M


def alpha(m: int = M) -> int:
    """The input tile of F(m x m, 3x3): 6 for F(4x4, 3x3), 4 for F(2x2, 3x3)."""
    return m + R - 1


@functools.lru_cache(maxsize=None)
def matrices(m: int = M) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A, B, G) of F(m x m, 3x3): ``Y = Aᵀ[(G g Gᵀ) ⊙ (Bᵀ d B)]A`` (TVM's Cook-Toom points)."""
    from tvm.topi.nn.winograd_util import _cook_toom_convolution, _interpolation_points
    a, b, g = _cook_toom_convolution(_interpolation_points(m + R - 2), m, R)
    return tuple(np.asarray(x, np.float64) for x in (a, b, g))


def supports(op) -> bool:
    """Whether a ``library.LibraryOp`` chain can run as Winograd F(4x4, 3x3) here."""
    if op.kind != "conv2d":
        return False
    pad, strides, dilation, groups = op.attrs
    o, i, kh, kw = op.weight
    return ((kh, kw) == (R, R) and tuple(strides) == (1, 1) and tuple(dilation) == (1, 1) and groups == 1
            and tuple(pad) == (1, 1) and o % LANES == 0 and i % LANES == 0 and op.data[0] == 1
            and (op.post == "none" or op.post == "relu" or op.post.startswith("hardtanh:")))


#: F(2x2, 3x3) is offered beside F(4x4, 3x3) to chains whose F(4x4) weight reaches this (256x256
#: channels and up): its weight is 16/9 of the direct kernel's rather than 4x, for models whose
#: F(4x4) weights outgrow the last-level cache (``compile.winograd_caps``; ResNet-18's 256@14 chains
#: as F(2x2): the model 3.7% faster than with them as F(4x4); docs/decisions.md, session 62).
SMALL_TILE_FROM = 4 * 2**20


def forms(op) -> tuple[str, ...]:
    """The Winograd implementations a chain can run: none, or F(4x4,3x3) on oneDNN's GEMM and on the
    generated one, and for a large weight (``SMALL_TILE_FROM``) F(2x2,3x3) on the generated GEMM."""
    if not supports(op):
        return ()
    small_tile = ("winograd-generated-f2",) if weight_bytes(op) >= SMALL_TILE_FROM else ()
    return ("winograd", "winograd-generated") + small_tile


def weight_bytes(op, m: int = M) -> int:
    """Bytes of a chain's transformed weight (float32): 36 / 9 = 4x the direct kernel's for
    F(4x4, 3x3), 16 / 9 for F(2x2, 3x3)."""
    o, i = op.weight[:2]
    return alpha(m) ** 2 * o * i * 4


def tiles(h: int, w: int, m: int = M) -> tuple[int, int]:
    return -(-h // m), -(-w // m)


def weight_transform(w_oihw: np.ndarray, m: int = M) -> np.ndarray:
    """(Co, Ci, 3, 3) -> the grouped 1x1 weight (α²·Co, Ci, 1, 1); group ξ·α+ν holds ``G g Gᵀ[ξ,ν]``."""
    _, _, g = matrices(m)
    u = np.einsum("ak,oikl,bl->aboi", g, w_oihw.astype(np.float64), g)
    co, ci = w_oihw.shape[:2]
    return np.ascontiguousarray(u.reshape(alpha(m) ** 2 * co, ci, 1, 1).astype("float32"))


def _lin(terms) -> str:
    """``Σ c·t`` as TVMScript, zero coefficients left out and ±1 without a multiply."""
    parts = []
    for c, t in terms:
        c = float(c)
        if c == 0.0:
            continue
        sign = "-" if c < 0 else "+"
        parts.append((sign, t if abs(c) == 1.0 else f"T.float32({abs(c)!r}) * {t}"))
    if not parts:
        return "T.float32(0)"
    first_sign, first = parts[0]
    s = first if first_sign == "+" else f"T.float32(0) - {first}"
    return s + "".join(f" {sign} {t}" for sign, t in parts[1:])


@functools.lru_cache(maxsize=256)
def _parse(src: str):
    """TVMScript -> PrimFunc.  The loop nest goes in a root block and each (tile, channel block)
    iteration in an opaque block: Relax's layout passes expect blocks in every PrimFunc.  Cached: a
    parse costs ~1 s and every build of a model (the build race makes several) asks for the same."""
    from tvm.script import tirx as T
    out, shift = [], 0
    for ln in src.splitlines():
        if ln.startswith("    for t in"):
            out.append('    with T.sblock("root"):')
            shift = 4
        out.append(" " * shift + ln)
        if ln.lstrip().startswith("for co in"):
            out.append(" " * (shift + len(ln) - len(ln.lstrip()) + 4) + 'with T.sblock("tile"):')
            shift += 4
    return tvm.script.from_source("\n".join(out), extra_vars={"T": T}, s_tir=True)


def _prologue(params: str, tiles_: int, c: int, local: dict[str, int]) -> list[str]:
    """A transform's TVMScript up to its first vectorised loop: tiles in parallel, 16 channels at a
    time, ``local`` buffers of (rows, 16) floats.  The parallel loop runs on the OpenMP threads of
    the oneDNN GEMM around it (``openmp.py``), so there is no hand-over between pools."""
    return (["@T.prim_func(private=True, s_tir=True)", f"def main({params}):",
             '    T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})',
             f"    for t in T.parallel({tiles_}):", f"        for co in range({c // LANES}):"]
            + [f'            {name} = T.sblock_alloc_buffer(({rows}, {LANES}), "float32", scope="local")'
               for name, rows in local.items()]
            + [f"            for ci in T.vectorized({LANES}):"])


def _stage(rows: int, cols: int, dst, terms) -> list[str]:
    """One vectorised stage of a transform: ``dst(r, c) = Σ terms(r, c)`` for every (r, c)."""
    return [f"                {dst(r, q)} = " + _lin(terms(r, q)) for r in range(rows) for q in range(cols)]


def input_transform(h: int, w: int, c: int, generated: bool = False, m: int = M):
    """PrimFunc ``x (1,H,W,C) -> V (1,Th,Tw,α²·C)``, channel index ``(ξ·α+ν)·C + c``; with
    ``generated``, the same memory as the generated GEMM's ``V (Th·Tw, α², C)``.

    Each stage writes a small local buffer in its own vectorised loop: TVM's vectorizer mishandles
    scalar ``let`` bindings inside a vectorised loop (wrong results), buffers it handles."""
    _, b, _ = matrices(m)
    n = alpha(m)
    th, tw = tiles(h, w, m)
    ty, tx = f"(t // {tw})", f"(t % {tw})"
    ch = f"co * {LANES} + ci"
    v_shape = f"({th * tw}, {n * n}, {c})" if generated else f"(1, {th}, {tw}, {n * n * c})"
    v_at = (lambda g: f"v[t, {g}, {ch}]") if generated else (lambda g: f"v[0, {ty}, {tx}, {g * c} + {ch}]")
    lines = _prologue(f'x: T.Buffer((1, {h}, {w}, {c}), "float32"), v: T.Buffer({v_shape}, "float32")',
                      th * tw, c, {"d": n * n, "u": n * n})
    for i in range(n):
        for j in range(n):
            y, xx = f"({ty} * {m} + {i - 1})", f"({tx} * {m} + {j - 1})"
            inside = f"{y} >= 0 and {y} < {h} and {xx} >= 0 and {xx} < {w}"
            load = f"x[0, T.max(T.min({y}, {h - 1}), 0), T.max(T.min({xx}, {w - 1}), 0), {ch}]"  # clamped: never out of bounds
            lines.append(f"                d[{i * n + j}, ci] = T.if_then_else({inside}, {load}, T.float32(0))")
    lines.append(f"            for ci in T.vectorized({LANES}):")
    lines += _stage(n, n, lambda xi, j: f"u[{xi * n + j}, ci]",
                    lambda xi, j: ((b[i, xi], f"d[{i * n + j}, ci]") for i in range(n)))
    lines.append(f"            for ci in T.vectorized({LANES}):")
    lines += _stage(n, n, lambda xi, nu: v_at(xi * n + nu),
                    lambda xi, nu: ((b[j, nu], f"u[{xi * n + j}, ci]") for j in range(n)))
    return _parse("\n".join(lines))


def _post(expr: str, post: str) -> str:
    if post == "relu":
        return f"T.max({expr}, T.float32(0))"
    if post.startswith("hardtanh:"):
        lo, hi = (float(s) for s in post.split(":")[1:3])
        return f"T.min(T.max({expr}, T.float32({lo!r})), T.float32({hi!r}))"
    return expr


def output_transform(h: int, w: int, c: int, residual: bool, post: str, generated: bool = False, m: int = M):
    """PrimFunc ``M (1,Th,Tw,α²·C), bias (C,) [, residual (1,H,W,C)] -> Y (1,H,W,C)``: the inverse
    transform, then ``+ bias (+ residual)`` and the post-op, storing the tile's in-bounds pixels.
    ``generated``: ``M`` is the generated GEMM's ``(α², Th·Tw, C)``."""
    a, _, _ = matrices(m)
    n = alpha(m)
    th, tw = tiles(h, w, m)
    ty, tx = f"(t // {tw})", f"(t % {tw})"
    ch = f"co * {LANES} + ci"
    res_arg = f'r: T.Buffer((1, {h}, {w}, {c}), "float32"), ' if residual else ""
    m_shape = f"({n * n}, {th * tw}, {c})" if generated else f"(1, {th}, {tw}, {n * n * c})"
    m_at = (lambda g: f"m[{g}, t, {ch}]") if generated else (lambda g: f"m[0, {ty}, {tx}, {g * c} + {ch}]")
    lines = _prologue(f'm: T.Buffer({m_shape}, "float32"), '
                      f'bias: T.Buffer(({c},), "float32"), {res_arg}y: T.Buffer((1, {h}, {w}, {c}), "float32")',
                      th * tw, c, {"s": n * m})
    lines += _stage(n, m, lambda xi, bb: f"s[{xi * m + bb}, ci]",
                    lambda xi, bb: ((a[nu, bb], m_at(xi * n + nu)) for nu in range(n)))
    lines.append(f"            for ci in T.vectorized({LANES}):")
    for aa in range(m):
        for bb in range(m):
            y, xx = f"({ty} * {m} + {aa})", f"({tx} * {m} + {bb})"
            e = f"({_lin((a[xi, aa], f's[{xi * m + bb}, ci]') for xi in range(n))}) + bias[{ch}]"
            if residual:
                e += f" + r[0, {y}, {xx}, {ch}]"
            store = f"y[0, {y}, {xx}, {ch}] = {_post(e, post)}"
            conds = ([f"{y} < {h}"] if h % m else []) + ([f"{xx} < {w}"] if w % m else [])
            if conds:
                lines.append(f"                if {' and '.join(conds)}:")
                lines.append(f"                    {store}")
            else:
                lines.append(f"                {store}")
    return _parse("\n".join(lines))


def gemm(tiles_: int, ci: int, co: int, m: int = M):
    """PrimFunc ``V (T,α²,Ci), U (α²,Co,Ci) -> M (α²,T,Co)``: the α² GEMMs as one batched matmul that
    adaptune tunes like any other kernel (the expert matmul space: tiles register-blocked, output
    channels vectorised, ``U`` packed once).  Measured as fast as oneDNN's grouped call at 56x56 and
    1.8x faster at 7x7 (docs/decisions.md, 2026-11-28 session 53)."""
    from tvm import te
    n = alpha(m) ** 2
    v = te.placeholder((tiles_, n, ci), "float32", name="v")
    u = te.placeholder((n, co, ci), "float32", name="u")
    k = te.reduce_axis((0, ci), name="k")
    out = te.compute((n, tiles_, co), lambda g, t, o: te.sum(v[t, g, k] * u[g, o, k], axis=k), name="NT_matmul")
    return te.create_prim_func([v, u, out]).without_attr("global_symbol").with_attr("layout_free_buffers", [1])


def _suffix(m: int) -> str:
    """Kernel names of F(2x2, 3x3) end in ``_f2``; F(4x4, 3x3)'s keep the names of the databases
    tuned before it existed."""
    return "" if m == M else f"_f{m}"


def gemm_name(op, m: int = M) -> str:
    """The generated GEMM's kernel (and task) name for a chain."""
    _, h, w, ci = op.data
    th, tw = tiles(h, w, m)
    return f"winograd_gemm_{th * tw}x{ci}x{op.weight[0]}{_suffix(m)}"


def call(op, x, w_oihw: np.ndarray, bias: np.ndarray, residual, digest: int, add_func,
         generated: bool = False, m: int = M) -> relax.Expr:
    """The chain as Relax: input transform, the α² GEMMs, output transform.  The GEMMs run as one
    oneDNN grouped call, or with ``generated`` as the tuned kernel ``gemm`` (all generated code).

    ``add_func(name, prim_func) -> GlobalVar`` puts a transform into the module being rewritten."""
    from .library.calls import CONV
    _, h, w, ci = op.data
    co = op.weight[0]
    th, tw = tiles(h, w, m)
    groups = alpha(m) ** 2
    gen = "_gen" if generated else ""
    v_type = relax.TensorType((th * tw, groups, ci) if generated else (1, th, tw, groups * ci), "float32")
    v = relax.call_tir(add_func(f"winograd_input_{h}x{w}x{ci}{gen}{_suffix(m)}",
                                input_transform(h, w, ci, generated, m)), [x], v_type)
    u = weight_transform(w_oihw, m)
    if generated:
        prod = relax.call_tir(add_func(gemm_name(op, m), gemm(th * tw, ci, co, m)),
                              [v, relax.const(u.reshape(groups, co, ci))],
                              relax.TensorType((groups, th * tw, co), "float32"))
    else:
        prod = relax.call_pure_packed(
            CONV, v, relax.const(u), relax.const(np.zeros(groups * co, "float32")),
            relax.ShapeExpr([0, 0]), relax.ShapeExpr([1, 1]), relax.ShapeExpr([1, 1]), relax.prim_value(groups),
            relax.expr.String("none"), relax.prim_value(digest ^ 0x5717 ^ m),
            ty_args=relax.TensorType((1, th, tw, groups * co), "float32"))
    name = (f"winograd_output_{h}x{w}x{co}{'_add' if residual is not None else ''}_{op.post.replace(':', '_')}"
            f"{gen}{_suffix(m)}")
    args = [prod, relax.const(np.ascontiguousarray(bias, "float32"))] + ([residual] if residual is not None else [])
    out = add_func(name.replace(".", "p").replace("-", "m"),
                   output_transform(h, w, co, residual is not None, op.post, generated, m))
    return relax.call_tir(out, args, relax.TensorType(op.out, "float32"))
