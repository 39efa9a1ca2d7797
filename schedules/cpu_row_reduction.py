"""CPU row reductions: LayerNorm, RMSNorm, and whatever elementwise work is fused with them.

TVM's default lowering runs these as one scalar thread with a loop-carried add (LayerNorm was 4 % of GPT-2
on the CPU). A kernel qualifies when all of its blocks walk the same rows (leading axes) and each block
either reduces the last axis (``cols`` long) or is elementwise over (rows) or (rows, cols), the last one
elementwise (LayerNorm's output; a mean's division). Schedule: rows over the cores; within a row every block in turn, so
the row stays in L1 between passes; reductions accumulate ``lanes`` partial sums in one vector (rfactor)
that are then added up, elementwise passes run as vectors.

A mean or sum over several trailing axes (a global average pool: NCHW over (H, W)) is legalised on the CPU as
one reduction over their flattened extent (``legalize_trailing_reduction``), which this rule then takes: TVM's
own lowering reduces (H, W) as two loops in one scalar thread (28 us of a 72-channel 28 x 28 squeeze-and-excitation
block whose convs take 2; ``benchmarks/results/rerun/cpu-squeeze-excitation/``).
"""

from __future__ import annotations

import math

from tvm import relax, s_tir, sym, te, tirx
from tvm.s_tir.dlight.analysis import get_root_block
from tvm.s_tir.dlight.base import ScheduleRule
from tvm.target import Target

from .common import compiling_for_cpu, largest_divisor, ravel, unravel, uses, vector_shape

MIN_COLS = 32  # shorter rows: the vector partial sums and their final add do not pay


def legalize_trailing_reduction(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr | None:
    """relax.mean / relax.sum over two or more trailing axes of a static float32 tensor, on CPUs: one reduction over
    their flattened extent (read as x[.., k // W, k % W], contiguous), so ``CpuRowReduction`` takes it; None
    elsewhere (TVM's lowering)."""
    x = call.args[0]
    shape = x.ty.shape
    if not compiling_for_cpu() or x.ty.dtype != "float32" or shape is None or call.attrs.axis is None:
        return None
    if not all(isinstance(d, tirx.IntImm) for d in shape):
        return None
    dims = [int(d) for d in shape]
    axes = sorted(int(a) % len(dims) for a in call.attrs.axis)
    if len(axes) < 2 or axes[0] == 0 or axes != list(range(axes[0], len(dims))):
        return None  # (a reduction of everything has no rows to spread over the cores)
    lead, tail = dims[: axes[0]], dims[axes[0]:]
    count, keep = math.prod(tail), [1] * len(tail) if call.attrs.keepdims else []
    mean = call.op.name == "relax.mean"

    def reduce(data: te.Tensor) -> te.Tensor:
        k = te.reduce_axis((0, count), "k")

        total = te.compute(lead, lambda *i: te.sum(data(*i, *unravel(k, tail)), axis=k), name="sum")
        if not mean and not keep:
            return total
        return te.compute(lead + keep, lambda *i: total(*i[: len(lead)]) / count if mean else total(*i[: len(lead)]),
                          name="mean" if mean else "sum_keepdims")

    return bb.call_te(reduce, x, primfunc_name_hint=call.op.name.split(".")[-1])


class CpuRowReduction(ScheduleRule):
    """Row-reduction kernels (see the module docstring) of float32 / float16, on LLVM CPUs."""

    def apply(self, func: tirx.PrimFunc, target: Target, _: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or target.kind.name != "llvm":
            return None
        sch = s_tir.Schedule(func)
        blocks = sch.get_child_blocks(get_root_block(sch))
        found = _rows_and_cols(sch, blocks)
        if found is None:
            return None
        n_rows, cols = found
        dtype = str(sch.get(blocks[-1]).writes[0].source.dtype)
        if dtype not in ("float32", "float16"):
            return None
        lanes = largest_divisor(cols, (vector_shape(target, dtype)[0], 8, 4))
        if lanes is None or cols < MIN_COLS:
            return None
        try:
            partials = []
            for block in blocks:  # rfactor first: it wants the reduction alone in its loop nest
                if sch.get(block).iter_vars[-1].iter_type == tirx.IterVar.CommReduce:
                    _, vec = sch.split(sch.get_loops(block)[-1], [None, lanes])
                    partials.append(sch.rfactor(vec, factor_axis=len(sch.get(block).writes[0].region)))
            blocks = sch.get_child_blocks(get_root_block(sch))
            row = sch.fuse(*sch.get_loops(blocks[-1])[:n_rows])
            sch.parallel(row)  # before compute_at: with the reductions under it TVM refuses to parallelise
            for block in reversed(blocks[:-1]):  # consumers first, so each producer lands under ``row``
                sch.compute_at(block, row, preserve_unit_loops=True)
            for block in partials:  # lanes partial sums in one vector register
                # compute_at regenerated its loops in iter-var order: (lanes, ..., steps along the row)
                _, lane, *_, step = sch.get_loops(block)
                if (int(sch.get(lane).extent), int(sch.get(step).extent)) != (lanes, cols // lanes):
                    return None
                sch.reorder(step, lane)
                sch.vectorize(lane)
                init = sch.decompose_reduction(block, step)
                sch.vectorize(sch.get_loops(init)[-1])
            for block in sch.get_child_blocks(row):
                last = sch.get_loops(block)[-1]
                if sch.get(block).iter_vars[-1].iter_type == tirx.IterVar.DataPar and int(sch.get(last).extent) == cols:
                    sch.vectorize(sch.split(last, [None, lanes])[1])
        except s_tir.ScheduleError:
            return None
        return sch


def _rows_and_cols(sch: s_tir.Schedule, blocks: list) -> tuple[int, int] | None:
    """(how many leading loops of the last block walk the rows, cols) when the kernel has the shape the
    module docstring describes; unit axes (``keepdims``) do not count."""
    shapes = []
    for block in blocks:
        ivs = sch.get(block).iter_vars
        if len(sch.get_loops(block)) != len(ivs) or not all(isinstance(iv.dom.extent, tirx.IntImm) for iv in ivs):
            return None
        kinds = [iv.iter_type for iv in ivs]
        if not kinds:  # a scalar block (NonMaxSuppression's counters): not a row kernel
            return None
        if any(k != tirx.IterVar.DataPar for k in kinds[:-1]) or kinds[-1] not in (tirx.IterVar.DataPar, tirx.IterVar.CommReduce):
            return None
        reduces = kinds[-1] == tirx.IterVar.CommReduce
        if reduces and not _reads_along_last_axis(sch.get(block)):
            return None  # a matmul (B[k, j]): the GEMM rule's, or strided reads that vectors would not help
        shapes.append(([int(iv.dom.extent) for iv in ivs], reduces))
    squeeze = lambda extents: [e for e in extents if e != 1]  # noqa: E731
    reductions = [(squeeze(extents[:-1]), extents[-1]) for extents, reduces in shapes if reduces]
    if not reductions or any(r != reductions[0] for r in reductions):
        return None
    rows, cols = reductions[0]  # (no rows but unit ones: a decoding step's one token)
    for extents, reduces in shapes:
        if not reduces and squeeze(extents) != rows and not (extents[-1] == cols and squeeze(extents[:-1]) == rows):
            return None
    last, reduces = shapes[-1]
    if reduces:
        return None
    return (len(last) - 1 if last[-1] == cols and squeeze(last[:-1]) == rows else len(last)), cols


def _reads_along_last_axis(block: tirx.Block) -> bool:
    """Whether every buffer the reduction reads with its reduced variable k is read at k's step of one element in
    memory (the flat row-major offset, simplified within the iteration domain, is k + terms free of k; a global
    average pool's x[.., k // W, k % W] is), i.e. the reduction walks rows of contiguous memory."""
    k = block.iter_vars[-1].var
    analyzer = sym.Analyzer()
    for iv in block.iter_vars:
        analyzer.bind(iv.var, iv.dom)
    for region in block.reads:
        index = [r.min for r in region.region]
        if not any(uses(i, k) for i in index):
            continue
        linear = sym.detect_linear_equation(analyzer.simplify(ravel(index, region.source.shape)), [k])
        if len(linear) != 2 or not analyzer.can_prove_equal(linear[0], 1) or uses(linear[1], k):
            return False
    return True
