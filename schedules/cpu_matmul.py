"""CPU GEMM rule: register-blocked, vectorised, multi-threaded schedule for matmul-like kernels.

TVM lowers an unscheduled matmul to scalar, single-threaded loops (~20x slower than onnxruntime on the
zoo's transformers). This is the classic BLIS-style micro-kernel, written as a TensorIR schedule so the
fused prologue/epilogue (bias, GELU, residual add, ...) stays in the same kernel:

- normalise the kernel to ``C[S, I, J] += A[S, I, K] * B[S, J, K]`` (DLight's matmul analysis), reading
  the original buffers (no transposed copies);
- a ``MR x (NJ * lanes)`` tile of C lives in vector registers for the whole K loop: each step broadcasts
  MR values of A and loads NJ vectors of B (B's J axis is contiguous in ONNX MatMul/Gemm weights);
- tiles are distributed over the cores (``parallel``), J-tiles outermost so a B panel is reused from cache
  by consecutive I-tiles; where B's rows are short (a 1x1 conv's K = 64 input channels), an I-tile runs over a
  block of consecutive J-tiles (``B_BLOCK_BYTES`` of B), so that its output rows are written in long runs;
  the epilogue runs on each tile while it is hot.

Where J is not a multiple of the vector width, or I has no divisor that fills the tile (ViT's 197
tokens), ``pad_einsum`` pads them; the padded operands are then copied once per call (B K-major). A constant
weight of such a width is padded at compile time instead, by ``legalize_matmul`` (which does the same for
the CUDA tensor-core GEMM).
"""

from __future__ import annotations

import tvm
from tvm import relax, s_tir, te, tirx, topi
from tvm.s_tir.dlight.analysis import get_root_block
from tvm.s_tir.dlight.base import ScheduleRule
from tvm.s_tir.dlight.gpu.matmul import (
    auto_inline_consumer_chain,
    get_index_map,
    get_reduction_blocks,
)
from tvm.target import Target

from .common import PANEL_VECTORS, largest_divisor, mark_gemm, register_tile, vector_shape
from .gpu_matmul import MMA_DTYPES, chunk

PANELS = "matmul_panels"  # the block of a matmul by a weight in column panels (``legalize_matmul``)
# Bytes of B one I tile streams over before the next (see ``CpuMatmul.apply``): a transformer's GEMM (K >= 768, two
# 16-float vectors per tile) keeps one J tile per block; a 1x1 conv's GEMM over 56 x 56 pixels (K = 64) takes 8.
# Against one J tile per block, one core (``results/rerun/cpu-matmul-blocks/``): ResNet-50's 64 -> 256 conv 1.40x,
# MobileNetV2's 16 -> 96 over 112 x 112 1.65x, the other 1x1 convs 1.02-1.12x, transformer GEMMs 0.98-1.01x.
B_BLOCK_BYTES = 128 * 1024


class CpuMatmul(ScheduleRule):
    """Matmul-like kernels (dense, batched matmul, with fused elementwise neighbours) on LLVM CPUs."""

    def apply(self, func: tirx.PrimFunc, target: Target, _: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or target.kind.name != "llvm":
            return None
        sch = s_tir.Schedule(func)
        reductions = get_reduction_blocks(sch, sch.get_child_blocks(get_root_block(sch)))
        main = reductions[0] if reductions else None
        dtype = str(sch.get(main).writes[0].source.dtype) if main else None
        if dtype not in ("float32", "float16"):
            return None
        lanes, regs = vector_shape(target, dtype)
        panel = PANEL_VECTORS if sch.get(main).name_hint.startswith(PANELS) else None  # a tile per weight panel
        if get_index_map(sch.get(main)):
            self._normalize(sch, main)
            if not all(isinstance(sch.get(loop).extent, tirx.IntImm) for loop in sch.get_loops(main)):
                return None
            _, n_i, n_j, _ = (int(sch.get(loop).extent) for loop in sch.get_loops(main))
            mr, nj = register_tile(n_i, -(-n_j // lanes), regs, panel)
            # Pad J to whole vectors, and I to a full register tile where its divisors give a poor one
            # (ViT's 197 tokens would get 1 x 4 vectors: load-bound).
            pad_i = 8 if mr * nj < regs // 2 and n_i > 8 else 1
            if n_j % lanes or n_i % pad_i:
                sch.pad_einsum(main, [1, pad_i, lanes, 1])
                # The padded copy of B is materialised K-major (written in that order), so that the vector
                # loop reads it contiguously.
                b_pad = sch.get(main).reads[1].source
                (b_copy,) = [p for p in sch.get_producers(main) if sch.get(p).writes[0].source.same_as(b_pad)]
                sch.transform_layout(main, ("read", 1), lambda s, j, k: (s, k, j))
                *_, j_loop, k_loop = sch.get_loops(b_copy)
                sch.reorder(k_loop, j_loop)
        elif self._is_vector_matrix(sch, main):
            # Batch-1 heads, C[1, J] = A[1, K] B[K, J]: DLight's analysis drops the unit axes and finds
            # no I; give the loop nest the (S, I, J, K) shape and use the widest vector that divides J.
            *units, j, _ = sch.get_loops(main)
            sch.split(sch.fuse(*units), [None, 1])
            lanes = largest_divisor(int(sch.get(j).extent), (lanes, 8, 4, 2, 1))
        else:
            return None
        _, n_i, n_j, _ = (int(sch.get(loop).extent) for loop in sch.get_loops(main))
        mr, nj = register_tile(n_i, n_j // lanes, regs, panel)

        s, i, j, k = sch.get_loops(main)
        i0, i1 = sch.split(i, [None, mr])
        j0, j1, j2 = sch.split(j, [None, nj, lanes])
        # Each I tile runs over a block of consecutive J tiles whose slice of B fits in B_BLOCK_BYTES (L2), storing
        # its accumulators after each: an output row is written in runs of the block's width, not of one tile's
        # few vectors (a 1x1 conv's GEMM over 56 x 56 pixels writes 4 rows 12.5 KB apart per tile).
        b_bytes = int(sch.get(k).extent) * nj * lanes * tvm.DataType(sch.get(main).reads[1].source.dtype).bits // 8
        j0, jb = sch.split(j0, [None, max(1, min(B_BLOCK_BYTES // b_bytes, int(sch.get(j0).extent)))])
        sch.reorder(s, j0, i0, jb, k, i1, j1, j2)
        tile = sch.fuse(s, j0, i0)
        sch.parallel(tile)

        acc = sch.cache_write(main, 0, "local")
        sch.reverse_compute_at(acc, jb, preserve_unit_loops=True)
        self._inline_producers(sch, main)
        auto_inline_consumer_chain(sch, acc)
        sch.unroll(i1)
        sch.unroll(j1)
        sch.vectorize(j2)
        *_, out_j = sch.get_loops(acc)
        _, out_v = sch.split(out_j, [None, lanes])
        sch.vectorize(out_v)
        init = sch.decompose_reduction(main, k)
        sch.vectorize(sch.get_loops(init)[-1])
        return sch

    @staticmethod
    def _inline_producers(sch: s_tir.Schedule, main: s_tir.schedule.SBlockRV) -> None:
        """Inline fused prologues and the reindexed reads into the GEMM, but keep pad_einsum's padded
        copies as one parallel pass each: inlined, their bounds checks would sit in the vector loop."""

        def producers(block: s_tir.schedule.SBlockRV) -> list:
            direct = sch.get_producers(block)
            return direct + [q for p in direct for q in producers(p)]

        inlined = True
        while inlined:
            inlined = False
            for block in producers(main):
                if sch.get(block).name_hint.endswith("_pad"):
                    continue
                try:
                    sch.compute_inline(block)
                    inlined = True
                except s_tir.ScheduleError:  # not inlinable (e.g. a reduction): stays its own loop nest
                    continue
        for pad in (b for b in sch.get_producers(main) if sch.get(b).name_hint.endswith("_pad")):
            *outer, _ = sch.get_loops(pad)
            sch.parallel(sch.fuse(*outer))

    @staticmethod
    def _is_vector_matrix(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> bool:
        """Unit spatial axes, then one spatial axis J of static extent, then the only reduction axis, over two
        operands (a one-row sum, as a decoding step's RMSNorm has, is not a product)."""
        loops = sch.get_loops(block)
        kinds = [iv.iter_type for iv in sch.get(block).iter_vars]
        extents = [sch.get(loop).extent for loop in loops]
        static = all(isinstance(e, tirx.IntImm) for e in extents)
        out = sch.get(block).writes[0].source
        operands = [r for r in sch.get(block).reads if not r.source.same_as(out)]
        return (
            len(loops) >= 3 and static and all(int(e) == 1 for e in extents[:-2]) and len(operands) == 2
            and kinds.count(tirx.IterVar.CommReduce) == 1 and kinds[-1] == tirx.IterVar.CommReduce
        )

    @staticmethod
    def _normalize(sch: s_tir.Schedule, main: s_tir.schedule.SBlockRV) -> None:
        """C[S, I, J] += A[S, I, K] * B[S, J, K] (the reindexed copies of A and B are inlined later)."""
        reindex = [sch.reindex(main, ("read", 0)), sch.reindex(main, ("read", 1)), sch.reindex(main, ("write", 0))]
        matmul_map, a_map, b_map, c_map = get_index_map(sch.get(main))
        sch.transform_layout(reindex[0], ("write", 0), a_map)
        sch.transform_layout(reindex[1], ("write", 0), b_map)
        sch.transform_layout(reindex[2], ("read", 0), c_map)
        sch.transform_block_layout(main, matmul_map)


def _dense(a: te.Tensor, w: te.Tensor, out_dtype: str, panel: int = 0) -> te.Tensor:
    """a[..., K] @ W accumulated in ``out_dtype``; W is ``w[K, N]``, or (``panel`` > 0) ``w[N / panel, K, panel]``."""
    n_k, n = (w.shape[1], w.shape[0] * panel) if panel else w.shape
    r = te.reduce_axis((0, n_k), "k")

    def b(k, j):
        return w[j // panel, k, j % panel] if panel else w[k, j]

    return te.compute(
        (*a.shape[:-1], n),
        lambda *i: te.sum(a[(*i[:-1], r)].astype(out_dtype) * b(r, i[-1]).astype(out_dtype), axis=r),
        name=PANELS if panel else "matmul",
    )


def panels(w: te.Tensor, panel: int) -> te.Tensor:
    """w[K, N] -> [N / panel, K, panel]: each panel of ``panel`` columns contiguous along K."""
    n_k, n = (int(d) for d in w.shape)
    w = topi.nn.pad(w, [0, 0], [0, -n % panel]) if n % panel else w
    return te.compute((-(-n // panel), n_k, panel), lambda o, k, p: w[k, o * panel + p], name="weight_panels")


def legalize_matmul(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr | None:
    """x @ W with a constant 2-D W, rearranged once at compile time (FoldConstant):

    * CPU, fp32: into panels of ``PANEL_VECTORS`` vectors of columns, each contiguous along K, so that the
      register tile streams one panel instead of reading a row of B per K step N * 4 bytes apart (ViT's FFN
      GEMMs 2.64 -> 2.2 ms, kernel alone); N padded to whole panels (GPT-2's 50257-wide LM head; without the
      padding the rule pads a copy of W on every call);
    * CUDA: N padded to 16-byte rows, which the tensor-core GEMM (``gpu_matmul``) copies with ``cp.async``.

    The product is computed over the padded width and the first N columns kept."""
    weight, target = call.args[1], Target.current(allow_none=True)
    if target is None or not isinstance(weight, tvm.ir.expr.Constant) or len(weight.ty.shape) != 2:
        return None
    n = int(weight.ty.shape[1])
    if target.kind.name == "llvm" and str(call.ty.dtype) == "float32":
        width = PANEL_VECTORS * vector_shape(target, "float32")[0]
        if n < width:
            return None
        stored = bb.emit_te(panels, weight, width, primfunc_name_hint="weight_panels")
        dense = mark_gemm(bb, bb.call_te(_dense, call.args[0], stored, call.ty.dtype, width, primfunc_name_hint="matmul"))
    elif target.kind.name == "cuda" and str(weight.ty.dtype) in MMA_DTYPES:
        width = chunk(str(weight.ty.dtype))
        if n % width == 0 or n < width:
            return None
        padded = bb.emit_te(lambda w: topi.nn.pad(w, [0, 0], [0, -n % width]), weight, primfunc_name_hint="weight_pad")
        dense = bb.call_te(_dense, call.args[0], padded, call.ty.dtype, primfunc_name_hint="matmul")
    else:
        return None
    if n % width == 0:  # no padded columns to drop
        return dense
    full = bb.emit(dense)
    begin, end = [0] * len(call.ty.shape), [int(d) for d in call.ty.shape]
    return bb.call_te(topi.strided_slice, full, begin, end, primfunc_name_hint="slice")
