"""Expert x86 design spaces: a register-blocked micro-kernel for NHWC convolutions and matmuls.

MetaSchedule's generic multi-level tiling space holds 10^9-10^10 configs, most of them slow; at the
trials a user can afford the search rarely reaches the corner where fast kernels live.  Chameleon
was evaluated on AutoTVM's expert templates instead, small knob spaces in which every point is a
sane kernel.  This is such a template, written as a MetaSchedule ``ScheduleFn`` so that
``KnobSpace`` sees its sampling instructions as knobs and every strategy searches it unchanged.

The kernel (for ``out[n, h, w, co] += in[n, h*s + kh, w*s + kw, ci] * wt[co, kh, kw, ci]``, the
same with ``ci`` of extent 1 for depthwise, and ``out[.., i, j] += a[.., i, k] * b[.., j, k]``):

    parallel for n, h, w_o, co_o            (fused; co_o first where the weights outweigh input + output)
      for ci_o, kh, kw, ci_i                 (ci split: knob; kh, kw unrolled by the unroll knob)
        for w_i                              (register block over output width: knob, unrolled)
          vectorised for co_v                (output-channel vector block: one design space each)
            acc[w_i, co_v] += in[...] * wt[...]
      epilogue (bias, residual, activation) on the acc block, then stored

so a ``w_i x co_v`` block of the output stays in vector registers for the whole reduction.  A
depthwise-separable kernel (``kernel_rewrites.fuse_separable``: a depthwise convolution feeding a 1x1 one) is
the 1x1 micro-kernel with the depthwise rows of each parallel tile computed inside it, just before
the channel blocks that read them (``_depthwise_at``); where a 1x1 expansion feeds the depthwise
convolution too, the cores take bands of output rows, and each band first computes the expanded
rows it reads, halo included, with the 1x1 micro-kernel into a buffer of the band's size
(``_expansion_at``), so the expanded tensor never leaves L2.  A depthwise convolution joined
to the 1x1 expansion before it alone (``kernel_rewrites.fuse_expansion_depthwise``) runs its
channel blocks in parallel, each first computing its channels of the expansion over the whole image
(``_expansion_at`` under the channel block: no halo, as a depthwise convolution mixes no channels).  Each
vector block is its own design space, with the register blocks that fit the register file beside
it (32 zmm with AVX-512, 16 ymm with AVX2), so no point of the space spills.  The weights are
packed to the loop order by MetaSchedule's ``RewriteLayout`` (buffers marked layout-free, as
Relax marks model weights).  The expert and the generic spaces can be one task's spaces together
(``space="both"``): the design-space knob chooses.

The order of the outer tiles follows the operands' sizes, not a knob: in a model the weights come
from DRAM (a ResNet's do not fit in L3) while the input was just written, so a convolution whose
weights outweigh its input and output together walks the output-channel blocks outermost and
streams each weight block once (weights-stationary); every other kernel splits its rows between
the cores, as the next kernel reads them, so an activation stays on the core that wrote it.
Hot-cache timing, which tuning measures, cannot tell the two orders apart; in the model the rule
saves 0.03-0.13 ms per late ResNet-50 layer and 4-5% of MobileNetV2, whose 14x14 expansions
split by channels made the next kernel fetch half its input from the other core
(docs/decisions.md, sessions 54 and 77).
"""
from __future__ import annotations

import math
import platform
import re
from functools import partial

from .._tvm import ms, s_tir, tvm

#: reduction blocks the template covers: NHWC convolutions (grouped: depthwise) and matmuls
CONV_BLOCKS = ("conv2d_nhwc", "group_conv2d_nhwc", "depthwise_conv2d_nhwc")
MATMUL_BLOCKS = ("matmul", "T_matmul", "T_matmul_NT", "T_dense", "NT_matmul", "dense")
UNROLL_STEPS = [0, 16, 64, 512]
SPACES = ("auto", "generic", "expert", "both")


def vector_isa(target) -> tuple[int, int]:
    """(float32 lanes, vector registers) of an x86 target: AVX-512 16/32, AVX(2) 8/16, else 4/16."""
    has = tvm.target.codegen.target_has_features
    if has("avx512f", target):
        return 16, 32
    if has("avx2", target) or has("avx", target):
        return 8, 16
    return 4, 16


def x86_lanes(target) -> int | None:
    """float32 lanes of an x86 CPU target's vectors (``vector_isa``); None for any other target."""
    triple = str(target.attrs.get("mtriple", "")) or platform.machine()
    if target.kind.name != "llvm" or not any(x in triple for x in ("x86", "AMD64", "i686")):
        return None
    return vector_isa(target)[0]


def _kind(sch, block) -> str:
    """A block's name without the suffix TE adds to the second block of a name (``conv2d_nhwc_1``)."""
    return re.sub(r"_\d+$", "", sch.get(block).name_hint)


def _iter_types(sch, block) -> list[int]:
    return [int(iv.iter_type) for iv in sch.get(block).iter_vars]


def _reduction_block(sch):
    """The template's reduction block in the function, or None if there is none it covers: its one
    convolution or matmul, or the pointwise convolution of a depthwise-separable pair
    (``separable_producer``)."""
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    reductions = [b for b in blocks if 2 in _iter_types(sch, b)]
    if len(reductions) in (2, 3) and (pair := separable_producer(sch, reductions[-1])) is not None:
        return reductions[-1] if len(reductions) == 2 or expansion_producer(sch, pair[0]) else None
    if len(reductions) == 2 and _is_depthwise(sch, reductions[-1]) and expansion_producer(sch, reductions[-1]):
        return reductions[-1]
    if len(reductions) != 1:
        return None
    block = reductions[0]
    name = _kind(sch, block)
    kinds = _iter_types(sch, block)
    if name in CONV_BLOCKS:
        return block if kinds == [0, 0, 0, 0, 2, 2, 2] else None
    if name in MATMUL_BLOCKS:
        k = kinds.index(2)
        return block if k >= 2 and kinds[k:] == [2] and set(kinds[:k]) == {0} else None
    return None


def _is_depthwise(sch, block) -> bool:
    """Whether ``block`` is an NHWC convolution with one input channel per output channel."""
    return _kind(sch, block) in CONV_BLOCKS and _iter_types(sch, block) == [0, 0, 0, 0, 2, 2, 2] and \
        _loop_extents(sch, block)[6] == 1


def _loop_extents(sch, block) -> list[int]:
    return [int(sch.get(loop).extent) for loop in sch.get_loops(block)]


def _reduction_before(sch, block):
    """(the reduction block ``block`` reads through a line of single producers, the blocks on that
    line in data-flow order), or None where a block on the way has more than one producer."""
    chain = []
    while len(producers := sch.get_producers(block)) == 1:
        block = producers[0]
        if 2 in _iter_types(sch, block):
            return block, chain[::-1]
        chain.append(block)
    return None


def separable_producer(sch, block):
    """(depthwise block, the elementwise blocks from it to ``block``) where ``block`` is a 1x1
    stride-1 NHWC convolution that reads a depthwise convolution through elementwise blocks only
    (``kernel_rewrites.fuse_separable``'s kernels), else None."""
    conv = [0, 0, 0, 0, 2, 2, 2]
    if _kind(sch, block) != "conv2d_nhwc" or _iter_types(sch, block) != conv or \
            _loop_extents(sch, block)[4:6] != [1, 1]:
        return None
    if (found := _reduction_before(sch, block)) is None:
        return None
    b, chain = found
    if not chain or _kind(sch, b) not in CONV_BLOCKS or _iter_types(sch, b) != conv or \
            _loop_extents(sch, b)[6] != 1 or _loop_extents(sch, b)[:3] != _loop_extents(sch, block)[:3]:
        return None
    return b, chain


def expansion_producer(sch, depthwise):
    """(1x1 convolution block, the elementwise blocks from it to the depthwise's padding) where a
    separable kernel's depthwise convolution reads a 1x1 stride-1 NHWC convolution through its
    padding and elementwise blocks only (``kernel_rewrites.fuse_separable``'s expanded kernels),
    else None."""
    producers = sch.get_producers(depthwise)
    if len(producers) != 1 or not _is_padding(sch, producers[0]):
        return None
    if (found := _reduction_before(sch, producers[0])) is None:
        return None
    b, chain = found
    if not chain or _kind(sch, b) != "conv2d_nhwc" or _iter_types(sch, b) != [0, 0, 0, 0, 2, 2, 2] or \
            _loop_extents(sch, b)[4:6] != [1, 1]:
        return None
    return b, chain


def band_rows(extent: int) -> list[int]:
    """Output rows per parallel band of an expanded separable kernel: divisors of the height from 2
    to 8 that leave at least two bands (a band of ``r`` rows at stride ``s`` expands ``r*s + 2``
    input rows for ``r*s``: fewer rows recompute more halo, more rows hold more of L2)."""
    return [r for r in range(2, 9) if extent % r == 0 and extent // r >= 2] or [1]


def _expansion_at(sch, band, conv, chain, vec: int, lanes: int, regs: int) -> None:
    """Compute an expanded separable kernel's 1x1 expansion under ``band`` (its parallel band of
    output rows): the input rows the band's depthwise rows read, halo included, as the 1x1
    micro-kernel with its own register block and input-channel split (knobs) and output-channel
    vector block ``vec``, bias and activation applied, into a buffer of the band's rows (it stays
    in L2) that the depthwise rows read."""
    for b in [*sch.get_producers(conv), *chain[:-1]]:         # its padding pass is a copy
        sch.compute_inline(b)
    out = chain[-1]
    sch.compute_at(out, band, preserve_unit_loops=True)
    sch.compute_at(conv, band, preserve_unit_loops=True)
    sch.set_scope(conv, 0, "local")
    _, h, w, co, *red = sch.get_loops(conv)[-7:]
    w_o, w_i, co_o, co_v, rc_o, rc_i = _register_tiles(sch, w, co, red, vec, lanes, regs)
    sch.reorder(h, w_o, co_o, rc_o, *red[:-1], rc_i, w_i, co_v)
    sch.reverse_compute_at(out, co_o, preserve_unit_loops=True)
    sch.vectorize(sch.get_loops(out)[-1])
    _in_registers(sch, conv, w_i, co_v, rc_o)


def _register_tiles(sch, reg, col, red, vec: int, lanes: int, regs: int):
    """The micro-kernel's splits of a reduction block's loops: the register block over ``reg``
    (a knob; TVM's prior in the first batches favours large ones), the vector block ``vec`` over
    ``col``, the split of the innermost reduction loop (a knob).  Returns (reg_o, reg_i, col_o,
    col_v, red_o, red_i)."""
    blocks = register_blocks(int(sch.get(reg).extent), vec, lanes, regs)
    wb = sch.sample_categorical(blocks, [b / sum(blocks) for b in blocks])
    reg_o, reg_i = sch.split(reg, [None, wb])
    col_o, col_v = sch.split(col, [None, vec])
    red_o, red_i = sch.split(red[-1], sch.sample_perfect_tile(red[-1], n=2, max_innermost_factor=64))
    return reg_o, reg_i, col_o, col_v, red_o, red_i


def _in_registers(sch, block, reg_i, col_v, red_o) -> None:
    """The register block unrolled and the vector block vectorised, the accumulators zeroed before
    the reduction's outer loop (vectorised too)."""
    sch.unroll(reg_i)
    sch.vectorize(col_v)
    init = sch.decompose_reduction(block, red_o)
    sch.vectorize(sch.get_loops(init)[-1])


def _depthwise_at(sch, loop, depthwise, chain, lanes: int) -> None:
    """Compute a separable pair's depthwise rows under ``loop`` (the pointwise kernel's parallel
    tile): each ``lanes``-channel slice of the tile's pixels in registers over the taps (the taps'
    weight vector reused across the pixels), its bias and activation applied, into a stack buffer
    that the pointwise micro-kernel reads; the padding inlined as for a lone depthwise kernel."""
    for b in [*sch.get_producers(depthwise), *chain[:-1]]:
        sch.compute_inline(b)
    act = chain[-1]
    sch.set_scope(act, 0, "local")
    sch.compute_at(act, loop, preserve_unit_loops=True)
    pixels, channels = sch.get_loops(act)[-2:]
    c_o, c_v = sch.split(channels, [None, lanes])
    sch.reorder(c_o, pixels, c_v)
    sch.set_scope(depthwise, 0, "local")
    sch.compute_at(depthwise, c_o, preserve_unit_loops=True)
    d_pixels, d_channels, *taps = sch.get_loops(depthwise)[-5:]
    sch.reorder(*taps, d_pixels, d_channels)
    sch.unroll(d_pixels)
    sch.vectorize(d_channels)
    init = sch.decompose_reduction(depthwise, taps[0])
    sch.vectorize(sch.get_loops(init)[-1])
    sch.unroll(pixels)
    sch.vectorize(c_v)


def weights_stationary(sch, block) -> bool:
    """Whether a convolution's weights hold more elements than its (padded) input and its output
    together, so the template runs the output-channel blocks outermost (module doc).  Never for a
    matmul: Winograd's batched GEMMs measured slower that way even with their weights cold."""
    stmt = sch.get(block)
    if _kind(sch, block) not in CONV_BLOCKS:
        return False
    size = lambda r: math.prod(int(d) for d in r.source.shape)     # noqa: E731
    data, weight = stmt.reads[:2]
    return size(weight) > size(data) + size(stmt.writes[0])


def _is_padding(sch, block) -> bool:
    """Whether a producer block pads (writes zeros outside the input): else it is a plain copy."""
    return "if_then_else" in str(sch.get(block).body)


def vector_blocks(extent: int, lanes: int) -> list[int]:
    """Output-channel vector blocks that divide the extent: 1-4 full vectors, or where none divides,
    a multiple of 8 below a vector (half a zmm; measured slowest wherever a full one fits) and one
    between full vectors (24 = a zmm and a ymm: MobileNetV2's 24-channel layers, one broadcast input
    feeding both instead of three half-zmm blocks each loading it again)."""
    full = [v for v in range(lanes, 4 * lanes + 1, lanes) if extent % v == 0]
    return full or [v for v in range(8, 4 * lanes, 8) if extent % v == 0 and v % lanes]


def register_blocks(extent: int, vec: int, lanes: int, regs: int) -> list[int]:
    """Register blocks over the output width whose accumulators (block x vectors) fit the register
    file with four registers to spare (weights, broadcast input)."""
    per_row = max(1, -(-vec // lanes))
    return [b for b in range(1, min(extent, 16) + 1) if extent % b == 0 and b * per_row <= regs - 4]


def _output_tile(sch, block) -> tuple[int, int]:
    """Extents of the block's last two spatial loops: the register-blocked one and the vector one."""
    kinds = _iter_types(sch, block)
    spatial = len(kinds) - kinds.count(2)
    loops = sch.get_loops(block)
    return int(sch.get(loops[spatial - 2]).extent), int(sch.get(loops[spatial - 1]).extent)


def micro_kernel(sch: "s_tir.Schedule", vec: int, lanes: int, regs: int, inline_pad: bool = False,
                 expansion_vec: int | None = None) -> "s_tir.Schedule":
    """Schedule the covered reduction block as the register-blocked micro-kernel with output-channel
    vector block ``vec`` (``expansion_vec``: an expanded separable kernel's expansion's); the register
    blocks, the input-channel splits, the rows per band and the unroll depth are sampled (the knobs).
    Padding is its own parallel pass unless ``inline_pad``.  Raises ValueError for a function the
    template does not cover."""
    block = _reduction_block(sch)
    if block is None:
        raise ValueError("no NHWC convolution or matmul block")
    separable = separable_producer(sch, block)
    expansion = separable and expansion_producer(sch, separable[0])
    expanded_depthwise = not separable and _is_depthwise(sch, block) and expansion_producer(sch, block)
    stationary = separable is None and (expanded_depthwise or weights_stationary(sch, block))
    if expanded_depthwise:                          # its padding reads the expansion's buffer
        sch.compute_inline(sch.get_producers(block)[0])
    for producer in [] if separable or expanded_depthwise else sch.get_producers(block):
        for p in sch.get_producers(producer):       # the transpose of an NCHW input (fuse_input_transpose)
            sch.compute_inline(p)
        if _is_padding(sch, producer) and not inline_pad:
            loops = sch.get_loops(producer)
            sch.parallel(sch.fuse(*loops[:-2]))
            sch.vectorize(loops[-1])
        else:
            sch.compute_inline(producer)
    chain, b = [], block
    while True:
        consumers = sch.get_consumers(b)
        if len(consumers) != 1:
            break
        b = consumers[0]
        chain.append(b)
    if sch.get_consumers(b):
        raise ValueError("the reduction's consumers are not a chain")
    for c in chain[:-1]:
        sch.compute_inline(c)
    if chain:
        last = chain[-1]
        sch.set_scope(block, 0, "local")
    else:
        last = sch.cache_write(block, 0, "local")
    loops = sch.get_loops(block)
    spatial = len(loops) - _iter_types(sch, block).count(2)
    outer, (reg, col), red = loops[:spatial - 2], loops[spatial - 2:spatial], loops[spatial:]
    col_extent = int(sch.get(col).extent)
    if col_extent % vec:
        raise ValueError(f"vector block {vec} does not divide {col_extent}")
    reg_o, reg_i, col_o, col_v, red_o, red_i = _register_tiles(sch, reg, col, red, vec, lanes, regs)
    tiles = [col_o, *outer, reg_o] if stationary else [*outer, reg_o, col_o]
    sch.reorder(*tiles, red_o, *red[:-1], red_i, reg_i, col_v)
    sch.reverse_compute_at(last, tiles[-1], preserve_unit_loops=True)
    sch.vectorize(sch.get_loops(last)[-1])
    if expansion:               # bands of output rows in parallel, each band's expanded rows computed once
        rows = band_rows(int(sch.get(outer[-1]).extent))
        h_o, h_i = sch.split(outer[-1], [None, sch.sample_categorical(rows, [1 / len(rows)] * len(rows))])
        band = sch.fuse(*outer[:-1], h_o)
        sch.parallel(band)
        _depthwise_at(sch, sch.fuse(h_i, reg_o), *separable, lanes)
        _expansion_at(sch, band, *expansion, expansion_vec, lanes, regs)
    elif expanded_depthwise:    # channel blocks in parallel, each block's expansion over the whole image first
        sch.parallel(col_o)
        _expansion_at(sch, col_o, *expanded_depthwise, expansion_vec, lanes, regs)
    elif separable:             # the channel blocks inside the parallel tile: its depthwise rows computed once
        tile = sch.fuse(*tiles[:-1])
        sch.parallel(tile)
        _depthwise_at(sch, tile, *separable, lanes)
    else:
        sch.parallel(sch.fuse(*tiles))
    _in_registers(sch, block, reg_i, col_v, red_o)
    unroll = sch.sample_categorical(UNROLL_STEPS, [1.0 / len(UNROLL_STEPS)] * len(UNROLL_STEPS))
    sch.annotate(sch.get_sblock("root"), "meta_schedule.unroll_explicit", unroll)
    return sch


def _design_spaces(sch: "s_tir.Schedule", lanes: int, regs: int) -> list:
    """One design space per vector block.  A full convolution keeps its padding as its own pass
    (inlined, the bounds test is a scalar test per broadcast input in the inner loop, and the
    accumulators went to memory); a depthwise one (one input channel per output channel) inlines
    it: the test is one per vector there, and the separate pass cost as much memory traffic as the
    convolution (MobileNetV2's depthwise layers: 1.1-2.8x faster inlined, docs/decisions.md)."""
    block = _reduction_block(sch)
    if block is None:
        raise ValueError("no NHWC convolution or matmul block")
    _, col_extent = _output_tile(sch, block)
    depthwise = _kind(sch, block) in CONV_BLOCKS and int(sch.get(sch.get_loops(block)[-1]).extent) == 1
    separable = separable_producer(sch, block)
    expansion = expansion_producer(sch, separable[0] if separable else block) if separable or depthwise else None
    if not expansion:
        return [micro_kernel(sch.copy(), vec, lanes, regs, inline_pad=depthwise) for vec in vector_blocks(col_extent, lanes)]
    expansion_vecs = vector_blocks(_output_tile(sch, expansion[0])[1], lanes)
    return [micro_kernel(sch.copy(), vec, lanes, regs, inline_pad=depthwise, expansion_vec=ev)
            for vec in vector_blocks(col_extent, lanes) for ev in expansion_vecs
            if separable or vec % ev == 0]          # an expanded depthwise kernel's expansion: within its channel block


def covers(mod, target) -> bool:
    """Whether the expert template schedules this workload on this target: an x86 CPU, a float32
    NHWC convolution or matmul with an output-channel extent a multiple of 8, and weights marked
    layout-free (``layout_free_buffers``, as Relax marks a model's), so they are packed to the
    vector block once; unpacked, every vector load would be a gather."""
    if x86_lanes(target) is None:
        return False
    if not (mod["main"].attrs or {}).get("layout_free_buffers"):
        return False
    try:
        sch = s_tir.Schedule(mod, debug_mask="none")
        if any(str(a.dtype) != "float32" for a in ms.arg_info.ArgInfo.from_prim_func(mod["main"])):
            return False
        return bool(_design_spaces(sch, *vector_isa(target)))
    except Exception:  # noqa: BLE001 - any schedule error means the template does not apply
        return False


def expert_space_generator(target) -> "ms.space_generator.ScheduleFn":
    """The expert template as a MetaSchedule space generator (one design space per vector block),
    with the target's default postprocessors (``RewriteLayout`` packs the weights)."""
    lanes, regs = vector_isa(target)
    return ms.space_generator.ScheduleFn(partial(_design_spaces, lanes=lanes, regs=regs),
                                         sch_rules=[], postprocs="from-target", mutator_probs={})
