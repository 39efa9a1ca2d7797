"""CPU depthwise conv2d (MobileNet): TVM's ``group_conv2d_nchw`` with one input channel per group.

Unscheduled it runs as one scalar thread. There is no channel reduction to block for registers, so the
schedule is simple: channel planes over the cores, a vector of output columns accumulated in registers over
the KH x KW window, with the fused epilogue (bias, ReLU6) on the way out. The zero-padded copy of the input
is built one plane at a time, right before the plane's convolution reads it from cache: a separate padded
copy of the whole tensor, written to memory and read back, made MobileNetV2's depthwise layers 2x slower
(1.05 ms against 0.51 ms for its nine layer shapes, kernels alone). Where a stride-1 output row is at most 32
wide, the whole row is one vector and the window is unrolled (14x14 layers: 0.029 -> 0.018 ms).
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.dlight.base import ScheduleRule
from tvm.s_tir.dlight.gpu.matmul import auto_inline_consumer_chain
from tvm.target import Target

from .common import largest_divisor, vector_shape

BLOCK = "group_conv2d_nchw"  # TOPI's block name (relax.nn.conv2d with groups > 1)


def depthwise_conv(sch: s_tir.Schedule) -> tuple | None:
    """The kernel's depthwise conv block and its loops (n, c, oh, ow, rc, ry, rx), or None if it has none."""
    try:
        conv = sch.get_sblock(BLOCK)
    except Exception:  # noqa: BLE001 - get_sblock raises a TVM error when the block is absent
        return None
    loops = sch.get_loops(conv)
    if len(loops) != 7 or int(sch.get(loops[4]).extent) != 1:  # not depthwise: channels reduced per group
        return None
    return conv, loops


class CpuDepthwise(ScheduleRule):
    def apply(self, func: tirx.PrimFunc, target: Target, _: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or target.kind.name != "llvm":
            return None
        sch = s_tir.Schedule(func)
        found = depthwise_conv(sch)
        if found is None:
            return None
        conv, (n, c, oh, ow, rc, ry, rx) = found
        producers = sch.get_producers(conv)  # the padded input copy, if the conv pads
        width = int(sch.get(ow).extent)
        source = sch.get(producers[0] if producers else conv).reads[0].source
        whole_row = width <= 32 and width == int(source.shape[-1])  # stride 1: each tap reads a contiguous row
        lanes = width if whole_row else largest_divisor(width, (vector_shape(target, "float32")[0], 8, 7, 4, 2, 1))
        ow0, ow1 = sch.split(ow, [None, lanes])
        sch.reorder(n, c, oh, ow0, rc, ry, rx, ow1)
        plane = sch.fuse(n, c)
        sch.parallel(plane)
        for producer in producers:
            sch.compute_at(producer, plane)
        acc = sch.cache_write(conv, 0, "local")
        sch.reverse_compute_at(acc, ow0, preserve_unit_loops=True)
        auto_inline_consumer_chain(sch, acc)
        if whole_row:
            sch.unroll(ry)
            sch.unroll(rx)
        sch.vectorize(ow1)
        sch.vectorize(sch.get_loops(acc)[-1])
        init = sch.decompose_reduction(conv, rc)
        sch.vectorize(sch.get_loops(init)[-1])
        return sch
