"""CUDA tensor-core GEMM with its fused epilogue: wgmma on sm_90a, else ``mma.sync``; ``cp.async`` multi-stage pipelines.

DLight's ``Matmul`` rule tensorises fp16 GEMMs with ``wmma`` and no asynchronous copies: on the H200 its
kernels reached 75-106 TFLOP/s on GPT-2's batch-32 GEMMs and were 60-90 % of the model's GPU time
(``benchmarks/results/profile-h200.json``); the TVM wheel has no cuBLAS/CUTLASS to dispatch to. This rule
writes the GEMM at the PTX level with the pieces of the flash-attention kernel (``attention_cuda``):

* sm_90a, fp16 / bf16 (``GemmConfig.wgmma``): two warpgroups each own 64 rows x BN columns as
  ``wgmma.mma_async.m64nBNk16`` from 128-byte swizzled shared tiles (B read MN-major where stored [k, n]), a ring of
  stages running two 64-deep k-tiles ahead with one wgmma group in flight; optionally persistent CTAs whose ring runs
  on across their tiles; or (``GemmConfig.tma``, the rule's choice for tiles of 128 x 128 and wider) warp-specialised:
  a third warpgroup streams A and B in with TMA, the ring's stages handed over on mbarriers, the computing warpgroups
  only wait and issue wgmma (``_with_tma``);
* otherwise one CTA computes a ``BM x BN`` output tile with ``warps_m x warps_n`` warps, each warp ``16 m_tiles``
  rows by ``8 n_tiles`` columns of ``mma.sync.m16n8k16`` fp32 accumulators; A and B tiles of ``BK`` along K stream
  through shared memory with ``cp.async`` into a ``stages``-deep ring (rows padded by 16 bytes: ``ldmatrix`` without
  bank conflicts); B read as stored: ``[.., N, K]`` (K contiguous: a transposed weight) with ``ldmatrix``,
  ``[.., K, N]`` with ``ldmatrix.trans``;
* rows / columns / K past the end are zero-filled by the copies (src-size 0), so any M works, and any K and N that
  fill 16-byte rows;
* fp32 runs as 3xTF32 on ``mma.sync.m16n8k8.tf32``: each operand split into a tf32 high part and the
  remainder, acc += lo*hi + hi*lo + hi*hi (fragments by scalar shared-memory loads; max rel err measured up to
  3.4e-5 at K = 4096, cuBLAS's FP32 SGEMM 2.9e-6);
* the fused epilogue (casts, bias, residual add, activations: whatever FuseOps put after the matmul) is the
  original function's own expression, evaluated per accumulator into a staging tile in shared memory, which
  consecutive threads store row-wise (``GemmConfig.staged``; see ``OP`` in ``kernel``).

``match`` reads the GEMM and its epilogue back from any fused PrimFunc whose one reduction is a (batched)
matmul of fp16/bf16/fp32 operands (a weight shared over the batch folds the batch into M; the columns may be a
conv's output pixels (y, x), ``gpu_conv2d``); what it does not recognise stays with DLight.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import tvm_ffi
from tvm import s_tir, tirx
from tvm.ir import Range
from tvm.ir.expr import TensorLoad
from tvm.s_tir.dlight.analysis import get_root_block
from tvm.s_tir.dlight.base import ScheduleRule
from tvm.script import tirx as T
from tvm.sym import Analyzer
from tvm.target import Target

from .common import (SMEM_BYTES, elem_bytes, has_wgmma, mbarrier_wait, pin, ravel, register_split, sm_count,
                     sm_version, substitute, unravel, uses, wgmma_desc)

MMA_DTYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "tf32"}
_ANALYZER = Analyzer()
TF32_LOW_BITS = 0xFFFFE000  # the bits of an fp32 value a tf32 tensor-core operand keeps (sign, exponent, 10 of mantissa)


def chunk(dtype: str) -> int:
    """Elements per 16-byte ``cp.async``: rows of A and B must be multiples of it."""
    return 4 if dtype == "float32" else 8


@dataclass(frozen=True)
class GemmConfig:
    """CTA tile: ``warps_m x warps_n`` warps of ``16 m_tiles x 8 n_tiles`` outputs; K in steps of ``bk``."""

    warps_m: int = 2
    warps_n: int = 2
    m_tiles: int = 4
    n_tiles: int = 8  # even: one ldmatrix.x4 feeds two n-tiles
    bk: int = 32
    stages: int = 4
    # Hopper (sm_90a, fp16 / bf16): each 4 warps (a warpgroup: warps_m a multiple of 4, m_tiles 1, warps_n 1) run
    # their 64 x bn tile as wgmma.m64nBNk16 from 128-byte swizzled shared tiles (bk = 64: one swizzle row)
    wgmma: bool = False
    persistent: int = 0  # wgmma: this many CTAs, each looping over every persistent-th output tile (0: a CTA a tile)
    staged: bool = True  # the output through shared memory (``OP``), else stored from the accumulators
    group_m: int = 0  # wgmma: tiles numbered down M in bands of this many row tiles (0: along N, a row of tiles at a time)
    # wgmma, one tile a CTA: warp-specialised, one more warpgroup loads A and B with TMA into an mbarrier ring (the
    # computing warpgroups issue no copies and wait on no CTA barrier), as cuBLAS's and CUTLASS's Hopper GEMMs
    tma: bool = False

    @property
    def bm(self) -> int:
        return self.warps_m * self.m_tiles * 16

    @property
    def bn(self) -> int:
        return self.warps_n * self.n_tiles * 8

    @property
    def computing(self) -> int:
        """Threads that hold accumulators."""
        return 32 * self.warps_m * self.warps_n

    @property
    def threads(self) -> int:
        return self.computing + 128 * self.tma  # (the TMA producer: a warpgroup, for setmaxnreg)

    @property
    def name(self) -> str:
        return (f"{self.bm}x{self.bn}x{self.bk}w{self.warps_m}x{self.warps_n}s{self.stages}{'g' if self.wgmma else ''}"
                f"{f'p{self.persistent}' if self.persistent else ''}{'' if self.staged else 'd'}"
                f"{f'm{self.group_m}' if self.group_m else ''}{'t' if self.tma else ''}")


@dataclass(frozen=True)
class GemmSpec:
    """out[batch.., i, j] = epilogue(sum_k A[.., i, k] * B[.., k, j]), read back from a fused PrimFunc."""

    func: tirx.PrimFunc  # the fused function: its parameters and buffers are reused as they are
    a: tirx.Buffer
    b: tirx.Buffer
    out: tirx.Buffer
    batch: tuple[int, ...]  # extents of the output's leading (batch) axes; () where B is shared, folded into m
    m: int
    n: int  # B's columns
    k: int
    n_out: int  # the output's columns: n, or fewer where the epilogue keeps the first ones (a padded weight's)
    b_k_major: bool  # B stored [.., j, k] (K contiguous) rather than [.., k, j]
    a_at: Callable  # (batch values, i, k) -> A's indices
    b_at: Callable  # (batch values, k, j) -> B's indices
    epilogue: Callable  # (fp32 accumulator, batch values, i, j) -> the value stored at out[batch.., i, j]
    out_at: Callable  # (batch values, i, j) -> the output's indices

    @property
    def dtype(self) -> str:
        return str(self.a.dtype)


def _operand(expr) -> TensorLoad | None:
    """The load under an optional Cast to the accumulator type."""
    if isinstance(expr, tirx.Cast):
        expr = expr.value
    return expr if isinstance(expr, TensorLoad) else None


def _at_vars(indices, variables) -> bool:
    """Whether ``indices`` are exactly ``variables``, in order (an element's own position)."""
    return len(indices) == len(variables) and all(i.same_as(v) for i, v in zip(indices, variables))


def _is_param(buf, func: tirx.PrimFunc) -> bool:
    return any(p.same_as(buf) for p in func.params)


def _columns(indices: list, vjs: list, flat) -> int:
    """How many trailing entries of ``indices`` address the GEMM's column: the column's own axes ``vjs``, or one entry
    holding them flattened (``flat``, a conv's patches: y * ow + x); 0 where neither."""
    if _at_vars(indices[-len(vjs):], vjs):
        return len(vjs)
    return int(bool(indices) and len(vjs) > 1 and _ANALYZER.can_prove_equal(indices[-1], flat))


def _axes(spatial: list, nj: int) -> tuple[list, tirx.Var, list]:
    """(batch variables, row variable i, column variables) of a matmul block's spatial iter vars, the last ``nj``
    being the column's axes."""
    return [iv.var for iv in spatial[:-1 - nj]], spatial[-1 - nj].var, [iv.var for iv in spatial[-nj:]]


def _operands(x: TensorLoad, y: TensorLoad, spatial: list, vk: tirx.Var) -> tuple | None:
    """(A, B, whether B is K-major, how many trailing output axes are the GEMM's column j, whether B's rows run past
    them) of the product ``x * y``, A[.., i, k] and B[.., k, j] or B[.., j, k]: j one axis (a matmul), or a conv's
    output pixels (y, x), read as B[.., k, y, x] (its input) or B[.., k, y * ow + x] (its patches, in rows padded to
    16 bytes)."""
    for nj in (1, 2):
        if len(spatial) < nj + 1:
            return None
        _, vi, vjs = _axes(spatial, nj)
        flat = vjs[0] * spatial[-1].dom.extent + vjs[1] if nj > 1 else vjs[0]
        a, b = (x, y) if uses(x.indices[-2], vi) else (y, x)
        if not (a.indices[-2].same_as(vi) and a.indices[-1].same_as(vk)):
            continue
        cols = _columns(b.indices, vjs, flat)
        if cols and len(b.indices) > cols and b.indices[-1 - cols].same_as(vk):
            k_major, b_lead = False, b.indices[:-1 - cols]
        elif b.indices[-1].same_as(vk) and _columns(b.indices[:-1], vjs, flat) == 1:
            k_major, b_lead = True, b.indices[:-2]
        else:
            continue
        if any(uses(i, v) for i in (*a.indices[:-2], *b_lead) for v in (vi, *vjs, vk)):  # leading: batch axes only
            continue
        return a, b, k_major, nj, nj > 1 and cols == 1
    return None


def match(func: tirx.PrimFunc) -> GemmSpec | None:
    """The GEMM and epilogue of ``func``, or None where it is not a fused fp16/bf16/fp32 matmul this kernel covers."""
    sch = s_tir.Schedule(func)
    blocks = list(sch.get_child_blocks(get_root_block(sch)))
    reductions = [i for i, b in enumerate(blocks) if any(iv.iter_type == tirx.IterVar.CommReduce
                                                          for iv in sch.get(b).iter_vars)]
    if len(reductions) != 1:
        return None
    at = reductions[0]
    try:  # prologue (casts, transposes) read in place; epilogue chained into its last block
        for blk in blocks[:at] + blocks[at + 1:-1]:
            sch.compute_inline(blk)
    except Exception:  # noqa: BLE001 - a block that cannot be inlined: not a plain GEMM + elementwise tail
        return None
    func = sch.mod["main"]
    mm = sch.get(blocks[at])
    store, init = mm.body, mm.init
    spatial = [iv for iv in mm.iter_vars if iv.iter_type == tirx.IterVar.DataPar]
    reduce = [iv for iv in mm.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
    if len(reduce) != 1:  # pooling, windows: not a matmul
        return None
    red = reduce[0]
    if (not isinstance(store, tirx.BufferStore) or not isinstance(init, tirx.BufferStore) or len(spatial) < 2
            or not isinstance(init.value, (tirx.FloatImm, tirx.IntImm)) or float(init.value.value) != 0
            or not isinstance(store.value, tirx.Add) or not isinstance(store.value.b, tirx.Mul)):
        return None
    acc_buf = store.buffer
    if not _at_vars(store.indices, [iv.var for iv in spatial]):
        return None
    x, y = _operand(store.value.b.a), _operand(store.value.b.b)
    extents = [iv.dom.extent for iv in (*spatial, red)]
    if x is None or y is None or not all(isinstance(e, tirx.IntImm) for e in extents):
        return None
    vk = red.var
    found = _operands(x, y, spatial, vk)
    if found is None:
        return None
    a, b, k_major, nj, padded = found
    dtype = str(a.source.dtype)
    if dtype not in MMA_DTYPES or str(b.source.dtype) != dtype or not (_is_param(a.source, func) and _is_param(b.source, func)):
        return None
    bvars, vi, vjs = _axes(spatial, nj)
    ext = [int(e) for e in extents]
    batch, m, jext, k = ext[:-2 - nj], ext[-2 - nj], ext[-1 - nj:-1], ext[-1]
    n = int(b.source.shape[-1]) if padded else math.prod(jext)  # (patches: B's padded rows; the output keeps jext)
    if k % chunk(dtype) or (not k_major and n % chunk(dtype)):  # 16-byte rows for cp.async
        return None
    if dtype == "float32" and str(acc_buf.dtype) != "float32":
        return None

    def j_at(j) -> list:  # column j as the output axes it flattens: j itself, or a conv's pixel (y, x)
        return [j] if nj == 1 else unravel(j, jext)

    def indexer(load, second, last):  # second / last: i, k or vjs (the column's axes)
        def at_(bv, p, q):
            vmap = dict(zip(bvars, bv))
            for var, value in ((second, p), (last, q)):
                vmap.update(zip(var, j_at(value)) if isinstance(var, list) else [(var, value)])
            idx = [substitute(i, vmap) for i in load.indices]
            return idx if nj == 1 else [_ANALYZER.simplify(i) for i in idx]  # patches' y * ow + x: back to j
        return at_

    acc_dtype = str(acc_buf.dtype)
    if len(blocks) == at + 1:  # no epilogue: the matmul writes the output
        out, value, out_vars = acc_buf, tirx.BufferLoad(acc_buf, list(store.indices)), [iv.var for iv in spatial]
    else:
        tail = sch.get(blocks[-1])
        if not isinstance(tail.body, tirx.BufferStore):
            return None
        out, value, out_vars = tail.body.buffer, tail.body.value, [iv.var for iv in tail.iter_vars]
        if not _at_vars(tail.body.indices, out_vars) or any(
            iv.iter_type != tirx.IterVar.DataPar for iv in tail.iter_vars
        ):
            return None
    shape = [int(s) for s in out.shape]
    out_outer, n_out = shape[:-nj], math.prod(shape[-nj:])
    if not _is_param(out, func) or out_outer != [*batch, m] or n_out > n or nj > 1 and shape[-nj:] != jext:
        return None
    acc = tirx.Var("acc", "float32")
    foreign = []

    def take_acc(load: TensorLoad):
        if not load.source.same_as(acc_buf):
            if not _is_param(load.source, func):
                foreign.append(load)
            return load
        if not _at_vars(load.indices, out_vars):
            foreign.append(load)
        return acc if acc_dtype == "float32" else tirx.Cast(acc_dtype, acc)

    value = tvm_ffi.structural_map(value, [(TensorLoad, take_acc)])
    if foreign:  # the tail reads the product elsewhere than at its own element, or an intermediate
        return None

    def epilogue(acc_value, bv, i, j):
        return substitute(value, {acc: acc_value, **dict(zip(out_vars, [*bv, i, *j_at(j)]))})

    def out_at(bv, i, j):
        return [*bv, i, *j_at(j)]

    a_at, b_at = indexer(a, vi, vk), indexer(b, vjs, vk) if k_major else indexer(b, vk, vjs)
    if batch and not any(uses(i, v) for i in b.indices for v in bvars):
        # B is shared by the batch (a weight): one GEMM of batch x M rows, not a batch of M-row GEMMs, which
        # would stream B once per batch entry (ViT's [197, 1, 768] tokens: 197 GEMMs of one row each)
        def rows(r) -> tuple[list, object]:  # flat row -> (batch indices, row)
            return unravel(r // m, batch), r % m

        def fold(at):
            return lambda _, r, x: at(*rows(r), x)

        return GemmSpec(func, a.source, b.source, out, (), math.prod(batch) * m, n, k, n_out, k_major, fold(a_at),
                        b_at, lambda acc_value, _, r, j: epilogue(acc_value, *rows(r), j), fold(out_at))
    return GemmSpec(func, a.source, b.source, out, tuple(batch), m, n, k, n_out, k_major, a_at, b_at, epilogue, out_at)


@dataclass(frozen=True)
class TmaView:
    """An operand as TMA copies its tiles: a dense row-major ``[batch, rows, cols]`` block of its buffer."""

    rows: int
    cols: int
    batched: bool  # a block per flat batch index, else one the batch shares (a weight)

    def tensor_map(self, nbatch: int, box_cols: int, box_rows: int, elem: int) -> tuple:
        """``tensormap_encode_tiled``'s dims, byte strides, box and element strides (rank 3)."""
        return (self.cols, self.rows, nbatch if self.batched else 1, self.cols * elem, self.rows * self.cols * elem,
                box_cols, box_rows, 1, 1, 1, 1)


def tma_views(spec: GemmSpec) -> tuple[TmaView, TmaView] | None:
    """A and B as blocks TMA can copy, or None where an operand is not read at its buffer's own row-major positions
    (a transpose or slice the prologue inlined): each read's flat offset must provably be that of its (batch, row,
    column) in such a block."""
    ana = Analyzer()
    bvars = [tirx.Var(f"b{d}", "int32") for d in range(len(spec.batch))]
    i, j, k = (tirx.Var(name, "int32") for name in "ijk")
    for var, extent in (*zip(bvars, spec.batch), (i, spec.m), (j, spec.n_out), (k, spec.k)):
        ana.bind(var, Range(0, extent))
    flat = ravel(bvars, spec.batch)

    def view(buf, indices, row, col, rows, cols) -> TmaView | None:
        offset = ravel(indices, [int(extent) for extent in buf.shape])
        for batched in (False, True) if spec.batch else (False,):
            if ana.can_prove_equal(offset, (flat * rows * cols if batched else 0) + row * cols + col):
                return TmaView(rows, cols, batched)
        return None

    a = view(spec.a, spec.a_at(bvars, i, k), i, k, spec.m, spec.k)
    b = (view(spec.b, spec.b_at(bvars, j, k), j, k, spec.n, spec.k) if spec.b_k_major
         else view(spec.b, spec.b_at(bvars, k, j), k, j, spec.k, spec.n))
    return (a, b) if a and b else None


# from the tile sweep in benchmarks/results/matmul-h200.json: 64 x 64 warp tiles where there is work for every SM;
# smaller CTA tiles (and longer K steps, fewer barriers) for the small-M GEMMs of batch-1 transformers
CONFIGS = (GemmConfig(), GemmConfig(m_tiles=2, n_tiles=4, bk=64, stages=3), GemmConfig(m_tiles=1, n_tiles=4, bk=64, stages=3))
# fp32 (3xTF32): 64 x 32 warp tiles (the split operands double the fragment registers)
CONFIGS_TF32 = (GemmConfig(n_tiles=4, stages=3), GemmConfig(m_tiles=2, n_tiles=4, stages=3),
                GemmConfig(m_tiles=1, n_tiles=4, stages=3))


# sm_90a, fp16 / bf16: two warpgroups of 64 x 256 (64 x 128, 64 x 64) wgmma tiles, 4 stages of 64-deep k-tiles
WGMMA_CONFIGS = tuple(GemmConfig(warps_m=8, warps_n=1, m_tiles=1, n_tiles=n, bk=64, stages=4, wgmma=True)
                      for n in (32, 16, 8))
# one warpgroup's 64 x 64 tiles where two warpgroups' leave SMs idle (M = 192: three row tiles for two); wider ones
# never have more tiles than two warpgroups' of half their width. H100, ResNet-50 b32's conv GEMMs (``rerun/
# resnet-conv-gemm-tiles/``): 512 channels over 32 x 49 pixels 1.27x faster on them than mma.sync's 64 x 64 tiles
WGMMA_ONE = replace(WGMMA_CONFIGS[-1], warps_m=4)
# a wgmma tile whose columns would be more than this much padding over the output's (a conv over 7 x 7 pixels, 56 in
# its B) is passed over where a narrower one pads less. H100, ResNet-50 b32's conv GEMMs (``benchmarks/matmul.py``,
# ``rerun/resnet-conv-gemm-tiles/``): 2048 channels over 32 x 49 pixels 1.50x faster on 128 x 64 than 128 x 256, 512
# channels 1.50x on 128 x 64 than mma.sync's 64 x 64 (the rule then)
COLUMN_PADDING = 1.5
# where the 64 x 256 tiles would leave the last wave of CTAs less than this full: persistent CTAs, one an SM, over 64 x
# 128 tiles in 6 stages (H100, two runs side by side: GPT-2's N = 768 GEMMs, 192 tiles for 132 SMs, 1.09-1.10x; qkv,
# 576 tiles, 1.05-1.09x; mlp up, LM head and the square, whose last waves are >= 97 % full, 0.88-0.95x)
FULL_WAVE = 0.9
# a B (weight) larger than this does not stay in L2 (50 MB on the H100 / H200) while the tiles go along N, each row of
# tiles reading all of it: GPT-2's LM head (77 MB) was read from memory once per 128 rows, 4.9 GB for 8192 rows. Such
# GEMMs go down M in bands whose rows of A fit this (``GemmConfig.group_m``): B is read once a band
L2_OPERAND_BYTES = 16 << 20


def choose(spec: GemmSpec, wgmma: bool = False) -> GemmConfig:
    """The largest tile that still gives every SM a CTA, else the smallest; ``wgmma`` (an sm_90a target) tries its
    tiles first (``WGMMA_ONE`` where two warpgroups' leave SMs idle; a wave ``FULL_WAVE`` full; none much wider than
    the output where a narrower one pads less, ``COLUMN_PADDING``), persistent where its largest tile's last wave
    would be ragged or K is one k-tile, down M in bands where B does not fit L2 (``L2_OPERAND_BYTES``)."""
    configs = CONFIGS_TF32 if spec.dtype == "float32" else (*WGMMA_CONFIGS, WGMMA_ONE, *CONFIGS) if wgmma else CONFIGS
    sms = sm_count()
    least_padded = min((_padded(spec, c.bn) for c in configs if c.wgmma), default=0)
    for cfg in configs:
        if cfg.wgmma and _padded(spec, cfg.bn) > max(COLUMN_PADDING * spec.n_out, least_padded):
            continue
        tiles = math.prod(spec.batch) * -(-spec.m // cfg.bm) * -(-spec.n_out // cfg.bn)
        # (wgmma: a wave 128 of 132 SMs full beat twice the tiles at half the size: ResNet-50's 512 channels over 49
        # pixels 1.18x on 128 x 64 than 64 x 64, 256 over 196 1.16x on 128 x 128 than 64 x 128)
        if tiles >= (FULL_WAVE if cfg.wgmma else 1) * sms:
            # a ragged last wave, or one k-tile a tile (nothing in it to overlap its copies with; H100, three runs:
            # GPT-2's unfused q.k^T, 384 x 256 x 256 x 64, 98-100 TFLOP/s persistent against 72-75, 1.31-1.37x)
            short = tiles / (-(-tiles // sms) * sms) < FULL_WAVE or spec.k <= cfg.bk
            # (its 6 stages and staged output fill the shared memory with a 2-byte output; a 4-byte one does not fit)
            if cfg == WGMMA_CONFIGS[0] and short and elem_bytes(spec.out) == 2:
                cfg = replace(WGMMA_CONFIGS[1], stages=6, persistent=sms)
            return _grouped(spec, _with_tma(spec, cfg)) if cfg.wgmma else cfg
    return configs[-1]


def _with_tma(spec: GemmSpec, cfg: GemmConfig) -> GemmConfig:
    """Two warpgroups' wgmma tile at least 128 columns wide, warp-specialised with TMA where the operands are blocks
    TMA can copy; the persistent tile of a ragged last wave as 128 x 128 in 6 stages, one tile a CTA (but not over
    one k-tile, where the persistent ring overlaps the next tile's copies). H100, ``benchmarks/matmul.py`` twice
    (``rerun/gemm-tma/``: the variants beside the rule before, then this rule beside it): the square 1.23x (without its
    bands) / 1.60x, GPT-2 b32's qkv 1.06x / 0.94x, mlp up 1.04x / 1.04x, mlp down 1.08x / 1.06x, attention projection
    1.00x / 0.99x, LM head 1.13x / 1.20x, ResNet-50's conv GEMMs 0.97-1.11x; batch-32 fp16 models (7 interleaved
    rounds): GPT-2 1.050x, BERT 1.105x, ViT-B/16 1.038x, ResNet-50 1.014x."""
    if cfg.warps_m != 8 or cfg.bn < 128 or tma_views(spec) is None or cfg.persistent and spec.k <= cfg.bk:
        return cfg
    return replace(WGMMA_CONFIGS[1], stages=6, tma=True) if cfg.persistent else replace(cfg, tma=True)


def _padded(spec: GemmSpec, bn: int) -> int:
    """The output's columns rounded up to whole tiles of ``bn``."""
    return -(-spec.n_out // bn) * bn


def _grouped(spec: GemmSpec, cfg: GemmConfig) -> GemmConfig:
    """``cfg`` in bands down M where B is too large to stay in L2, each band's rows of A within ``L2_OPERAND_BYTES``."""
    a_rows, b_bytes = cfg.bm * spec.k * elem_bytes(spec.a), spec.k * spec.n * elem_bytes(spec.b)
    gm = -(-spec.m // cfg.bm)
    if b_bytes <= L2_OPERAND_BYTES or gm == 1:
        return cfg
    return replace(cfg, group_m=max(1, min(gm, L2_OPERAND_BYTES // a_rows)))


def kernel(spec: GemmSpec, cfg: GemmConfig) -> tirx.PrimFunc:
    """The GEMM kernel for ``spec`` as a PrimFunc with the fused function's signature."""
    A, B, out, dtype = spec.a, spec.b, spec.out, spec.dtype
    ab = MMA_DTYPES[dtype]
    M, N, K = spec.m, spec.n, spec.k
    MT, NTL, S, BK = cfg.m_tiles, cfg.n_tiles, cfg.stages, cfg.bk
    BM, BN, NT, NC = cfg.bm, cfg.bn, cfg.threads, cfg.computing
    WM, WN = MT * 16, NTL * 8  # rows / columns per warp
    tf32, WG, TM = dtype == "float32", cfg.wgmma, cfg.tma
    views = tma_views(spec) if TM else None
    assert not TM or (WG and views and cfg.staged and not cfg.persistent), f"TMA: {cfg.name} on these operands"
    CH, KSTEP = chunk(dtype), 8 if tf32 else 16  # elements per 16-byte copy; K per mma
    # padded smem rows (elements): a 16-byte shift per row keeps ldmatrix (and tf32's scalar fragment loads) free of
    # bank conflicts; a [k, n] tile of fp32 is read down its columns, so its rows shift by 8 banks
    AP = BK + CH
    if spec.b_k_major:
        BP, B_ROWS, B_CPR = BK + CH, BN, BK // CH
    else:
        BP, B_ROWS, B_CPR = BN + 8, BK, BN // CH
    A_CPR = BK // CH
    A_STAGE, B_STAGE = (BM * BK, BN * BK) if WG else (BM * AP, B_ROWS * BP)
    assert not WG or (not tf32 and BK == 64 and MT == 1 and cfg.warps_n == 1 and cfg.warps_m % 4 == 0
                      and BN % 64 == 0 and BN <= 256 and A_STAGE * 2 % 1024 == 0), f"wgmma tile {cfg.name}"

    def swizzled(r, c):
        """Offset of element (r, c) of a tile of 64-element (128-byte) rows in wgmma's 128-byte swizzle: the 16-byte
        chunk c / 8 of row r at chunk (c / 8) ^ (r % 8), which wgmma undoes from address bits 7-9 (tiles start
        1024-byte aligned); 8 lanes copying a row's 128 bytes then fill 8 bank groups."""
        return r * 64 + (c // 8 ^ r % 8) * 8 + c % 8

    def a_place(r, c):  # A tile element (row i, k): padded rows, or wgmma's K-major swizzled rows
        return swizzled(r, c) if WG else r * AP + c

    def b_place(r, c):  # B tile element (copy row, column): [n, k] as A; [k, n] for wgmma MN-major, 64 n a block
        if not WG:
            return r * BP + c
        return swizzled(r, c) if spec.b_k_major else c // 64 * (BK * 64) + swizzled(r, c % 64)
    B_OFF = S * A_STAGE
    SMEM = B_OFF + S * B_STAGE
    # ``staged``: the output tile is staged in shared memory (rows padded by 16 bytes: the accumulators' stores
    # free of bank conflicts) and stored row-wise, a warp's lanes on consecutive columns: one L2 write a 32-byte sector
    # where the accumulators' own layout wrote each sector in four partial pieces; in the ring once it is drained, or
    # after it where a persistent CTA's ring holds its next tile's first k-tiles
    IN_BYTES, OUT_BYTES = elem_bytes(A), elem_bytes(out)
    OP = BN + 16 // OUT_BYTES
    STAGE_OFF = SMEM if cfg.persistent else 0  # (elements of the operand type)
    if cfg.staged:
        SMEM = max(SMEM, STAGE_OFF + -(-BM * OP * OUT_BYTES // IN_BYTES))
    # TMA: the ring's mbarriers after the tiles and the staging, full[S] (a stage's bytes are in) and empty[S] (every
    # computing warp is done with it), 8 bytes each
    SMEM = -(-SMEM * IN_BYTES // 8) * 8 // IN_BYTES if TM else SMEM
    FULL, EMPTY = 0, S
    MBAR_BYTES = SMEM * IN_BYTES
    SMEM += 2 * S * 8 // IN_BYTES * TM
    assert SMEM * IN_BYTES <= SMEM_BYTES, f"{cfg.name}: {SMEM * IN_BYTES} bytes of shared memory, more than an SM has"
    nbatch, gm, gn, KT = math.prod(spec.batch), -(-M // BM), -(-spec.n_out // BN), -(-K // BK)
    f32 = "float32"
    assert TM or (BM * A_CPR) % NC == 0 and (B_ROWS * B_CPR) % NC == 0
    assert NTL % 2 == 0 and BK % KSTEP == 0

    # wgmma: the copies' sizes as a select (TVM writes if_then_else as an if / else, a branch, across which ptxas
    # serialises the wgmma in flight); the mma.sync kernels keep the form they were measured with
    fill = T.Select if WG else T.if_then_else

    @T.macro
    def copy_tile(smem, base, src, at, row0, nrows, col0, ncols, rows, cpr, place, bv, tx):
        """cp.async ``rows`` x ``cpr`` 16-byte chunks of a row-major operand (indices ``at(bv, row, col)``) from
        (row0, col0) into smem[base:], element (r, c) at ``place(r, c)``; chunks past (nrows, ncols) read as 0."""
        for it in T.unroll(rows * cpr // NC):
            r = T.meta_var((it * NC + tx) // cpr)
            c = T.meta_var((it * NC + tx) % cpr * CH)
            T.ptx["cp.async.cg.shared.global"](
                smem.ptr_to([base + place(r, c)]),
                src.ptr_to(at(bv, T.min(row0 + r, nrows - 1), T.min(col0 + c, ncols - CH))),
                16,
                T.Cast("uint32", fill(T.And(row0 + r < nrows, col0 + c < ncols), 16, 0)),
            )

    @T.macro
    def load_stage(smem, kt, stage, bv, m0, n0, tx):
        """cp.async the A and B tiles of k-tile ``kt`` into ring slot ``stage``."""
        copy_tile(smem, stage * A_STAGE, A, spec.a_at, m0, M, kt * BK, K, BM, A_CPR, a_place, bv, tx)
        if spec.b_k_major:  # rows are output columns j, chunks along k
            copy_tile(smem, B_OFF + stage * B_STAGE, B, spec.b_at, n0, N, kt * BK, K, B_ROWS, B_CPR, b_place, bv, tx)
        else:  # rows are k, chunks along j
            copy_tile(smem, B_OFF + stage * B_STAGE, B, spec.b_at, kt * BK, K, n0, N, B_ROWS, B_CPR, b_place, bv, tx)

    @T.macro
    def ldmatrix(trans, frag, frag_off, smem, smem_off):
        T.ptx_legacy.ldmatrix(trans, 4, ".b16", frag.data, frag_off, smem.access_ptr("r"), smem_off, dtype=dtype)

    @T.macro
    def split(x, hi, lo, i):
        """x = hi[i] + lo[i] with hi[i] exactly a tf32 value (3xTF32: the three larger partial products are exact)."""
        hi[i] = T.reinterpret(f32, T.bitwise_and(T.reinterpret("uint32", x), T.uint32(TF32_LOW_BITS)))
        lo[i] = x - hi[i]

    @T.macro
    def mma_tf32(a, a_off, b, b_off, c, c_off):
        T.ptx_legacy.mma("m16n8k8", "row", "col", ab, ab, "fp32", a.data, a_off, b.data, b_off, c.data, c_off,
                         False, dtype=f32)

    @T.macro
    def step_tf32(smem, a_base, b_base, kk, wm, wn, lane, acc):
        """One k-step of 8 in fp32 on the tf32 tensor cores: operands split as hi + lo, acc += lo*hi + hi*lo + hi*hi.
        Fragments (g = lane / 4, t = lane % 4): A rows g, g+8 x cols t, t+4; B rows (k) t, t+4 of column g."""
        ah = T.alloc_buffer((MT * 4,), f32, scope="local")
        al = T.alloc_buffer((MT * 4,), f32, scope="local")
        bh = T.alloc_buffer((NTL * 2,), f32, scope="local")
        bl = T.alloc_buffer((NTL * 2,), f32, scope="local")
        for mt in T.unroll(MT):
            for e in T.unroll(4):
                split(smem[a_base + (wm * WM + mt * 16 + lane // 4 + e % 2 * 8) * AP + kk * 8 + lane % 4 + e // 2 * 4],
                      ah, al, mt * 4 + e)
        for nt in T.unroll(NTL):
            for e in T.unroll(2):
                if spec.b_k_major:
                    split(smem[b_base + (wn * WN + nt * 8 + lane // 4) * BP + kk * 8 + lane % 4 + e * 4], bh, bl, nt * 2 + e)
                else:
                    split(smem[b_base + (kk * 8 + lane % 4 + e * 4) * BP + wn * WN + nt * 8 + lane // 4], bh, bl, nt * 2 + e)
        for mt in T.unroll(MT):
            for nt in T.unroll(NTL):
                mma_tf32(al, mt * 4, bh, nt * 2, acc, (mt * NTL + nt) * 4)
                mma_tf32(ah, mt * 4, bl, nt * 2, acc, (mt * NTL + nt) * 4)
                mma_tf32(ah, mt * 4, bh, nt * 2, acc, (mt * NTL + nt) * 4)

    @T.macro
    def step_f16(smem, a_base, b_base, kk, wm, wn, lane, acc):
        """One k-step of 16 on the fp16 / bf16 tensor cores, fragments by ldmatrix."""
        af = T.alloc_buffer((MT * 8,), dtype, scope="local")
        bf = T.alloc_buffer((NTL * 4,), dtype, scope="local")
        # A fragment (16 x 16): rows lane % 16, cols kk*16 + (lane / 16) * 8
        for mt in T.unroll(MT):
            ldmatrix(False, af, mt * 8, smem, a_base + (wm * WM + mt * 16 + lane % 16) * AP + kk * 16 + lane // 16 * 8)
        # B fragments of n-tiles 2 n2, 2 n2 + 1 (registers 0-1 and 2-3 of one ldmatrix.x4)
        for n2 in T.unroll(NTL // 2):
            if spec.b_k_major:
                ldmatrix(False, bf, n2 * 8, smem,
                         b_base + (wn * WN + n2 * 16 + lane // 16 * 8 + lane % 8) * BP + kk * 16 + lane // 8 % 2 * 8)
            else:
                ldmatrix(True, bf, n2 * 8, smem,
                         b_base + (kk * 16 + lane // 8 % 2 * 8 + lane % 8) * BP + wn * WN + n2 * 16 + lane // 16 * 8)
        for mt in T.unroll(MT):
            for nt in T.unroll(NTL):
                T.ptx_legacy.mma("m16n8k16", "row", "col", ab, ab, "fp32", af.data, mt * 8, bf.data, nt * 4,
                                 acc.data, (mt * NTL + nt) * 4, False, dtype=f32)

    @T.macro
    def mainloop_mma(smem, acc, bv, m0, n0, tx, wm, wn, lane):
        """acc += this warp's tile of A B over all of K, mma.sync from a ring of ``S`` stages (S - 1 in flight)."""
        for p in T.unroll(S - 1):  # prologue: k-tiles 0 .. S-2 in flight, one commit group each
            if p < KT:
                load_stage(smem, p, p, bv, m0, n0, tx)
            T.ptx.cp.async_.commit_group()
        for kt in T.serial(KT):
            if kt + S - 1 < KT:  # into the slot read in iteration kt-1 (all warps are past its end barrier)
                load_stage(smem, kt + S - 1, (kt + S - 1) % S, bv, m0, n0, tx)
            T.ptx.cp.async_.commit_group()
            T.ptx.cp.async_.wait_group(S - 1)  # k-tile kt has landed
            T.tvm_storage_sync("shared")
            a_base = T.meta_var(kt % S * A_STAGE)
            b_base = T.meta_var(B_OFF + kt % S * B_STAGE)
            for kk in T.unroll(BK // KSTEP):
                if tf32:
                    step_tf32(smem, a_base, b_base, kk, wm, wn, lane, acc)
                else:
                    step_f16(smem, a_base, b_base, kk, wm, wn, lane, acc)
            T.tvm_storage_sync("shared")
        T.ptx.cp.async_.wait_group(0)

    # wgmma's B: K-major as A ([n, k]: LBO unused, 8-row groups 1024 B apart), or MN-major ([k, n]: blocks of 64 n
    # BK rows of 128 B apart, 8 k 1024 B apart, read transposed)
    B_STRIDES, B_TRANS = ((16, 1024), 0) if spec.b_k_major else ((BK * 128, 1024), 1)

    def b_kstep(kk):  # offset of B's 16 k of wgmma step kk in its stage
        return b_place(0, kk * 16) if spec.b_k_major else b_place(kk * 16, 0)
    wab = {"float16": "f16", "bfloat16": "bf16"}.get(dtype)  # (wgmma's names)
    WGMMA = f"wgmma.mma_async.sync.aligned.m64n{BN}k16.f32.{wab}.{wab}"

    def acc_at(wm, wn, lane, mt, nt, c):
        """(row, column) in the CTA's tile of warp (wm, wn)'s accumulator c of tile (mt, nt): row g + c/2*8, column
        2t + c%2 of the 16 x 8 tile (g = lane / 4, t = lane % 4); wgmma's m64nN accumulators are laid out so too, warp
        w of a warpgroup holding its rows 16 (w % 4).."""
        return wm * WM + mt * 16 + lane // 4 + c // 2 * 8, wn * WN + nt * 8 + lane % 4 * 2 + c % 2

    @T.macro
    def store_staged(smem, acc, bz, m0, n0, wm, wn, tx):
        """The epilogue through shared memory (see ``OP``): each value as ``store_tile`` computes it into the staging
        tile, then stored row-wise by consecutive threads."""
        bv = T.meta_var(unravel(bz, spec.batch))
        lane = T.meta_var(tx % 32)
        stage = T.decl_buffer((BM * OP,), out.dtype, data=smem.data, scope="shared.dyn",
                              elem_offset=STAGE_OFF * IN_BYTES // OUT_BYTES)
        if not cfg.persistent:
            T.ptx.cp.async_.wait_group(0)  # the zero-filled copies past the end land before the ring is written over
        T.tvm_storage_sync("shared")  # every warpgroup is done with the ring / the last tile's staging
        for mt in T.unroll(MT):
            for nt in T.unroll(NTL):
                for c in T.unroll(4):
                    r, col = T.meta_var(acc_at(wm, wn, lane, mt, nt, c))
                    if m0 + r < M and n0 + col < spec.n_out and tx < NC:  # (TMA: not the producer's)
                        stage[r * OP + col] = spec.epilogue(acc[(mt * NTL + nt) * 4 + c], bv, m0 + r, n0 + col)
        T.tvm_storage_sync("shared")
        for it in T.unroll(BM * BN // NC):
            r = T.meta_var((it * NC + tx) // BN)
            col = T.meta_var((it * NC + tx) % BN)
            if m0 + r < M and n0 + col < spec.n_out and tx < NC:
                T.buffer_store(out, stage[r * OP + col], spec.out_at(bv, m0 + r, n0 + col))

    @T.macro
    def store_tile(acc, bz, m0, n0, wm, wn, lane):
        """The epilogue stored from the accumulators' own layout (``acc_at``)."""
        bv = T.meta_var(unravel(bz, spec.batch))
        for mt in T.unroll(MT):
            for nt in T.unroll(NTL):
                for c in T.unroll(4):
                    r, c_ = T.meta_var(acc_at(wm, wn, lane, mt, nt, c))
                    row, col = T.meta_var((m0 + r, n0 + c_))
                    if row < M and col < spec.n_out:
                        T.buffer_store(out, spec.epilogue(acc[(mt * NTL + nt) * 4 + c], bv, row, col),
                                       spec.out_at(bv, row, col))

    # output tiles, numbered with N fastest (CTAs in flight share their A row tile in L2), or (``group_m``) down M in
    # bands of G row tiles: a band's tiles M fastest, so the CTAs in flight share B's column tiles and re-read only
    # the band's rows of A, which stay in L2 (Triton's grouped order; G = gm: column by column)
    TILES, G = nbatch * gm * gn, cfg.group_m
    LOOPED = cfg.persistent > 0 or (not G and spec.n_out % BN == 0)  # see n_tiles
    CTAS = cfg.persistent or TILES

    def tile_origin(t):  # (flat batch index, first row, first column) of output tile t
        if not G:
            bz, bm, bn = unravel(t, (nbatch, gm, gn))
            return bz, bm * BM, bn * BN
        bz, j = t // (gm * gn), t % (gm * gn)
        if G >= gm:  # column by column
            return bz, j % gm * BM, j // gm * BN
        first, at = j // (G * gn) * G, j % (G * gn)
        rows = G if gm % G == 0 else T.min(gm - first, G)  # (the last band's)
        return bz, (first + at % rows) * BM, at // rows * BN

    @T.macro
    def load_step(smem, g, steps, cta, tx):
        """cp.async this CTA's k-step g (its tile g / KT, k-tile g % KT) into ring slot g % S; a step past the CTA's
        ``steps`` starts past M and N: zero-filled, nothing read."""
        bz, m0, n0 = T.meta_var(tile_origin(T.min(cta + g // KT * CTAS, TILES - 1)))
        past = T.meta_var(T.Cast("int32", g >= steps))  # (arithmetic: a select here was compiled to branches)
        load_stage(smem, g % KT, g % S, unravel(bz, spec.batch), m0 + past * M, n0 + past * N, tx)

    @T.macro
    def wgmma_ktile(acc, sbase, slot, kt, warp):
        """This warpgroup's wgmma over the A and B tiles in ring slot ``slot`` (k-tile ``kt`` of its output tile: the
        first overwrites the accumulators, no zeroed registers read), issued as one group; returns once the group
        before it is done."""
        pin(acc, NTL * 4, "float")
        T.ptx["wgmma.fence.sync.aligned"]()
        for kk in T.unroll(BK // 16):
            T.ptx[WGMMA](
                *[acc[i] for i in range(NTL * 4)],
                wgmma_desc(sbase[0], slot * A_STAGE + swizzled(warp // 4 * 64, kk * 16), 16, 1024, True),
                wgmma_desc(sbase[0], B_OFF + slot * B_STAGE + b_kstep(kk), *B_STRIDES, True),
                kt + kk > 0, 1, 1, 0, B_TRANS)
        T.ptx["wgmma.commit_group.sync.aligned"]()
        pin(acc, NTL * 4, "float")
        T.ptx["wgmma.wait_group.sync.aligned"](1)

    @T.macro
    def gemm_wgmma(smem, cta, _bn, _bz, tx, _maps):
        """Output tiles cta, cta + CTAS, ... of 64 x BN per warpgroup, wgmma from a ring of ``S`` stages that runs on
        across the tiles: k-step g is issued while g - 1 may still run (one commit group in flight), so the copies
        run S - 2 steps ahead (into the next tile's first k-tiles while a tile's epilogue stores), into the slot of
        step g - 2, which every warpgroup has waited for by the barrier of step g."""
        acc = T.alloc_buffer((NTL * 4,), f32, scope="local")
        sbase = T.alloc_buffer((1,), "uint32", scope="local")  # the shared buffer's shared-window address
        warp = T.meta_var(tx // 32)
        # a CTA's tiles, 1 without ``persistent``: written as a constant 1 (no loop) where the last column tile is
        # ragged or the tiles go in bands, where the loop made ptxas serialise every wgmma (C7514: the epilogue's
        # bounds branches, GPT-2's LM head; the bands' index arithmetic); elsewhere the loop's form, which ran up to
        # 10 % faster (H100: GPT-2's mlp down, q.k^T)
        n_tiles = T.meta_var((TILES - cta + CTAS - 1) // CTAS if LOOPED else 1)
        sbase[0] = T.cuda.cvta_generic_to_shared(smem.access_ptr("r"))
        for p in T.unroll(S - 2):  # prologue: steps 0 .. S-3 in flight, one commit group each
            load_step(smem, p, n_tiles * KT, cta, tx)
            T.ptx.cp.async_.commit_group()
        for i in T.serial(n_tiles):
            for kt in T.serial(KT):
                g = T.meta_var(i * KT + kt)
                T.ptx.cp.async_.wait_group(S - 3)  # step g has landed
                T.ptx["fence.proxy.async.shared::cta"]()  # cp.async wrote through the generic proxy, wgmma reads async
                T.tvm_storage_sync("shared")
                # no branch around it (ptxas serialises every wgmma across a branch while one is in flight): the
                # steps past the end are zero-filled
                load_step(smem, g + S - 2, n_tiles * KT, cta, tx)
                T.ptx.cp.async_.commit_group()
                wgmma_ktile(acc, sbase, g % S, kt, warp)
            T.ptx["wgmma.wait_group.sync.aligned"](0)
            pin(acc, NTL * 4, "float")
            bz, m0, n0 = T.meta_var(tile_origin(cta + i * CTAS))
            if cfg.staged:
                store_staged(smem, acc, bz, m0, n0, warp, 0, tx)
            else:
                store_tile(acc, bz, m0, n0, warp, 0, tx % 32)
        T.ptx.cp.async_.wait_group(0)

    # setmaxnreg (TMA): the producer warpgroup gives its registers to the computing ones, which give them back for the
    # epilogue (one computing warpgroup has 255 a thread without it)
    NW = max(1, NC // 128)  # computing warpgroups
    MOVE_REGS = NW > 1
    EVEN_REGS, CONSUMER_REGS, PRODUCER_REGS = register_split(NT, NW)
    CW = NC // 32  # computing warps: each releases a stage once its wgmma have read it

    def mbar(sbase, i):  # shared-window address of mbarrier i
        return sbase[0] + T.Cast("uint32", MBAR_BYTES + i * 8)

    @T.macro
    def tma_copy(sbase, tmap, off, col, row, bz, bar):
        """TMA: the box at (col, row) of batch block ``bz`` -> the tile at element ``off``, completing on ``bar``."""
        T.ptx.cp(sbase[0] + T.Cast("uint32", off * IN_BYTES), T.reinterpret(T.handle().ty, T.address_of(tmap)),
                 T.Cast("int32", col), T.Cast("int32", row), T.Cast("int32", bz), bar,
                 "async", "bulk", "tensor", "3d", "shared::cluster", "global", "", "mbarrier::complete_tx::bytes",
                 "", "", "", "")

    @T.macro
    def gemm_tma(smem, cta, _bn, _bz, tx, maps):
        """Output tile ``cta``, warp-specialised: the last warpgroup's first thread streams the k-tiles into the ring
        with TMA (a stage refilled once every computing warp has released it), the computing warpgroups wait for each
        stage's bytes and run wgmma on it, one group in flight, releasing a stage once the group that read it is done.
        Rows, columns and K past the operands' ends are zero-filled by TMA."""
        acc = T.alloc_buffer((NTL * 4,), f32, scope="local")
        sbase = T.alloc_buffer((1,), "uint32", scope="local")
        done = T.alloc_buffer((1,), "uint32", scope="local")
        warp = T.meta_var(tx // 32)
        bz, m0, n0 = T.meta_var(tile_origin(cta))
        a_bz, b_bz = T.meta_var([bz if v.batched else 0 for v in views])
        sbase[0] = T.cuda.cvta_generic_to_shared(smem.access_ptr("r"))
        if tx == 0:
            for i in T.unroll(S):
                T.ptx["mbarrier.init.shared::cta.b64"](mbar(sbase, FULL + i), T.uint32(1))
                T.ptx["mbarrier.init.shared::cta.b64"](mbar(sbase, EMPTY + i), T.uint32(CW))
            T.ptx["fence.mbarrier_init.release.cluster"]()
        T.tvm_storage_sync("shared")
        if warp >= CW:
            if MOVE_REGS:
                T.ptx["setmaxnreg.dec.sync.aligned.u32"](PRODUCER_REGS)
            if tx == NC:
                for kt in T.serial(KT):
                    if kt >= S:  # the stage's previous k-tile (kt - S) released by every computing warp
                        mbarrier_wait(done, mbar(sbase, EMPTY + kt % S), 1 - kt // S % 2)
                    T.ptx["mbarrier.arrive.expect_tx.shared::cta.b64"](
                        mbar(sbase, FULL + kt % S), T.uint32((A_STAGE + B_STAGE) * IN_BYTES))
                    tma_copy(sbase, maps[0], kt % S * A_STAGE, kt * BK, m0, a_bz, mbar(sbase, FULL + kt % S))
                    if spec.b_k_major:
                        tma_copy(sbase, maps[1], B_OFF + kt % S * B_STAGE, kt * BK, n0, b_bz, mbar(sbase, FULL + kt % S))
                    else:  # one box per 64 columns (b_place's blocks)
                        for cb in T.unroll(BN // 64):
                            tma_copy(sbase, maps[1], B_OFF + kt % S * B_STAGE + cb * (BK * 64), n0 + cb * 64, kt * BK,
                                     b_bz, mbar(sbase, FULL + kt % S))
            T.ptx["bar.sync"](T.uint32(1), T.uint32(NT))  # the computing warps have given their registers back
            if MOVE_REGS:
                T.ptx["setmaxnreg.inc.sync.aligned.u32"](EVEN_REGS)
        else:
            if MOVE_REGS:
                T.ptx["setmaxnreg.inc.sync.aligned.u32"](CONSUMER_REGS)
            for kt in T.serial(KT):
                mbarrier_wait(done, mbar(sbase, FULL + kt % S), kt // S % 2)
                wgmma_ktile(acc, sbase, kt % S, kt, warp)  # (k-tile kt - 1's group is done: its stage is free)
                if T.And(kt > 0, tx % 32 == 0):
                    T.ptx["mbarrier.arrive.shared::cta.b64"](mbar(sbase, EMPTY + (kt + S - 1) % S))
            T.ptx["wgmma.wait_group.sync.aligned"](0)
            pin(acc, NTL * 4, "float")
            if MOVE_REGS:
                T.ptx["setmaxnreg.dec.sync.aligned.u32"](EVEN_REGS)
            T.ptx["bar.arrive"](T.uint32(1), T.uint32(NT))
        store_staged(smem, acc, bz, m0, n0, warp, 0, tx)

    @T.macro
    def gemm_mma(smem, bm, bn, bz, tx, _maps):
        """Output tile (bm, bn, bz), mma.sync."""
        acc = T.alloc_buffer((MT * NTL * 4,), f32, scope="local")
        warp = T.meta_var(tx // 32)
        lane = T.meta_var(tx % 32)
        wm = T.meta_var(warp // cfg.warps_n)
        wn = T.meta_var(warp % cfg.warps_n)
        m0 = T.meta_var(bm * BM)
        n0 = T.meta_var(bn * BN)
        bv = T.meta_var(unravel(bz, spec.batch))
        for i in T.unroll(MT * NTL * 4):
            acc[i] = T.float32(0)
        mainloop_mma(smem, acc, bv, m0, n0, tx, wm, wn, lane)
        if cfg.staged:
            store_staged(smem, acc, bz, m0, n0, wm, wn, tx)
        else:
            store_tile(acc, bz, m0, n0, wm, wn, lane)

    gemm = gemm_tma if TM else gemm_wgmma if WG else gemm_mma

    @T.macro
    def cta(bm, bn, bz, tx, maps):
        """The CTA's shared buffer, then its output tile (bm, bn, bz); wgmma: its tiles from its number, ``bm``; TMA:
        the operands' tensor maps ``maps``."""
        with T.sblock("gemm"):
            T.reads()
            T.writes()
            # named per dtype: kernels of both types can share one CUDA module (extern __shared__ names must agree)
            if dtype == "float16":
                gemm_f16 = T.alloc_buffer((SMEM,), dtype, scope="shared.dyn")
                gemm(gemm_f16, bm, bn, bz, tx, maps)
            elif dtype == "float32":
                gemm_f32 = T.alloc_buffer((SMEM,), dtype, scope="shared.dyn")
                gemm(gemm_f32, bm, bn, bz, tx, maps)
            else:
                gemm_bf16 = T.alloc_buffer((SMEM,), dtype, scope="shared.dyn")
                gemm(gemm_bf16, bm, bn, bz, tx, maps)

    if TM:  # (a prim_func is parsed where it is defined: only the one used)
        # the host encodes A's and B's tensor maps (boxes of 64 columns: one 128-byte swizzled row each) for the
        # kernel; __launch_bounds__(NT, 1) lets ptxas honour setmaxnreg
        a_map = views[0].tensor_map(nbatch, BK, BM, IN_BYTES)
        b_map = views[1].tensor_map(nbatch, BK, BN, IN_BYTES) if spec.b_k_major else views[1].tensor_map(nbatch, 64, BK, IN_BYTES)

        @T.prim_func(private=True, s_tir=True, check_well_formed=False)
        def template():
            ta: T.let[T.TensorMap()] = T.tvm_stack_alloca("tensormap", 1)
            tb: T.let[T.TensorMap()] = T.tvm_stack_alloca("tensormap", 1)
            T.tensormap_encode_tiled(ta, A.data, *a_map, descriptor_dtype=dtype, rank=3, swizzle=3)
            T.tensormap_encode_tiled(tb, B.data, *b_map, descriptor_dtype=dtype, rank=3, swizzle=3)
            for c in T.thread_binding(CTAS, thread="blockIdx.x"):
                for tx in T.thread_binding(NT, thread="threadIdx.x"):
                    with T.attr(0, "tirx.launch_bounds_min_blocks_per_sm", 1):
                        cta(c, 0, 0, tx, (ta, tb))
    elif WG:
        @T.prim_func(private=True, s_tir=True, check_well_formed=False)
        def template():
            for c in T.thread_binding(CTAS, thread="blockIdx.x"):
                for tx in T.thread_binding(NT, thread="threadIdx.x"):
                    cta(c, 0, 0, tx, None)
    else:
        @T.prim_func(private=True, s_tir=True, check_well_formed=False)
        def template():
            for bn in T.thread_binding(gn, thread="blockIdx.x"):  # CTAs in flight share their A row tile in L2
                for bm in T.thread_binding(gm, thread="blockIdx.y"):
                    for bz in T.thread_binding(nbatch, thread="blockIdx.z"):
                        for tx in T.thread_binding(NT, thread="threadIdx.x"):
                            cta(bm, bn, bz, tx, None)

    return spec.func.with_body(template.body)


class GpuMatmul(ScheduleRule):
    """A fused fp16/bf16/fp32 (batched) matmul on sm_80+ -> the tensor-core GEMM kernel."""

    def apply(self, func: tirx.PrimFunc, target: Target, _: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or target.kind.name != "cuda":
            return None
        if sm_version(target) < 80:
            return None
        spec = match(func)
        if spec is None:
            return None
        return s_tir.Schedule(kernel(spec, choose(spec, has_wgmma(target))))
