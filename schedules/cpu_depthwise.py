"""CPU depthwise conv2d (MobileNet): TVM's ``group_conv2d_nchw`` with one input channel per group.

Unscheduled it runs as one scalar thread. There is no channel reduction to block for registers, so the
schedule is simple: channel planes over the cores, a vector of output columns accumulated in registers over
the KH x KW window, with the fused epilogue (bias, ReLU6) on the way out. The zero-padded copy of the input
is built one plane at a time (14 x 14 planes a few at a time: ``COPY_BYTES``), right before the plane's
convolution reads it from cache: a separate padded copy of the whole tensor, written to memory and read back, made
MobileNetV2's depthwise layers 2x slower (1.05 ms against 0.51 ms for its nine layer shapes, kernels alone). Where a
stride-1 output row is at most 32 wide, the whole row is one vector and the window is unrolled (14x14 layers: 0.029
-> 0.018 ms). A strided conv's copy deals each row's columns into phases, so that its taps read contiguous vectors
too (``deal_into_phases``).
"""

from __future__ import annotations

import math

from tvm import s_tir, sym, tirx
from tvm.s_tir.dlight.base import ScheduleRule
from tvm.s_tir.dlight.gpu.matmul import auto_inline_consumer_chain
from tvm.target import Target

from .common import elem_bytes, largest_divisor, vector_shape
from .cpu_elementwise import if_then_else_conditions

BLOCK = "group_conv2d_nchw"  # TOPI's block name (relax.nn.conv2d with groups > 1)
# grouped convs of up to this many input channels a group (RegNet's 8, ResNeXt's 4-32) take the same schedule, the
# window's reduction running over the group's channels too
GROUP_WIDTH = 32
# Bytes of padded copies made at a time: planes of 1-2 KB (14 x 14: 1 KB) are copied in groups, each before the
# group's windows read it. Copied and read one at a time, MobileNetV2's 576-channel stride-2 layer over 14 x 14 ran 5x
# slower, the window's loads presumably waiting on the copy's stores still in flight (no counters on this VM to tell);
# 28 x 28 planes (3.6 KB) stay one at a time, and so do planes under 1 KB: 7 x 7 planes in groups of 12 ran 0.86x /
# 0.94x (two cores / one; ``results/rerun/cpu-depthwise-groups/run1-*``).
COPY_BYTES = 4 * 1024
GROUPED_PLANE_BYTES = 1024  # the smallest plane copied in groups


def depthwise_conv(sch: s_tir.Schedule, group_width: int = 1) -> tuple | None:
    """The kernel's depthwise conv block and its loops (n, c, oh, ow, rc, ry, rx), or None if it has none; a grouped
    conv of at most ``group_width`` input channels a group too."""
    try:
        conv = sch.get_sblock(BLOCK)
    except Exception:  # noqa: BLE001 - get_sblock raises a TVM error when the block is absent
        return None
    loops = sch.get_loops(conv)
    if len(loops) != 7 or int(sch.get(loops[4]).extent) > group_width:  # channels reduced per group
        return None
    return conv, loops


def column_stride(sch: s_tir.Schedule, conv: s_tir.SBlockRV) -> int:
    """The conv's stride along the output columns: the coefficient of the column axis in its input's last index."""
    block = sch.get(conv)
    column = block.iter_vars[3].var
    read = next(r for r in block.reads if not r.source.same_as(block.writes[0].source) and len(r.region) == 4)
    coeff = sym.detect_linear_equation(read.region[3].min, [column])
    return int(coeff[0]) if len(coeff) == 2 and isinstance(coeff[0], tirx.IntImm) else 1


def deal_into_phases(sch: s_tir.Schedule, copy: s_tir.SBlockRV, stride: int) -> None:
    """Write the plane's (padded) copy with its columns dealt into ``stride`` phases (column w at [w % stride,
    w // stride]), so that each tap of a strided conv reads its output vector as one contiguous run of a phase
    instead of gathering every stride-th column (which ran MobileNetV2's stride-2 layers at 0.57-0.69x onnxruntime).
    A padded copy's border is filled first, then the interior is copied a row at a time, each row read once."""
    sch.transform_layout(copy, ("write", 0), lambda b, ch, h, w: (b, ch, h, w % stride, w // stride))
    if if_then_else_conditions(sch.get(copy).body):  # (padding)
        fill = sch.decompose_padding(copy, sch.get_loops(copy)[1])  # (under the planes spread over the cores)
        col, phase = sch.split(sch.get_loops(fill)[-1], [None, stride])
        sch.reorder(phase, col)  # the border stored along each phase's contiguous run
    sch.unroll(sch.split(sch.get_loops(copy)[-1], [None, stride])[1])  # a row's phases written in one sweep


class CpuDepthwise(ScheduleRule):
    def apply(self, func: tirx.PrimFunc, target: Target, _: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or target.kind.name != "llvm":
            return None
        sch = s_tir.Schedule(func)
        found = depthwise_conv(sch, GROUP_WIDTH)
        if found is None:
            return None
        window_schedule(sch, *found, target)
        return sch


def window_schedule(sch: s_tir.Schedule, block: s_tir.SBlockRV, loops: list, target: Target) -> None:
    """Schedule a reduction over a window of each channel plane (a depthwise conv, a pooling): ``loops`` are
    (n, c, oh, ow, *reduced) with the window's (ry, rx) last; planes over the cores, each plane's padded copy made
    right before it is read, a vector of output columns accumulated in registers with the fused epilogue stored
    from them (see the module docstring)."""
    n, c, oh, ow, *reduced = loops
    producers = sch.get_producers(block)  # the padded input copy, if the window pads
    stride = column_stride(sch, block)
    if stride > 1 and not producers and int(sch.get(block).reads[0].source.shape[-1]) % stride == 0:
        producers = [sch.cache_read(block, 0, "global")]  # a copy to deal into phases all the same
    copy = sch.get(producers[0]).writes[0].source if producers else None
    # the copy's row must split into whole phases (an odd padded row keeps the strided reads)
    phased = stride > 1 and copy is not None and int(copy.shape[-1]) % stride == 0
    width = int(sch.get(ow).extent)
    source = sch.get(producers[0] if producers else block).reads[0].source
    # each tap reads a contiguous row: stride 1 (a row as wide as the input), or a phase of the copy below
    whole_row = width <= 32 and (phased or width == int(source.shape[-1]))
    lanes = width if whole_row else largest_divisor(width, (vector_shape(target, "float32")[0], 8, 7, 4, 2, 1))
    ow0, ow1 = sch.split(ow, [None, lanes])
    sch.reorder(n, c, oh, ow0, *reduced, ow1)
    plane_bytes = math.prod(int(d) for d in copy.shape[2:]) * elem_bytes(copy) if copy is not None else 0
    if plane_bytes >= GROUPED_PLANE_BYTES:  # (see COPY_BYTES) in groups of channels, each group's copies first
        channels, cores = int(sch.get(c).extent), int(target.attrs.get("num-cores", 1))
        turns = channels * int(sch.get(n).extent) // (4 * cores)  # at least 4 groups a core
        most = max(1, min(COPY_BYTES // plane_bytes, turns))
        group = largest_divisor(channels, tuple(range(most, 0, -1)))
        if group > 1:
            c = sch.split(c, [None, group])[0]
    plane = sch.fuse(n, c)
    sch.parallel(plane)
    for producer in producers:
        sch.compute_at(producer, plane)
    if phased:
        deal_into_phases(sch, producers[0], stride)
    acc = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(acc, ow0, preserve_unit_loops=True)
    auto_inline_consumer_chain(sch, acc)
    if whole_row:
        for tap in reduced[-2:]:
            sch.unroll(tap)
    sch.vectorize(ow1)
    sch.vectorize(sch.get_loops(acc)[-1])
    init = sch.decompose_reduction(block, reduced[0])
    sch.vectorize(sch.get_loops(init)[-1])
