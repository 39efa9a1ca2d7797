"""Softmax / LogSoftmax: legalisation to a canonical [rows, cols] kernel and its schedules.

``legalize_softmax`` / ``legalize_log_softmax`` (``schedules.LEGALIZE``) move the softmax axis last,
view the tensor as ``rows x cols`` and call ``softmax_tir.canonical``, marked ``tvmpipe.kernel`` and
opaque so that FuseOps keeps it whole. ``Softmax`` (``schedules.RULES``) recognises that PrimFunc and
schedules it (float32, float16 or bfloat16), choosing by row length and dtype:

CUDA (``CudaPlan``; 128-bit vectors where the row length allows, float32 accumulation, exponentials on the bare
``ex2.approx.ftz`` instruction):
- short rows: ``lanes`` <= 32 threads (part of a warp) per row, several rows per block, row in registers,
  warp-shuffle reductions (``softmax_tir.cuda_rows``, a definition scheduled here);
- longer rows: one block per row, the block kernel ``softmax_tir.cuda_stream`` (hand-written CUDA-level TIR,
  row in aligned vectors of the flat tensor, so an odd row length (50257) keeps 128-bit accesses). A row that
  fits one step of the block's registers stays there (``cache="local"``), each element exponentiated once;
  a longer one streams (``cache="l2"``): an online (max, sum) pass, then a normalising pass that takes the
  row's last step from registers, its first ``cached`` steps from shared memory (requested all at once with
  cp.async in pass 1) and the rest from L2. Two blocks of <= 512 threads per SM with ~110 KB of cache each,
  or one of <= 1024 threads with ~220 KB where there are no more rows than SMs or only that holds the row on
  chip. A float16 / bfloat16 softmax whose blocks run in one wave keeps exp(x - m) of its on-chip steps in
  place of x (``kept_exp``), so pass 2 does not exponentiate them again. (TVM's own block reductions leave their
  result in volatile shared memory, re-read for every element, and CUDA then divides per element: the reason
  these rows do not use a scheduled definition.)
- fewer rows than half the SMs, rows over 64 KB or a tensor of 4 MB or more: each row split over ``chunks`` blocks
  (16 KB chunks, rows x chunks <= SMs so that all are resident) of the same kernel: each caches its chunk,
  publishes its (max, sum), takes its row's others and normalises its chunk from chip (one read of the input, one
  write; 16 x 1M on the H200: 1.12-1.17x the two kernels it replaces, which read the input twice);
- on sm_90+, for rows that no block holds on chip (float32 over ~290 KB): the same split in chunks of at most
  256 KB, which a 1024-thread block holds, over a ring of as many blocks as the SMs hold (``grid``), each taking
  its chunks in turn and reading the next while it writes the current (H100: 128 x 131072 1.04x a thread-block
  cluster per row); and where the plan would be one wave of 1024-thread blocks (the split of 16 x 1M, float16 rows
  of 128-256 KB), the same ring of 512-thread blocks, two per SM, over chunks of at most 128 KB, where that loads no
  SM more (H100: 16 x 1M float32 1.11x the one-wave split, float16 1.02-1.03x, 128 x 131072 float16 1.01x).
H200, same run, against the previous kernels (expf / exp2f, a scheduled block per row, no cp.async): float16
1.15-1.34x on the benchmark's shapes above 1024 columns (4096 x 4096 0.81 -> 0.99 of copy bandwidth, 4096 x
50257 0.74 -> 0.93), float32 1.01-1.16x (4096 x 50257, now one 1024-thread block per SM, 0.80 -> 0.93).
CPU: parallel over rows; per row a vectorised max pass, sum-of-exp pass and normalise pass, so the row is
read from memory once while it fits in cache; the exp pass prefetches the next row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx
from tvm.s_tir.dlight.base import ScheduleRule
from tvm.target import Target

from . import softmax_tir
from .common import cuda_arch, sm_count

KINDS = ("softmax", "log_softmax")
DTYPES = ("float32", "float16", "bfloat16")
KERNEL_ATTR = "tvmpipe.kernel"
_OPAQUE = 8  # relax OpPatternKind.kOpaque: FuseOps fuses nothing into this kernel

_REGS = 32  # float32 registers per thread for the cached row slice (ptxas: no spills at 1024 threads)
# Split rows over blocks when there are fewer than half as many rows as SMs and a row is longer than one step of a
# 1024-thread block (64 KB; shorter rows stay in registers) or the tensor is >= 4 MB; into 16 KB chunks (one step of
# 256 threads), or as many as the SMs hold. H200, same run (benchmarks/softmax.py FEW_ROWS_SHAPES): next-token
# softmax over a vocabulary (batch 1 or 8, 50257-262144 columns) 1.2-4.3x one block per row, 16 KB chunks the
# fastest of those tried (also 64 KB, and a block per SM); rows of 16-64 KB 19-114 % slower split.
_SPLIT_BYTES, _SPLIT_ROW_BYTES, _CHUNK_BYTES = 4 << 20, 64 << 10, 16 << 10
_STREAM_LANES, _STREAM_VECTORS = 512, 4  # block kernel: threads per row, vectors per thread and step
# Block kernel: shared memory its row caches may take per block of 512 threads: half an SM's (sm_90: 228 KB), so
# two blocks share an SM (one's reductions overlap the other's loads) and the rest of their rows in flight fits L2.
_STREAM_CACHE_BYTES = 110 << 10
# On sm_90+, rows that no block holds on chip (float32 over ~290 KB, 128 x 131072: before, a thread-block cluster of 2
# blocks per row) and a split whose one wave of chunks is not held on chip take the ring (``ring_plan``): chunks of at
# most _RING_STEPS steps of a 1024-thread block (256 KB: 3 in shared memory, the last in registers), over as many
# blocks as the SMs hold in the fewest turns (a multiple of the chunks, so that a row's chunks are taken in the same
# turn; 128 x 131072: 128 blocks, not 132 in turns of 66 and 62 rows, 1.03x), each block reading its next chunk while
# it writes the current. H100, three runs (rerun/softmax-waves/), per-round medians against the rule before: 16 x 1M
# float32 1.081-1.083x (0.84 -> 0.90 of copy; the same chunks in two waves of blocks without the ring 1.067-1.069x),
# 128 x 131072 float32 1.043-1.045x (0.91 -> 0.95; without a cluster, in two waves, 1.00x). Where the plan would be
# one wave of 1024-thread blocks, one per SM (the split, and rows only such a block holds), the ring of 512-thread
# blocks, two per SM, over chunks of _RING_STEPS steps of 32 KB, where that puts no more of the rows on any SM
# (``_paired_ring``): one block's exchange and barriers overlap the other's streaming. H100, per-round medians against
# the rule before (rerun/softmax-waves/ run 4, rerun/softmax-ring512/ two runs): 16 x 1M float32 1.025-1.030x (0.90 ->
# 0.92 of copy), float16 (one turn, without the kept exponentials) 16 x 1M 1.014-1.015x, 128 x 131072 1.011-1.012x.
# Rows no block holds keep 1024 threads: 128 x 131072 float32 in 4 chunks of 128 KB 0.985-0.988x its 2 of 256 KB.
# (float16 in 64 KB chunks lost: 0.91-0.93x.)
_RING_STEPS = 4
# CPU: prefetch the next row during the exp pass up to a row size, so that its memory reads overlap the exp
# arithmetic. On the AMD EPYC (znver5) up to 256 KB (64 x 50257 float32: -10 %; a 1 MB row, x, y and the next x, no
# longer fits in L2: +10 %); on the Intel Xeon (emeraldrapids), whose own prefetchers keep up with longer rows, up to
# 8 KB (rerun/softmax-cpu-prefetch/run1.json, three runs: without it 0.68-0.90x at 4-8 KB rows, 1.13-1.23x at 16 KB,
# 0.89-1.17x at 64-128 KB, 1.10-1.13x at 200 KB). Other CPUs take the Intel limit (the smaller).
_PREFETCH_ROW_BYTES = {"znver": 256 << 10}
_PREFETCH_ROW_BYTES_ELSE = 8 << 10


# ---------------------------------------------------------------- legalisation


def _legalize(kind: str):
    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        ty = call.args[0].ty
        dtype = str(ty.dtype.dtype) if ty.dtype is not None else ""
        shape = [int(d) if isinstance(d, tirx.IntImm) else None for d in getattr(ty.shape, "values", None) or []]
        if dtype not in DTYPES or not shape or None in shape or not 0 < math.prod(shape) < 2**31:
            # TVM's own lowering: float64, dynamic shapes, empty or int64-indexed tensors
            return call.op.get_attr("FLegalize")(bb, call)
        ndim = len(shape)
        axis = int(call.attrs.axis) % ndim
        perm = [i for i in range(ndim) if i != axis] + [axis]
        cols = shape[axis]
        rows = math.prod(shape) // cols
        x = call.args[0] if axis == ndim - 1 else relax.op.permute_dims(call.args[0], perm)
        x = x if ndim == 2 else relax.op.reshape(x, (rows, cols))
        func = softmax_tir.canonical(rows, cols, dtype, kind).with_attrs({KERNEL_ATTR: kind, "op_pattern": _OPAQUE})
        y = relax.call_tir(bb.add_func(func, kind), [x], relax.TensorType((rows, cols), dtype))
        y = y if ndim == 2 else relax.op.reshape(y, [shape[i] for i in perm])
        return y if axis == ndim - 1 else relax.op.permute_dims(y, [perm.index(i) for i in range(ndim)])

    return legalize


legalize_softmax = _legalize("softmax")
legalize_log_softmax = _legalize("log_softmax")


# ---------------------------------------------------------------- CUDA plans


@dataclass(frozen=True)
class CudaPlan:
    """How a row is spread over threads: ``lanes`` threads x ``per_thread`` vectors of ``vec`` elements
    per row, per step of the block kernel or per chunk of a row when ``chunks`` > 1; ``rows_per_block`` rows
    per thread block (the warp kernel); the row held in registers (``cache`` "local") or streamed ("l2")."""

    lanes: int
    vec: int
    per_thread: int
    rows_per_block: int = 1
    cache: str = "local"
    chunks: int = 1
    cached: int = 0  # block kernel: a row's first steps also kept in shared memory (not re-read from L2)
    kept_exp: bool = True  # block kernel, streamed float16 / bfloat16 softmax: exp(x - m) kept on chip, not recomputed
    cluster: bool = False  # split (sm_90+): a row's chunks launched as one thread-block cluster (resident together)
    grid: int = 0  # block kernel: this many blocks, taking rows or chunks in turn, reading the next while writing one


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _vec_budget(vec: int) -> int:
    """Vectors a thread can cache within ``_REGS`` registers (as float32: exp(x - max) is kept)."""
    return max(1, _REGS // vec)


def _block_plan(nvec: int, vec: int, max_lanes: int) -> CudaPlan:
    """Whole-block layout for ``nvec`` vectors: the fewest lanes (a multiple of 32) whose threads' register
    budget holds them, so that blocks stay small (several per SM) with many bytes in flight per thread."""
    lanes = min(max_lanes, _ceil(_ceil(nvec, _vec_budget(vec)), 32) * 32)
    return CudaPlan(lanes, vec, _ceil(nvec, lanes))


def cuda_plan(rows: int, cols: int, dtype: str, arch: str, split: bool = True) -> CudaPlan:
    """Pick the CUDA layout for a [rows, cols] softmax (see the module docstring); ``split=False``: not the split."""
    itemsize = tvm.DataType(dtype).bits // 8
    vec = math.gcd(cols, 16 // itemsize)  # 16 bytes when the row length keeps rows 16-byte aligned
    nvec = cols // vec
    sms = sm_count(arch)
    if nvec <= 32 * _vec_budget(vec):  # fits a warp: <= 32 lanes per row
        lanes = min(32, 1 << (_ceil(nvec, 4) - 1).bit_length())  # about 4 vectors per thread
        return CudaPlan(lanes, vec, _ceil(nvec, lanes), rows_per_block=max(1, 256 // lanes))
    row_bytes = cols * itemsize
    ring = split and cuda_arch(arch)[0] >= 90
    if split and rows < sms // 2 and (row_bytes > _SPLIT_ROW_BYTES or rows * row_bytes >= _SPLIT_BYTES):
        plan = split_plan(rows, cols, dtype, sms)  # (a block per row would leave most SMs idle)
        steps = _ceil(_ceil(softmax_tir.stream_vectors(cols, plan.vec), plan.chunks), plan.lanes * plan.per_thread)
        return (ring and (_paired_ring(rows, cols, dtype, sms, plan)
                          or (plan.cached + 1 < steps and ring_plan(rows, cols, dtype, sms)))) or plan
    whole = _block_plan(nvec, vec, 1024)
    # (a row too long for the registers needs all 1024 lanes, so "more than 512 lanes" covers it)
    if vec < 16 // itemsize or whole.lanes > 512:
        touched = softmax_tir.stream_vectors(cols, 16 // itemsize)
        if ring and touched > _on_chip_vectors(2 * _STREAM_LANES):  # (a row no block holds on chip)
            return ring_plan(rows, cols, dtype, sms) or _stream_plan(rows, touched, 16 // itemsize, sms)
        plan = _stream_plan(rows, touched, 16 // itemsize, sms)
        return (ring and _paired_ring(rows, cols, dtype, sms, plan)) or plan
    return whole


def ring_plan(rows: int, cols: int, dtype: str, sms: int, lanes: int = 2 * _STREAM_LANES) -> CudaPlan | None:
    """The ring split (``_RING_STEPS``): rows in the fewest chunks a block of ``lanes`` threads holds on chip, over a
    grid of blocks (1024 // ``lanes`` per SM) that take them in the fewest turns; None where one block holds a row or
    a row needs more chunks than the SMs hold blocks."""
    vec = 16 // (tvm.DataType(dtype).bits // 8)
    slots = sms * (2 * _STREAM_LANES // lanes)
    touched, step = softmax_tir.stream_vectors(cols, vec), lanes * _STREAM_VECTORS
    chunks = _ceil(touched, _RING_STEPS * step)
    if not 1 < chunks <= slots:
        return None
    turns = _ceil(rows * chunks, slots // chunks * chunks)
    steps = _ceil(_ceil(touched, chunks), step)  # (>= 3: a chunk is over half the _RING_STEPS)
    return CudaPlan(lanes, vec, _STREAM_VECTORS, cache="l2", chunks=chunks, cached=steps - 1, kept_exp=False,
                    grid=_ceil(_ceil(rows * chunks, turns), chunks) * chunks)


def _paired_ring(rows: int, cols: int, dtype: str, sms: int, plan: CudaPlan) -> CudaPlan | None:
    """The ring of 512-thread blocks in place of ``plan``, one wave of 1024-thread blocks (``_RING_STEPS``), where it
    puts two on some SMs and no more of the rows on any SM than ``plan`` does (8 rows of 1 MB on 40 SMs: 5 chunks of
    205 KB, one per SM, not 8 of 128 KB, two on 24 SMs)."""
    if plan.lanes != 2 * _STREAM_LANES or rows * plan.chunks > sms:
        return None
    ring = ring_plan(rows, cols, dtype, sms, _STREAM_LANES)
    if ring is None or ring.grid <= sms:
        return None
    turns = _ceil(rows * ring.chunks, ring.grid)
    return ring if 2 * turns * plan.chunks <= ring.chunks else None  # (an SM's share: 2 * turns / ring.chunks of a row)


def split_plan(rows: int, cols: int, dtype: str, sms: int, chunks: int | None = None) -> CudaPlan:
    """Each row over ``chunks`` blocks (by default of ``_CHUNK_BYTES`` each, at most as many as the SMs hold at once:
    they exchange partials, so all must be resident), each chunk laid out like a streamed row."""
    vec = 16 // (tvm.DataType(dtype).bits // 8)  # 16-byte vectors
    chunks = chunks or min(sms // rows, _ceil(cols * 16 // vec, _CHUNK_BYTES))
    return _stream_plan(rows * chunks, _ceil(softmax_tir.stream_vectors(cols, vec), chunks), vec, sms, chunks)


def _on_chip_vectors(lanes: int) -> int:
    """16-byte vectors a block kernel of ``lanes`` threads holds on chip: its shared-memory cache + one step in
    registers."""
    return _STREAM_CACHE_BYTES * lanes // _STREAM_LANES // 16 + lanes * _STREAM_VECTORS


def _stream_plan(blocks: int, touched: int, vec: int, sms: int, chunks: int = 1) -> CudaPlan:
    """The block kernel's layout for ``blocks`` blocks (rows, or chunks of rows), each over ``touched`` 16-byte
    vectors of ``vec`` elements: two blocks of <= 512 threads per SM, or one of <= 1024 threads with all of the shared
    memory for its cache where there are no more blocks than SMs, or where only such a block holds its part of the
    row on chip; a part that fits one step stays in registers (at least two warps: <= 32 lanes is the warp kernel)."""

    # (kept exponentials pay where all blocks reach pass 2 together, with no other block's loads to hide it under:
    # one wave. H200, same runs: 128 x 131072 / 16 x 1M float16 +1-3 % / +6 %, 1024 x 32768 -1 % (8 waves))
    one_wave = blocks <= sms
    wide = one_wave or _on_chip_vectors(_STREAM_LANES) < touched <= _on_chip_vectors(2 * _STREAM_LANES)
    lanes = min(2 * _STREAM_LANES if wide else _STREAM_LANES, max(64, _ceil(_ceil(touched, _STREAM_VECTORS), 32) * 32))
    step = lanes * _STREAM_VECTORS  # vectors a block reads per step
    if touched <= step:
        return CudaPlan(lanes, vec, _STREAM_VECTORS, chunks=chunks, kept_exp=one_wave)
    # (the last step stays in registers)
    cached = min(_ceil(touched, step) - 1, _STREAM_CACHE_BYTES * lanes // _STREAM_LANES // (step * 16))
    return CudaPlan(lanes, vec, _STREAM_VECTORS, cache="l2", chunks=chunks, cached=cached, kept_exp=one_wave)


def _schedule(func: tirx.PrimFunc, kind: str) -> s_tir.Schedule:
    """A schedule of a tiled definition, keeping the kernel's name tag."""
    return s_tir.Schedule(func.with_attr(KERNEL_ATTR, kind))


def _thread_slice(sch: s_tir.Schedule, block, plan: CudaPlan, vectorize: bool) -> None:
    """Loops (j, l, v) of a block computed at the row level: l -> threadIdx.x, j unrolled, v
    vectorised (loads) or unrolled (reductions, which need the thread loop outermost)."""
    j, lane, v = sch.get_loops(block)[-3:]
    sch.reorder(*((j, lane, v) if plan.per_thread == 1 else (lane, j, v)))
    sch.bind(lane, "threadIdx.x")
    sch.unroll(j)
    (sch.vectorize if vectorize else sch.unroll)(v)


def _schedule_store(sch: s_tir.Schedule) -> None:
    """store (l -> threadIdx.x, vector stores) with normalize computed per vector into registers."""
    store, norm = sch.get_sblock("store"), sch.get_sblock("normalize")
    *_, j, lane, v = sch.get_loops(store)
    sch.reorder(lane, j, v)
    sch.bind(lane, "threadIdx.x")
    sch.unroll(j)
    sch.vectorize(v)
    sch.compute_at(norm, j, preserve_unit_loops=True)
    sch.unroll(sch.get_loops(norm)[-1])
    sch.set_scope(norm, 0, "local")


def schedule_cuda(rows: int, cols: int, dtype: str, kind: str, plan: CudaPlan) -> s_tir.Schedule:
    """The CUDA schedule of ``plan`` (``cuda_plan``) for a [rows, cols] softmax."""
    if plan.cache == "l2" or plan.lanes > 32:  # the block kernel, a kernel already: nothing to schedule
        return _schedule(softmax_tir.cuda_stream(rows, cols, dtype, kind, plan.lanes, plan.vec, plan.per_thread,
                                                 plan.cached, plan.chunks, plan.kept_exp, plan.cluster,
                                                 plan.grid), kind)
    sch = _schedule(softmax_tir.cuda_rows(rows, cols, dtype, kind, plan.lanes, plan.vec, plan.per_thread), kind)
    r = sch.get_loops(sch.get_sblock("store"))[0]
    bx, ty = sch.split(r, [None, plan.rows_per_block])
    sch.bind(bx, "blockIdx.x")
    sch.bind(ty, "threadIdx.y")
    _schedule_store(sch)
    for name in ("row_sum", "exp", "row_max", "load"):
        block = sch.get_sblock(name)
        sch.compute_at(block, ty, preserve_unit_loops=True)
        _thread_slice(sch, block, plan, vectorize=name == "load")
        sch.set_scope(block, 0, "local")
    return sch


# ---------------------------------------------------------------- CPU


def cpu_prefetch(rows: int, cols: int, dtype: str, target: Target) -> bool:
    """Whether the CPU kernel's exp pass prefetches the next row (``_PREFETCH_ROW_BYTES`` by the target's CPU)."""
    mcpu = str(target.attrs.get("mcpu", ""))
    limit = next((v for k, v in _PREFETCH_ROW_BYTES.items() if mcpu.startswith(k)), _PREFETCH_ROW_BYTES_ELSE)
    return rows > 1 and cols * tvm.DataType(dtype).bits // 8 <= limit


def cpu_lanes(target: Target) -> int:
    """float32 lanes per step of the CPU kernel: two vector registers, two independent chains for the running max and
    sum. Against one, in one process with onnxruntime interleaved (best of 30, benchmarks/softmax.py's CPU shapes):
    1.00-1.18x on AVX-512, 1.05-1.60x as AVX2 code; four (AVX-512) won on some shapes and lost 14 % on 8 x 262144."""
    from tvm.target.codegen import llvm_get_vector_width

    return 2 * max(4, llvm_get_vector_width(target) // 32)


def parallel_rows(func: tirx.PrimFunc, kind: str) -> s_tir.Schedule:
    """The schedule of a CPU kernel ``softmax_tir.cpu`` wrote: its rows in parallel."""
    sch = _schedule(func, kind)
    sch.parallel(sch.get_loops(sch.get_sblock("row"))[0])
    return sch


def schedule_cpu(rows: int, cols: int, dtype: str, kind: str, target: Target) -> s_tir.Schedule:
    """Rows in parallel, each row's passes vectorised to the target's vector width."""
    prefetch = cpu_prefetch(rows, cols, dtype, target)
    scratch = dtype != softmax_tir.ACC  # float16: exp(x - max) kept in a float32 row buffer, not recomputed
    return parallel_rows(softmax_tir.cpu(rows, cols, dtype, kind, cpu_lanes(target), prefetch, scratch), kind)


# ---------------------------------------------------------------- the rule


def recognize(func: tirx.PrimFunc) -> tuple[int, int, str, str] | None:
    """(rows, cols, dtype, kind) when ``func`` is exactly a canonical softmax kernel, else None."""
    kind = func.attrs.get(KERNEL_ATTR) if func.attrs is not None else None
    if kind not in KINDS or len(func.params) != 2:
        return None
    x = func.params[0]
    if len(x.shape) != 2 or not all(isinstance(d, tirx.IntImm) for d in x.shape) or str(x.dtype) not in DTYPES:
        return None
    rows, cols, dtype = int(x.shape[0]), int(x.shape[1]), str(x.dtype)
    expected = softmax_tir.canonical(rows, cols, dtype, str(kind)).with_attrs(dict(func.attrs))
    if not tvm_ffi.structural_equal(func, expected):
        return None
    return rows, cols, dtype, str(kind)


class Softmax(ScheduleRule):
    """Schedules the canonical softmax / log_softmax kernel for CUDA and CPU (see module docstring)."""

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        found = recognize(func) if isinstance(func, tirx.PrimFunc) else None
        if found is None:
            return None
        if target.kind.name == "cuda":
            return schedule_cuda(*found, cuda_plan(*found[:3], str(target.attrs.get("arch", ""))))
        if target.kind.name == "llvm":
            return schedule_cpu(*found, target)
        return None
