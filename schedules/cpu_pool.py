"""CPU max / average pooling (NCHW, 2-D windows): the depthwise conv's schedule without weights.

Unscheduled, TVM runs a pooling as one scalar thread over a padded copy of the whole input: ResNet-50's 3x3 stride-2
max pool over 64 x 112 x 112 took 0.6 ms in the model (onnxruntime's 0.1 ms). A pool is a window reduction per channel
plane like a depthwise conv (``cpu_depthwise.window_schedule``): planes over the cores, each plane's (padded) copy made
right before it is read and, for a stride of 2, dealt into phases, a vector of output columns reduced in registers, an
average's division stored from them. That max pool alone: 2.39x on two cores, 1.23x on one; DenseNet-121's 2x2 average
pool over 128 x 56 x 56 1.11x / 1.14x (``results/rerun/cpu-conv-channels-last/``).
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.dlight.base import ScheduleRule
from tvm.target import Target

from .cpu_depthwise import window_schedule

BLOCKS = ("pool_max", "pool_sum")  # TOPI's blocks of max_pool2d and avg_pool2d (the sum, then its division)


class CpuPool(ScheduleRule):
    """TOPI's 2-D max / average pools over NCHW of static shape, on LLVM CPUs."""

    def apply(self, func: tirx.PrimFunc, target: Target, _: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or target.kind.name != "llvm":
            return None
        sch = s_tir.Schedule(func)
        blocks = [b for b in sch.get_child_blocks(sch.get_sblock("root")) if sch.get(b).name_hint in BLOCKS]
        if len(blocks) != 1:
            return None
        loops = sch.get_loops(blocks[0])
        if len(loops) != 6 or not all(isinstance(sch.get(loop).extent, tirx.IntImm) for loop in loops):
            return None  # (NCHW: n, c, oh, ow and the window's two axes)
        window_schedule(sch, blocks[0], loops, target)
        return sch
