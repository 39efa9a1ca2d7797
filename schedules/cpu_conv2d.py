"""CPU conv2d: NCHW activations, weights repacked to HWIO at compile time, register-blocked direct conv.

TVM's default NCHW conv is scalar and single-threaded (~20x slower than onnxruntime on ResNet-50). The
activations keep their NCHW layout (no layout change spreads through the graph); only the weight, a
constant, is transposed to ``[KH, KW, IC, OC]`` by the legalisation (FoldConstant does it once, at compile
time), so that output channels are contiguous. The kernel then is the GEMM micro-kernel of
``cpu_matmul`` with the reduction over (KH, KW, IC): a tile of ``MR`` output columns x ``NJ`` vectors of
output channels stays in registers; each step broadcasts MR input pixels and loads NJ weight vectors. A padded,
strided or windowed conv reads a channels-last copy of its input (``_pack_input``), so that those MR pixels'
channels are runs of contiguous memory.
Fused epilogues (bias, ReLU, residual add) run on each tile before it leaves the registers. An epilogue that
broadcasts the conv's output over a larger tensor (a squeeze-and-excitation gate: a 1x1 conv over one pixel per
channel, its sigmoid multiplying the whole feature map) cannot: the epilogue up to the broadcast stays on the tile,
the broadcast and what follows it run after the conv as one parallel vector loop (``cpu_elementwise``'s).
"""

from __future__ import annotations

from tvm import relax, s_tir, te, tirx, topi
from tvm.s_tir.dlight.base import ScheduleRule
from tvm.s_tir.dlight.analysis import get_root_block
from tvm.s_tir.dlight.gpu.matmul import auto_inline_consumer_chain
from tvm.target import Target

from .common import (
    PANEL_VECTORS,
    VECTOR_REGISTERS,
    compiling_for_cpu,
    largest_divisor,
    mark_gemm,
    padded_conv_input,
    register_tile,
    vector_shape,
)
from .cpu_elementwise import parallel_vectors
from .cpu_matmul import panels

BLOCK = "conv2d_nchw_hwio"
# From this many output pixels a 1x1 stride-1 conv runs as a GEMM with vectors along the pixels (NCHW keeps them
# contiguous: no transposed tile store), which beat the channel-vector tile 1.4-2x on MobileNetV2's 112x112 and
# 56x56 layers (few channels). At 28x28 it lost 5-20 % until the GEMM's tiles ran over blocks of pixels
# (``cpu_matmul.B_BLOCK_BYTES``); since, it wins there too (one core, ``results/rerun/cpu-pointwise-28/``: the zoo's
# 28x28 layers 1.01-1.38x, 32 -> 192 0.90x -> 1.25x onnxruntime). 14x14 (196 pixels) is no multiple of a vector
# and keeps the channel-vector tile.
POINTWISE_GEMM_PIXELS = 28 * 28
# Most output columns in the register tile (its rows, each ``PANEL_VECTORS`` vectors of output channels): 14 for
# 28 x 28 and 56 x 56 outputs, 28 accumulators of AVX-512's 32 registers (8 before; with the reduction over input
# channels innermost, ``_pack_input``: ``results/rerun/cpu-conv-channels-last/``).
TILE_ROWS = 14


def _conv2d_nchw_hwio(data: te.Tensor, weight: te.Tensor, strides, padding, dilation) -> te.Tensor:
    """The conv over an HWIO weight, or (5-D) one in panels ``[OC / p, KH, KW, IC, p]``."""
    n, ic = data.shape[:2]
    panel = int(weight.shape[4]) if len(weight.shape) == 5 else 0
    kh, kw = weight.shape[1:3] if panel else weight.shape[:2]
    oc = weight.shape[0] * panel if panel else weight.shape[3]
    data, (oh, ow), (sh, sw), (dh, dw) = padded_conv_input(data, kh, kw, strides, padding, dilation)
    rc, ry, rx = te.reduce_axis((0, ic), "rc"), te.reduce_axis((0, kh), "ry"), te.reduce_axis((0, kw), "rx")

    def w(y, x, c, o):
        return weight[o // panel, y, x, c, o % panel] if panel else weight[y, x, c, o]

    return te.compute(
        (n, oc, oh, ow),
        lambda b, o, y, x: te.sum(data[b, rc, y * sh + ry * dh, x * sw + rx * dw] * w(ry, rx, rc, o), axis=[rc, ry, rx]),
        name=BLOCK,
    )


def _panels(weight: te.Tensor, panel: int) -> te.Tensor:
    """OIHW -> [OC / panel, KH, KW, IC, panel]: ``cpu_matmul.panels`` of the weight as a [(KH, KW, IC), OC]
    matrix, each panel of output channels contiguous along the reduction."""
    oc, ic, kh, kw = (int(d) for d in weight.shape)
    matrix = topi.reshape(topi.transpose(weight, [2, 3, 1, 0]), (kh * kw * ic, oc))
    return topi.reshape(panels(matrix, panel), (oc // panel, kh, kw, ic, panel))


def _pointwise(data: te.Tensor, w: te.Tensor) -> te.Tensor:
    """A 1x1 stride-1 conv as the GEMM out[n, o, (y, x)] = sum_c w[o, c] * data[n, c, (y, x)] (``CpuMatmul``)."""
    r = te.reduce_axis((0, w.shape[1]), "rc")
    n, _, h, wd = data.shape
    return te.compute((n, w.shape[0], h, wd), lambda b, o, y, x: te.sum(w[o, r] * data[b, r, y, x], axis=r),
                      name="conv2d_pointwise")


def legalize_conv2d(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr | None:
    """conv2d on CPUs -> a 1x1 conv over many pixels: a GEMM (``_pointwise``); else the weight rearranged
    (folded for constant weights) + ``conv2d_nchw_hwio``: in panels of ``PANEL_VECTORS`` vectors of output
    channels where they divide OC (as ``cpu_matmul``'s weights; ResNet-50's 7x7-pixel layers read HWIO rows
    8 KB apart), else HWIO."""
    a = call.attrs
    plain = (a.data_layout, a.kernel_layout, a.out_layout) == ("NCHW", "OIHW", "NCHW") and int(a.groups) == 1
    if not (compiling_for_cpu() and plain and call.ty.dtype == "float32" and call.args[0].ty.dtype == "float32"):
        return None
    lanes = vector_shape(Target.current(), "float32")[0]
    oc, ic, kh, kw = (int(d) for d in call.args[1].ty.shape)
    pixels = int(call.ty.shape[2]) * int(call.ty.shape[3])
    pointwise = (kh, kw) == (1, 1) and all(int(v) == 1 for v in a.strides) and not any(int(v) for v in a.padding)
    if pointwise and pixels >= POINTWISE_GEMM_PIXELS and pixels % lanes == 0:
        w = bb.emit_te(topi.reshape, call.args[1], (oc, ic), primfunc_name_hint="conv2d_weight_matrix")
        return bb.call_te(_pointwise, call.args[0], w, primfunc_name_hint="conv2d")
    panel = PANEL_VECTORS * lanes
    args = (a.strides, a.padding, a.dilation)
    if oc % panel == 0:
        weight = bb.emit_te(_panels, call.args[1], panel, primfunc_name_hint="conv2d_weight_panels")
        return mark_gemm(bb, bb.call_te(_conv2d_nchw_hwio, call.args[0], weight, *args, primfunc_name_hint="conv2d"))
    weight = bb.emit_te(topi.transpose, call.args[1], [2, 3, 1, 0], primfunc_name_hint="conv2d_weight_hwio")
    return bb.call_te(_conv2d_nchw_hwio, call.args[0], weight, *args, primfunc_name_hint="conv2d")


def _epilogue_into(sch: s_tir.Schedule, acc: s_tir.SBlockRV) -> None:
    """The elementwise epilogue of the conv's output shape inlined into the tile's store, up to a consumer that
    broadcasts it (which stays a block: the tail). Consumers are inlined into the store one by one first (DLight's
    ``auto_inline_consumers`` would inline them forward, into the broadcast, recomputing them per element)."""
    shape = list(sch.get(acc).writes[0].source.shape)
    same = lambda block: list(sch.get(block).writes[0].source.shape) == shape  # noqa: E731
    while len(consumers := sch.get_consumers(acc)) == 1 and same(consumers[0]):
        try:  # (TVM 0.27's reverse_compute_inline of a broadcast fails with an internal error: not tried)
            sch.reverse_compute_inline(consumers[0])
        except s_tir.ScheduleError:
            break
    if all(same(block) for block in sch.get_consumers(acc)):
        auto_inline_consumer_chain(sch, acc)  # the rest of the epilogue (asserts that nothing is left)


def _pack_input(sch: s_tir.Schedule, conv: s_tir.SBlockRV) -> None:
    """The conv's input copied once per call channels-last (``[N, H, W, C]``) where it is copied anyway (the padded
    input) or read with a stride; a 1x1 stride-1 conv reads its NCHW input as it is.

    Read NCHW, each step of the reduction over input channels jumps a whole plane (12.5 KB at 56 x 56: a new page
    per channel) and a tile's 14 columns come from 3 x IC rows; channels-last, a tile's inputs are a few runs of
    contiguous channels. With the 14-column tiles, ResNet-50's 3x3 conv over 28 x 28 ran 1.12x / 1.16x (one core /
    two, the copy included) and its strided 1x1 1.28x / 1.20x (``results/rerun/cpu-conv-channels-last/``)."""
    data = sch.get(conv).reads[0].source
    pad = [b for b in sch.get_producers(conv) if sch.get(b).writes[0].source.same_as(data)]
    *_, ry, rx = sch.get_loops(conv)
    one_by_one = all(int(sch.get(loop).extent) == 1 for loop in (ry, rx))
    out = sch.get(conv).writes[0].source
    if not pad and one_by_one and [int(d) for d in data.shape[2:]] == [int(d) for d in out.shape[2:]]:  # stride 1
        return
    pack = pad[0] if pad else sch.cache_read(conv, 0, "global")
    sch.transform_layout(pack, ("write", 0), lambda b, c, y, x: (b, y, x, c))
    pn, pc, ph, pw = sch.get_loops(pack)
    sch.reorder(pn, ph, pw, pc)
    sch.parallel(sch.fuse(pn, ph))


class CpuConv2d(ScheduleRule):
    """The kernels ``legalize_conv2d`` produced (with their fused epilogues), on LLVM CPUs."""

    def apply(self, func: tirx.PrimFunc, target: Target, _: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or target.kind.name != "llvm":
            return None
        sch = s_tir.Schedule(func)
        try:
            conv = sch.get_sblock(BLOCK)
        except Exception:  # noqa: BLE001 - get_sblock raises a TVM error when the block is absent
            return None
        n, oc, oh, ow, rc, ry, rx = sch.get_loops(conv)
        n_oc, n_ow = (int(sch.get(loop).extent) for loop in (oc, ow))
        width, _ = vector_shape(target, "float32")
        lanes = largest_divisor(n_oc, (width, 8, 4, 2, 1))
        panels = len(sch.get(conv).reads[1].source.shape) == 5  # the register tile takes one weight panel
        accumulators = VECTOR_REGISTERS[width * 32] - PANEL_VECTORS - 2  # 2 more for the broadcast inputs
        mr, nj = register_tile(n_ow, n_oc // lanes, accumulators, PANEL_VECTORS if panels else None, TILE_ROWS)

        _pack_input(sch, conv)
        oc0, oc1, oc2 = sch.split(oc, [None, nj, lanes])
        ow0, ow1 = sch.split(ow, [None, mr])
        sch.reorder(n, oc0, oh, ow0, ry, rx, rc, ow1, oc1, oc2)
        tile = sch.fuse(n, oc0, oh)
        sch.parallel(tile)
        acc = sch.cache_write(conv, 0, "local")
        # channels innermost in the register tile, so that each accumulator is one contiguous vector
        sch.transform_layout(conv, ("write", 0), lambda b, o, y, x: (b, y, x, o))
        sch.reverse_compute_at(acc, ow0, preserve_unit_loops=True)
        _epilogue_into(sch, acc)
        blocks = sch.get_child_blocks(get_root_block(sch))
        tail = blocks[[sch.get(b).same_as(sch.get(acc)) for b in blocks].index(True) + 1:]
        if tail:  # a broadcast of the conv's output (see the module docstring), inlined into its kernel's output
            for block in tail[:-1]:
                sch.compute_inline(block)
            if not parallel_vectors(sch, tail[-1], width, vectorize=True):
                return None
        sch.vectorize(sch.get_loops(acc)[-1])  # the tile's store (with the epilogue) along contiguous columns
        sch.unroll(ow1)
        sch.unroll(oc1)
        sch.vectorize(oc2)
        init = sch.decompose_reduction(conv, ry)
        sch.vectorize(sch.get_loops(init)[-1])
        return sch
