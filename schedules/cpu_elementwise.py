"""CPU elementwise / layout kernels (GELU-tanh chains, reshapes, transposes): one parallel, vectorised loop.

Unscheduled, TVM runs them as one scalar thread; GPT-2's tanh-GELU alone took a tenth of the model.
Every block is inlined into the last one, whose loops are fused, split into vectors (the widest vector
that divides the element count, so there is no tail) and spread over the cores.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import get_root_block
from tvm.s_tir.dlight.base import ScheduleRule
from tvm.target import Target

from .common import largest_divisor, vector_shape


PARALLEL_MIN = 1 << 14  # elements: below this, waking the other threads costs more than it saves
# Inlining a block read twice by its consumer doubles the expression: long chains of such blocks (integer
# Pow by repeated squaring has ~400) grow exponentially and exhaust memory in lowering. Real elementwise
# epilogues are far shorter than this.
MAX_BLOCKS = 32


class CpuElementwise(ScheduleRule):
    """Kernels made only of spatial (injective) blocks of static shape, on LLVM CPUs."""

    def apply(self, func: tirx.PrimFunc, target: Target, _: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or target.kind.name != "llvm":
            return None
        sch = s_tir.Schedule(func)
        blocks = sch.get_child_blocks(get_root_block(sch))
        if len(blocks) > MAX_BLOCKS or any(iv.iter_type != tirx.IterVar.DataPar for b in blocks for iv in sch.get(b).iter_vars):
            return None
        for block in blocks[:-1]:
            try:
                sch.compute_inline(block)
            except s_tir.ScheduleError:
                return None
        loops = sch.get_loops(blocks[-1])
        extents = [sch.get(loop).extent for loop in loops]
        if not loops or not all(isinstance(e, tirx.IntImm) for e in extents):
            return None
        size = 1
        for e in extents:
            size *= int(e)
        lanes = largest_divisor(size, (vector_shape(target, "float32")[0], 8, 4, 2, 1))
        outer, inner = sch.split(sch.fuse(*loops), [None, lanes])
        if size >= PARALLEL_MIN:
            sch.parallel(outer)
        sch.vectorize(inner)
        return sch
