"""TensorIR definitions of (log-)softmax over the last axis of a ``rows x cols`` tensor.

``canonical`` is what legalisation emits: the plain three-block softmax (row max, sum of exponentials,
normalise) with float32 accumulation. The other functions restate the same computation in the tiled
index space that a schedule needs, because TVM's ``transform_layout`` / ``transform_block_layout``
cannot pad a row to a tile multiple nor keep a thread's slice of the row compact:

- ``cuda_rows``: one row per group of ``lanes`` <= 32 threads (a warp or part of one); each thread holds
  ``per_thread`` vectors of ``vec`` elements, element ``((j * lanes) + l) * vec + v`` of the row (coalesced,
  128-bit when ``vec * itemsize == 16``), cached on chip and read from memory once.
- ``cuda_stream`` is a finished CUDA kernel instead, for a block (or several, ``chunks``) per row: its row ends
  are masked per element while the rest of the row moves in aligned vectors, which no tiling of [rows, cols]
  expresses, and its block reductions keep their results in registers.
- ``cpu``: one block per row, three vectorised passes (max, exp with sum, scale) with ``vexp``.

Numerics (ONNX Softmax / LogSoftmax, opset 13): ``y = exp(x - max) / sum(exp(x - max))`` and
``y = x - max - log(sum(exp(x - max)))`` over the row, computed in float32 for every input type.
``-inf`` entries give 0, a row holding NaN or ``+inf`` gives NaN, huge magnitudes stay finite. On the GPU exp
is ``ex2`` (flush to zero): probabilities below 2^-126, beside a row sum >= 1, are 0.
"""

from __future__ import annotations

import tvm
from tvm import tirx
from tvm.script import tirx as T

from .common import LOG2E, ex2, warp_shuffle_xor

ACC = "float32"


def _neg_inf(dtype: str):
    """-inf in ``dtype`` (bfloat16: by its bits, as TVM 0.27 prints a bfloat16 -inf constant as ``-inff``, which CUDA
    does not know)."""
    if dtype == "bfloat16":
        return T.reinterpret("bfloat16", T.uint16(0xFF80))
    return T.Cast(dtype, T.float32("-inf"))


def _normalized(kind: str, x, row_max, row_sum):
    """One output element (float32) from the float32 input value and the row's statistics."""
    if kind == "log_softmax":
        return x - row_max - T.log(row_sum)
    return T.exp(x - row_max) * (T.float32(1) / row_sum)


def _ex(value):
    """exp(value) on the GPU: ``ex2`` of value * log2(e), one multiply where expf reduces its argument."""
    return ex2(value * T.float32(LOG2E))


def canonical(rows: int, cols: int, dtype: str, kind: str):
    """The PrimFunc legalisation emits for ``kind`` ("softmax" / "log_softmax") of a [rows, cols] tensor."""

    @T.prim_func(s_tir=True)
    def func(x: T.Buffer((rows, cols), dtype), y: T.Buffer((rows, cols), dtype)):
        T.func_attr({"tirx.noalias": True})
        row_max = T.sblock_alloc_buffer((rows,), ACC)
        row_sum = T.sblock_alloc_buffer((rows,), ACC)
        for r, k in T.grid(rows, cols):
            with T.sblock("row_max"):
                vr, vk = T.axis.remap("SR", [r, k])
                with T.init():
                    row_max[vr] = T.min_value(ACC)
                row_max[vr] = T.max(row_max[vr], T.Cast(ACC, x[vr, vk]))
        for r, k in T.grid(rows, cols):
            with T.sblock("row_sum"):
                vr, vk = T.axis.remap("SR", [r, k])
                with T.init():
                    row_sum[vr] = T.float32(0)
                row_sum[vr] = row_sum[vr] + T.exp(T.Cast(ACC, x[vr, vk]) - row_max[vr])
        for r, k in T.grid(rows, cols):
            with T.sblock("normalize"):
                vr, vk = T.axis.remap("SS", [r, k])
                y[vr, vk] = T.Cast(dtype, _normalized(kind, T.Cast(ACC, x[vr, vk]), row_max[vr], row_sum[vr]))

    return func


# The split's rendezvous: the blocks of a row, all resident (the plan keeps rows x chunks <= SMs), exchange partials
# through slots in static device memory of their kernel (zeroed when the module loads, written by nobody else). A
# block publishes its (max, sum) tagged with the launch's epoch (launches counted by their blocks' arrivals on a
# static counter: CUDA graph replays too, whose %gridid repeats) and its input's address, data and tag in one 16-byte
# store, and reads its row's others with 16-byte loads until the tag is this launch's. PTX's .b128 accesses are
# single-copy atomic (libcu++ builds its 16-byte atomics on them), so a slot is read whole or not at all, with no
# fence on either side. (It replaced a seqlock of 64-bit words: two fences to publish, three dependent loads to take.
# With it, ``exchange`` in ``cuda_stream`` lets as few warps as the partials need take and merge them, behind one
# barrier. H200, against the seqlock in the same run: 16 x 1M float16 / float32 1.10x / 1.07x, the few-rows splits
# 1.06-1.15x.) A slot of an earlier launch has an older epoch; one of a launch on another stream that overlaps this
# one (their arrivals interleave, so their epochs may coincide) holds the partial of the same chunk of the same input
# if its tag matches, else this launch's blocks time out. Waiting ends after SPLIT_WAIT_NS: the block then reads its
# whole row itself.
SPLIT_WAIT_NS = 200_000
_SPLIT_SRC = r"""
#ifndef TVMPIPE_SPLIT_ID
#define TVMPIPE_SPLIT_ID
__device__ unsigned long long tvmpipe_split_ID_count;
__device__ __align__(16) unsigned long long tvmpipe_split_ID_slots[2 * BLOCKS];  // per block: (max, sum) bits, tag
__forceinline__ __device__ unsigned long long tvmpipe_split_ID_tag(unsigned long long epoch, const void* x) {
  // never 0, the tag of a slot never written
  return ((epoch + 1ull) * 0x9E3779B97F4A7C15ull ^ (unsigned long long)x * 0xC2B2AE3D27D4EB4Full) | 1ull;
}
// This launch's epoch (each of its blocks arrives once).
__forceinline__ __device__ unsigned long long tvmpipe_split_ID_arrive() {
  return atomicAdd(&tvmpipe_split_ID_count, 1ull) / BLOCKSull;
}
// Block b's (max, sum) of input x for launch ``epoch``, with its tag, in one store.
__forceinline__ __device__ void tvmpipe_split_ID_publish(int b, unsigned long long epoch, const void* x, float m,
                                                         float s) {
  unsigned long long d = __float_as_uint(m) | (unsigned long long)__float_as_uint(s) << 32;
  asm volatile("{ .reg .b128 v; mov.b128 v, {%1, %2}; st.relaxed.gpu.global.b128 [%0], v; }"
               :: "l"(tvmpipe_split_ID_slots + 2 * b), "l"(d), "l"(tvmpipe_split_ID_tag(epoch, x)) : "memory");
}
// 1 and block b's (max, sum) of input x for launch ``epoch`` in (m, s) once published; 0 after WAIT_NS ns without.
__forceinline__ __device__ int tvmpipe_split_ID_take(int b, unsigned long long epoch, const void* x, float* m,
                                                     float* s) {
  unsigned long long want = tvmpipe_split_ID_tag(epoch, x), t0, t, tag, d;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  while (true) {
    asm volatile("{ .reg .b128 v; ld.relaxed.gpu.global.b128 v, [%2]; mov.b128 {%0, %1}, v; }"
                 : "=l"(d), "=l"(tag) : "l"(tvmpipe_split_ID_slots + 2 * b) : "memory");
    if (tag == want) {
      *m = __uint_as_float((unsigned)d);
      *s = __uint_as_float((unsigned)(d >> 32));
      return 1;
    }
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (t - t0 > WAIT_NSull) return 0;
  }
}
#endif
"""


# A thread's 16-byte store into its own shared-memory slots, which only it reads back: written as a call so that TVM's
# barrier insertion, which cannot tell that no other thread reads them, does not stop the block there.
_COPY16_SRC = ("__forceinline__ __device__ void tvmpipe_copy16(void* dst, const void* src) "
               "{ *(uint4*)dst = *(const uint4*)src; }")


# Whether a predicate holds in every lane of the warp (a call: TVM has no warp vote; one name, one source for all
# kernels of a module).
_ALL_SRC = "__forceinline__ __device__ int tvmpipe_all(int p) { return __all_sync(0xFFFFFFFFu, p); }"


def _split_src(kernel: str, blocks: int) -> str:
    """The rendezvous helpers of one kernel (``kernel`` names it: kernels alike share them, one launch at a time)."""
    return _SPLIT_SRC.replace("ID", kernel).replace("BLOCKS", str(blocks)).replace("WAIT_NS", str(SPLIT_WAIT_NS))


def cuda_rows(rows: int, cols: int, dtype: str, kind: str, lanes: int, vec: int, per_thread: int):
    """Row-resident softmax: blocks load / row_max / row_sum / normalize / store over [r, j, l, v]."""
    nvec = cols // vec  # vectors per row; slots j * lanes + l >= nvec are padding
    J, L, V = per_thread, lanes, vec

    @T.prim_func(s_tir=True)
    def func(x: T.Buffer((rows, cols), dtype), y: T.Buffer((rows, cols), dtype)):
        T.func_attr({"tirx.noalias": True})
        xc = T.sblock_alloc_buffer((rows, J, L, V), dtype)
        row_max = T.sblock_alloc_buffer((rows,), ACC)
        ec = T.sblock_alloc_buffer((rows, J, L, V), ACC)  # exp(x - max), computed once per element
        row_sum = T.sblock_alloc_buffer((rows,), ACC)
        yc = T.sblock_alloc_buffer((rows, J, L, V), dtype)
        for r, j, l, v in T.grid(rows, J, L, V):
            with T.sblock("load"):
                vr, vj, vl, vv = T.axis.remap("SSSS", [r, j, l, v])
                xc[vr, vj, vl, vv] = T.if_then_else(
                    vj * L + vl < nvec, x[vr, (vj * L + vl) * V + vv], _neg_inf(dtype)
                )
        for r, j, l, v in T.grid(rows, J, L, V):
            with T.sblock("row_max"):
                vr, vj, vl, vv = T.axis.remap("SRRR", [r, j, l, v])
                with T.init():
                    row_max[vr] = T.min_value(ACC)
                row_max[vr] = T.max(row_max[vr], T.Cast(ACC, xc[vr, vj, vl, vv]))
        for r, j, l, v in T.grid(rows, J, L, V):
            with T.sblock("exp"):
                vr, vj, vl, vv = T.axis.remap("SSSS", [r, j, l, v])
                ec[vr, vj, vl, vv] = _ex(T.Cast(ACC, xc[vr, vj, vl, vv]) - row_max[vr])
        for r, j, l, v in T.grid(rows, J, L, V):
            with T.sblock("row_sum"):
                vr, vj, vl, vv = T.axis.remap("SRRR", [r, j, l, v])
                with T.init():
                    row_sum[vr] = T.float32(0)
                row_sum[vr] = row_sum[vr] + ec[vr, vj, vl, vv]
        for r, j, l, v in T.grid(rows, J, L, V):
            with T.sblock("normalize"):
                vr, vj, vl, vv = T.axis.remap("SSSS", [r, j, l, v])
                if kind == "log_softmax":
                    yc[vr, vj, vl, vv] = T.Cast(dtype, T.Cast(ACC, xc[vr, vj, vl, vv]) - row_max[vr] - T.log(row_sum[vr]))
                else:
                    yc[vr, vj, vl, vv] = T.Cast(dtype, ec[vr, vj, vl, vv] * (T.float32(1) / row_sum[vr]))
        for r, j, l, v in T.grid(rows, J, L, V):
            with T.sblock("store"):
                vr, vj, vl, vv = T.axis.remap("SSSS", [r, j, l, v])
                if vj * L + vl < nvec:
                    y[vr, (vj * L + vl) * V + vv] = yc[vr, vj, vl, vv]

    return func


def stream_vectors(cols: int, vec: int) -> int:
    """How many ``vec``-aligned vectors of the flat tensor a row's elements may fall in: ``cols / vec`` when rows
    keep the alignment, else up to two more (the row's ends share vectors with its neighbours)."""
    return cols // vec if cols % vec == 0 else (cols + 2 * vec - 2) // vec


def cuda_stream(rows: int, cols: int, dtype: str, kind: str, lanes: int, vec: int, per_thread: int, cached: int = 0,
                chunks: int = 1, kept_exp: bool = True, cluster: bool = False, grid: int = 0):
    """Block-per-row softmax, a CUDA kernel (not a definition to schedule): one block of ``lanes`` threads per row
    (or per each of its ``chunks``), reading it in steps of ``per_thread`` vectors per thread. Pass 1 keeps an
    online (max, sum of exp) per thread, merged across the block; pass 2 normalises and writes.

    - One step covers the row (``resident``): the row stays in registers between the passes. For softmax the
      thread keeps exp(x - its own max), so each element is exponentiated once and pass 2 is one multiply by
      exp(own max - row max) / sum.
    - Longer rows stream: pass 2 reads the row again, last step first, so memory sees one read and one write:
      the last step is still in registers, the first ``cached`` steps are also kept in shared memory (pass 1
      requests them all at once with cp.async), each thread's own vectors (read back by the thread that wrote
      them: no barrier), the rest comes from L2, where pass 1 read it last. A step that comes from memory is loaded
      into a second register buffer while the step before is computed (H200, hand-edited CUDA in a same-run A/B:
      float32 128 x 131072 +4 %, 16 x 1M +2 %; the benchmark +1-2 %; each step's loads had waited their full
      latency). With little state per thread, two blocks share an SM: one's reductions overlap the other's loads.
      With ``kept_exp``, a float16 / bfloat16 softmax keeps, over x, exp(x - m) of the steps that stay on chip, m
      the thread's running max after each such step, so that pass 2 multiplies them by exp(m - row max) / sum
      instead of exponentiating again (rounded twice: <= 1 ulp). H200, same runs, against exponentiating again:
      float16 128 x 131072 +1-3 %, 16 x 1M +6 % (Nsight Compute: 23.0 -> 21.5 and 27.3 -> 25.8 us); float32, with
      half the exponentials per byte and the same extra shared-memory store, -2 to +0.4 %, so it recomputes.
    - ``chunks`` > 1 (few rows: a block per row would leave SMs idle): still one kernel, with no more blocks than
      the SMs hold at once. Each block does pass 1 over its chunk (cached like a row), publishes its (max, sum),
      takes its row's others (``_SPLIT_SRC``; as few warps as they need, a lane per chunk, merged in registers,
      behind one barrier: ``exchange``) and does pass 2 on its chunk, still on chip: one read from memory where the
      two kernels this replaces read twice (their second read came from DRAM, even for 32 MB). A block whose row's
      partials do not all come within ``SPLIT_WAIT_NS`` (its row's blocks not all resident) reads the whole row
      itself, so it stays correct, if slow, on a GPU with fewer SMs than planned for. ``cluster`` (sm_90+): a row's
      blocks are launched as one thread-block cluster, which the GPU schedules all at once, so that they are resident
      together however many blocks the launch has (several waves of rows); the exchange is the same.
    - ``grid`` > 0 (rows or chunks that stay on chip: ``cached`` steps and the last in registers): ``grid`` blocks,
      each taking items (a row, or a chunk of one) ``blockIdx.x + k * grid`` in turn (split: all resident, a multiple
      of ``chunks``, so that a row's chunks are all taken in the same turn); while pass 2 writes an item's cached
      steps, their shared memory takes the block's next item's (cp.async), so that a block reads its next item while
      it writes the current one, where blocks in waves read only once they start.

    The row is read as the ``vec``-aligned vectors of the flat tensor that cover it, so an odd row length (50257)
    still gets 128-bit accesses; the vectors at its ends, shared with the neighbouring rows, are read and written
    element by element. A step's groups of vectors that lie wholly past the row are skipped (block-uniform).
    """
    L, V, U, W, P = lanes, vec, per_thread, lanes // 32, chunks
    N = rows * P  # items: a block's row or chunk of a row
    G = grid or N  # blocks launched
    TW = min(W, -(-P // 32))  # split: warps that take the row's partials, a lane each (in turns if fewer)
    assert L % 32 == 0 and L <= 1024, L
    touched = stream_vectors(cols, V)
    steps = -(-touched // (P * L * U))  # per chunk
    resident = steps == 1 and P == 1
    keep_exp = resident and kind == "softmax"
    kept16 = kept_exp and not resident and kind == "softmax" and tvm.DataType(dtype).bits == 16  # (docstring)
    C = 0 if resident else min(cached, steps)  # a chunk's steps < C are kept in shared memory
    ring = grid > 0  # (docstring)
    assert not ring or (not cluster and not kept16 and C > 0 and steps == C + 1 and grid % P == 0), grid
    keep_shape = (C, U, L, V) if C else (1,)
    name = f"{rows}x{cols}_{dtype}_{kind}_{L}x{U}x{V}_{P}_{C}"  # the split's helpers, by what makes the kernel
    name += f"_g{G}" if ring else ""
    split_src = _split_src(name, rows * P) if P > 1 else ""
    f32, neg_inf = ACC, T.float32("-inf")

    # ``it`` below counts steps from the row's start (chunk c's are c * steps ... c * steps + steps - 1)
    def vector(it, u, tx):  # the row's vector a thread takes: consecutive threads, consecutive vectors
        return (it * U + u) * L + tx

    def live(it, u):  # whether the block's u-th vectors of step ``it`` reach into the row
        return vector(it, u, 0) < touched

    def start(r, it, u, tx):  # flat index of that vector's first element, visibly a multiple of V (else TVM gathers)
        return (r * cols // V + vector(it, u, tx)) * V

    def offset(r, it, u, tx, v):  # that element's column in row r (outside [0, cols): another row's)
        return vector(it, u, tx) * V + v - r * cols % V

    def whole(r, it, u, tx):  # all of that vector is row r's
        return tirx.all(0 <= offset(r, it, u, tx, 0), offset(r, it, u, tx, V - 1) < cols)

    def mine(r, it, u, tx, v):
        return tirx.all(0 <= offset(r, it, u, tx, v), offset(r, it, u, tx, v) < cols)

    def ex(value, m):  # exp(value - m)
        return _ex(value - m)

    def nonzero(m):  # the max to subtract: a part holding only -inf has none (exp(-inf - 0) = 0)
        return T.if_then_else(m == neg_inf, T.float32(0), m)

    def scale(m, st):  # exp(m - row max) / sum; 0 for a part holding only -inf (1 / sum keeps a row of -inf NaN)
        return T.if_then_else(m == neg_inf, T.float32(0), ex(m, st[0])) * st[1]

    def step_max(ms, st, i):  # the running max that kept step i's exponentials (st[5]: the last step's)
        m = st[5]
        for k in range(C):
            m = T.if_then_else(i == k, ms[k], m)
        return m

    def result(value, stat):  # the output for a float32 input value; stat = (max, 1 / sum or log sum)
        if kind == "log_softmax":
            return T.Cast(dtype, value - stat[0] - stat[1])
        return T.Cast(dtype, ex(value, stat[0]) * stat[1])

    @T.macro
    def move(xv, flat, r, it, tx, load):
        """Step ``it``'s vectors between the flat tensor and xv: ``load``: xv <- x, elements that are not this row's
        -inf (and not read); else y <- xv, the row's elements only."""
        for u in T.unroll(U):
            if live(it, u):
                if whole(r, it, u, tx):
                    for v in T.vectorized(V):
                        if load:
                            xv[u, v] = flat[start(r, it, u, tx) + v]
                        else:
                            flat[start(r, it, u, tx) + v] = xv[u, v]
                else:
                    for v in T.unroll(V):
                        if load:
                            xv[u, v] = T.if_then_else(mine(r, it, u, tx, v), flat[start(r, it, u, tx) + v], _neg_inf(dtype))
                        elif mine(r, it, u, tx, v):
                            flat[start(r, it, u, tx) + v] = xv[u, v]

    @T.macro
    def combine(st):
        """(st[0], st[1]) <- the (max, sum of exp(x - max)) of the parts (st[0], st[1]) and (st[2], st[3])."""
        st[4] = T.max(st[0], st[2])
        st[1] = st[1] * ex(st[0], nonzero(st[4])) + st[3] * ex(st[2], nonzero(st[4]))
        st[0] = st[4]

    @T.macro
    def butterfly(st, rounds):
        """(st[0], st[1]) <- the (max, sum) of the warp's 2^rounds-lane groups."""
        for lg in T.unroll(rounds):
            st[2] = warp_shuffle_xor(st[0], T.shift_left(1, lg))
            st[3] = warp_shuffle_xor(st[1], T.shift_left(1, lg))
            combine(st)

    @T.macro
    def merge(st, red, tx):
        """(st[0], st[1]) <- the block's (max, sum), from every thread's, in every thread."""
        butterfly(st, 5)  # the warp's
        if W > 1:  # the warps' pairs through shared memory, merged by every warp
            if tx % 32 == 0:
                red[0, tx // 32] = st[0]
                red[1, tx // 32] = st[1]
            T.tvm_storage_sync("shared")
            st[0] = T.if_then_else(tx % 32 < W, red[0, tx % 32], neg_inf)
            st[1] = T.if_then_else(tx % 32 < W, red[1, tx % 32], T.float32(0))
            butterfly(st, 5)

    @T.macro
    def absorb(xv, ev, st, it, keep):
        """(st[0], st[1]) <- the online (max, sum) updated with step ``it``'s vectors in xv; ``keep``: (kept16) their
        exp(x - the new max) replace them."""
        st[2] = st[0]
        for u in T.unroll(U):
            if live(it, u):
                for v in T.unroll(V):
                    st[2] = T.max(st[2], T.Cast(f32, xv[u, v]))
        st[1] = st[1] * ex(st[0], nonzero(st[2]))
        for u in T.unroll(U):
            if live(it, u):
                for v in T.unroll(V):
                    if keep_exp:
                        ev[u, v] = ex(T.Cast(f32, xv[u, v]), nonzero(st[2]))
                        st[1] = st[1] + ev[u, v]
                    elif keep:
                        st[3] = ex(T.Cast(f32, xv[u, v]), nonzero(st[2]))
                        st[1] = st[1] + st[3]
                        xv[u, v] = T.Cast(dtype, st[3])
                    else:
                        st[1] = st[1] + ex(T.Cast(f32, xv[u, v]), nonzero(st[2]))
        st[0] = st[2]

    @T.macro
    def normalize(xv, st):
        """xv <- the outputs of the inputs in xv, with (st[0], st[1]) = (row max, 1 / sum or log sum)."""
        for u in T.unroll(U):
            for v in T.unroll(V):
                xv[u, v] = result(T.Cast(f32, xv[u, v]), st)

    @T.macro
    def prefetched(xv, xs):
        """xv <- the step that ``move`` loaded into xs during the step before (register moves)."""
        for u in T.unroll(U):
            for v in T.vectorized(V):
                xv[u, v] = xs[u, v]

    @T.macro
    def request(keep, xf, r, c, i, tx):
        """Chunk ``c``'s cached step i into keep[i], one cp.async group."""
        it = T.meta_var(c * steps + i)
        for u in T.unroll(U):
            if live(it, u):
                if whole(r, it, u, tx):
                    T.ptx["cp.async.cg.shared.global"](
                        keep.ptr_to([i, u, tx, 0]), xf.ptr_to([start(r, it, u, tx)]), 16, T.uint32(16))
                else:  # a row end: its own elements, -inf for the neighbours'
                    for v in T.unroll(V):
                        keep[i, u, tx, v] = T.if_then_else(
                            mine(r, it, u, tx, v), xf[start(r, it, u, tx) + v], _neg_inf(dtype))
        T.ptx.cp.async_.commit_group()

    @T.macro
    def pass1(xv, xs, ev, st, ms, keep, xf, r, c, tx, requested):
        """(st[0], st[1]) <- this thread's online (max, sum) over chunk ``c``. The first C steps go to ``keep``,
        all of them requested at once (cp.async, one group per step), and the next step into xv registers
        before the first is waited for: a block has all that in flight, not one step's loads at a time.
        kept16: ms[i] <- the running max after cached step i."""
        st[0] = neg_inf
        st[1] = T.float32(0)
        if C > 0:  # (a parse-time branch: keep has no step axis without cached steps)
            if not requested:  # (``ring``: the item before requested them)
                for i in T.unroll(C):
                    request(keep, xf, r, c, i, tx)
        if C < steps:
            move(xv, xf, r, c * steps + C, tx, True)
        if C > 0:
            for i in T.unroll(C):
                it = T.meta_var(c * steps + i)
                T.ptx.cp.async_.wait_group(C - 1 - i)
                for u in T.unroll(U):
                    if live(it, u):
                        for v in T.vectorized(V):
                            xs[u, v] = keep[i, u, tx, v]
                absorb(xs, ev, st, it, kept16)
                if kept16:
                    ms[i] = st[0]
                    for u in T.unroll(U):
                        if live(it, u):  # (opaque to TVM, which would put a block barrier before a visible store)
                            T.evaluate(T.cuda.func_call("tvmpipe_copy16", keep.ptr_to([i, u, tx, 0]), xs.ptr_to([u, 0]),
                                                        source_code=_COPY16_SRC))
        for i in T.serial(C, steps - 1 if kept16 else steps):  # (kept16: the last step apart, below)
            it = T.meta_var(c * steps + i)
            if i + 1 < steps:  # the next step's loads, in flight while this one is reduced
                move(xs, xf, r, it + 1, tx, True)
            absorb(xv, ev, st, it, False)
            if i + 1 < steps:
                prefetched(xv, xs)
        if kept16 and C < steps:  # the last step, which stays in registers (there since the loop or before it)
            absorb(xv, ev, st, c * steps + steps - 1, True)

    @T.macro
    def pass2(xv, xs, ev, st, ms, keep, xf, yf, r, c, tx, nb):
        """Chunk ``c`` normalised with the row's (max, sum) in (st[0], st[1]) and written; st[5]: own max. ``ring``:
        the last step (in registers) first, then the cached ones in order, each's shared memory then taking the
        block's next item ``nb``'s (if any) in the order pass 1 waits for them."""
        st[0] = nonzero(st[0])
        st[1] = T.log(st[1]) if kind == "log_softmax" else T.float32(1) / st[1]
        if keep_exp:  # exp(x - row max) / sum = exp(x - own max) * [exp(own max - row max) / sum]
            st[2] = scale(st[5], st)
            for u in T.unroll(U):
                if live(0, u):
                    for v in T.unroll(V):
                        xv[u, v] = T.Cast(dtype, ev[u, v] * st[2])
            move(xv, yf, r, 0, tx, False)
        else:
            for ti in T.serial(steps):  # last step first
                i = T.meta_var(T.if_then_else(ti == 0, steps - 1, ti - 1) if ring else steps - 1 - ti)
                it = T.meta_var(c * steps + i)
                if C > 0 and i < C:
                    for u in T.unroll(U):
                        if live(it, u):
                            for v in T.vectorized(V):
                                xv[u, v] = keep[i, u, tx, v]
                elif ti > 0:  # (the chunk's last step is still in registers from pass 1)
                    prefetched(xv, xs)
                if i - 1 >= C:  # the next step comes from L2: its loads in flight while this one is written
                    move(xs, xf, r, it - 1, tx, True)
                # (kept16: its exponentials kept, in shared memory or, the last step's, in registers)
                kept = T.meta_var(tirx.any(i < C, ti == 0) if kept16 else False)
                if kept:
                    st[2] = scale(step_max(ms, st, i), st)
                    for u in T.unroll(U):
                        for v in T.unroll(V):
                            xv[u, v] = T.Cast(dtype, T.Cast(f32, xv[u, v]) * st[2])
                else:
                    normalize(xv, st)
                if ring:  # (after normalize has used the values read from keep[i])
                    if ti > 0 and nb < N:
                        request(keep, xf, nb // P, nb % P, i, tx)
                move(xv, yf, r, it, tx, False)

    @T.macro
    def exchange(st, xs, ev, red, xch, came, epoch, tick, xf, r, b, tx):
        """(st[0], st[1]) <- row r's (max, sum), in every thread, from the block's (st[0], st[1]) over its chunk (the
        same in every thread; the launch's epoch in epoch[0]): published for this launch, then the first ``TW`` warps
        alone take the row's chunks' partials (a lane each, its own block's too, in turns if the block has fewer
        threads), merge them with shuffles and hand them to the block through shared memory, behind one barrier. A
        partial that does not come within ``SPLIT_WAIT_NS`` (blocks not all resident: a smaller GPU, a busy one) makes
        the block read the whole row itself instead."""
        if tx < TW * 32:
            tick[0] = epoch[0]
            if tx == 0:
                T.evaluate(T.cuda.func_call(f"tvmpipe_split_{name}_publish", b, tick[0], xf.data, st[0], st[1],
                                            source_code=split_src))
            st[0] = neg_inf
            st[1] = T.float32(0)
            tick[1] = T.uint64(1)
            for k in T.serial(-(-P // (TW * 32))):
                if k * TW * 32 + tx < P:
                    if T.cuda.func_call(f"tvmpipe_split_{name}_take", r * P + k * TW * 32 + tx, tick[0], xf.data,
                                        st.ptr_to([2]), st.ptr_to([3]), source_code=split_src, return_type="int32") != 0:
                        combine(st)
                    else:
                        tick[1] = T.uint64(0)
            butterfly(st, min(5, (P - 1).bit_length()))
            tick[1] = T.Cast("uint64", T.cuda.func_call("tvmpipe_all", tick[1] != T.uint64(0), source_code=_ALL_SRC,
                                                         return_type="int32"))
            if tx % 32 == 0:
                xch[0, tx // 32] = st[0]
                xch[1, tx // 32] = st[1]
                came[tx // 32] = tick[1]
        T.tvm_storage_sync("shared")
        st[0] = xch[0, 0]
        st[1] = xch[1, 0]
        tick[1] = came[0]
        for w in T.unroll(1, TW):
            st[2] = xch[0, w]
            st[3] = xch[1, w]
            combine(st)
            tick[1] = tick[1] & came[w]
        if tick[1] == T.uint64(0):  # (the same in every thread)
            st[0] = neg_inf
            st[1] = T.float32(0)
            for it in T.serial(P * steps):
                move(xs, xf, r, it, tx, True)
                absorb(xs, ev, st, it, False)
            merge(st, red, tx)

    @T.macro
    def block(xf, yf, bx):
        """Block bx: its row's (or chunk's) two passes (``ring``: its items', in turn)."""
        for tx in T.thread_binding(L, thread="threadIdx.x"):
            with T.sblock("softmax_stream"):
                T.reads()
                T.writes()
                xv = T.alloc_buffer((U, V), dtype, scope="local")
                # a cached step, from keep; the next step from memory; or (split) a step of another chunk
                xs = T.alloc_buffer((U, V), dtype, scope="local")
                ev = T.alloc_buffer((U, V) if keep_exp else (1,), f32, scope="local")  # resident: exp(x - own max)
                # max, sum; a peer's max, sum / a step's max; scratch; the thread's own max
                st = T.alloc_buffer((6,), f32, scope="local")
                ms = T.alloc_buffer((C,) if kept16 and C > 0 else (1,), f32, scope="local")  # max after each cached step
                red = T.alloc_buffer((2, W), f32, scope="shared.dyn")
                keep = T.alloc_buffer(keep_shape, dtype, scope="shared.dyn")  # [step, u, thread, v]
                # split: the taking warps' (max, sum), whether all their partials came, the launch's epoch (static
                # shared memory, which TVM's barrier planning tells apart from the dynamic: no extra barriers)
                xch = T.alloc_buffer((2, TW), f32, scope="shared")
                came = T.alloc_buffer((TW,), "uint64", scope="shared")
                epoch = T.alloc_buffer((1,), "uint64", scope="shared")
                tick = T.alloc_buffer((2,), "uint64", scope="local")  # split: the epoch; whether all came
                for k in T.serial((N - 1 - bx) // G + 1):  # (a loop, not a condition: TVM puts no barrier in one)
                    b = T.meta_var(bx + k * G)
                    if P > 1 and tx == 0:  # (the split: the launch's epoch, fetched while pass 1 runs)
                        tick[0] = T.cuda.func_call(f"tvmpipe_split_{name}_arrive", source_code=split_src,
                                                   return_type="uint64")
                    pass1(xv, xs, ev, st, ms, keep, xf, b // P, b % P, tx, ring and k > 0)
                    st[5] = st[0]
                    if P > 1 and tx == 0:  # (for the taking warps, behind the block merge's barriers)
                        epoch[0] = tick[0]
                    merge(st, red, tx)
                    if P > 1:
                        exchange(st, xs, ev, red, xch, came, epoch, tick, xf, b // P, b, tx)
                    pass2(xv, xs, ev, st, ms, keep, xf, yf, b // P, b % P, tx, b + G)

    @T.prim_func(s_tir=True)
    def func(x: T.Buffer((rows, cols), dtype), y: T.Buffer((rows, cols), dtype)):
        T.func_attr({"tirx.noalias": True})
        xf = T.decl_buffer((rows * cols,), dtype, data=x.data)
        yf = T.decl_buffer((rows * cols,), dtype, data=y.data)
        for bx in T.thread_binding(G, thread="blockIdx.x"):
            if cluster:  # (a parse-time branch; blockIdx.x still counts blocks, the rank is bx % P)
                for _rank in T.thread_binding(P, thread="clusterCtaIdx.x"):
                    block(xf, yf, bx)
            else:
                block(xf, yf, bx)

    return func


# exp(f) on [-ln2/2, ln2/2]: degree-5 minimax polynomial for the relative error with c0 = 1 (so exp(0) = 1),
# c0..c5 rounded to float32 (8.6e-8 before rounding, 1.1e-7 after).
EXP_POLY = (1.0, 0.9999997019767761, 0.4999915361404419, 0.16667552292346954, 0.041897963732481, 0.00829608365893364)
EXP_LO = -87.33654  # below this (2^-126 and less) vexp gives 0
_LN2_HI, _LN2_LO = 0.693145752, 1.42860677e-6  # ln 2 in two parts (Cody-Waite); n * _LN2_HI is exact
_MAGIC = 12582912.0 + 127  # 1.5 * 2^23 + the exponent bias


def vexp(value):
    """float32 ``exp(v)`` for softmax's ``v = x - max <= 0`` from +, *, one shift and one Select (<= 2.22 ulp).

    Hand-written because LLVM scalarises ``llvm.exp`` on vectors into libm calls, and TVM's ``fast_exp``
    clamps NaN away (a NaN row must stay NaN). ``exp(v) = 2^n * p(f)``, ``n = round(v / ln2)``,
    ``f = v - n ln2`` in [-ln2/2, ln2/2] and ``p`` the degree-5 ``EXP_POLY``. ``t = v / ln2 + 1.5 * 2^23 + 127``
    rounds to the integer ``n + 127`` held in t's low mantissa bits, so ``bits(t) << 23`` are the bits of
    ``2^n`` (no float -> int conversion, undefined for NaN; no exponent-bias add). ``exp(-inf) = 0``, NaN
    propagates (through ``p``), ``v < EXP_LO`` gives 0 (results below 2^-126 flush). No overflow path: for
    ``v > 88.3`` (which softmax never evaluates) the result is garbage.
    """
    f32 = lambda c: tirx.const(c, ACC)  # noqa: E731
    v, t, n, f = (tirx.Var(name, ACC) for name in "vtnf")
    poly = f32(EXP_POLY[-1])
    for c in EXP_POLY[-2::-1]:
        poly = poly * f + f32(c)
    two_n = tirx.reinterpret(ACC, tirx.shift_left(tirx.reinterpret("int32", t), 23))
    body = tirx.Select(v < f32(EXP_LO), f32(0), poly * two_n)
    body = tirx.Let(f, v - n * f32(_LN2_HI) - n * f32(_LN2_LO), body)
    body = tirx.Let(n, t - f32(_MAGIC), body)
    body = tirx.Let(t, v * f32(LOG2E) + f32(_MAGIC), body)
    return tirx.Let(v, value, body)


@T.macro(hygienic=False)
def _fold(acc, h, op):
    """acc[l] = op(acc[l], acc[l + h]) for l < h, vectorised: one step of a lanes-wide tree reduction."""
    if h > 0:
        for l in T.vectorized(h):
            acc[l] = op(acc[l], acc[l + h])


def _add(a, b):
    return a + b


def _f32(value, dtype: str):
    """A CPU kernel's input element (of ``dtype``) in float32; bfloat16 by its bits: TVM 0.27's bfloat16
    legalisation does not rewrite a cast inside a Let (``vexp``'s argument), which then converts the raw 16 bits as
    an integer."""
    if dtype == "bfloat16":
        return T.reinterpret(ACC, T.shift_left(T.Cast("uint32", T.reinterpret("uint16", value)), T.uint32(16)))
    return T.Cast(ACC, value)


def cpu(rows: int, cols: int, dtype: str, kind: str, lanes: int, prefetch: bool = False, scratch: bool = False):
    """One block per row (the schedule runs rows in parallel): three passes over the row while it is in
    cache, a ``lanes``-wide running max, ``exp(x - max)`` with a running sum, and the scaling.

    The vector loops are written vectorised: TVM's ``vectorize`` refuses a loop that carries a reduction, and
    ``rfactor`` does not compose with ``compute_at``. A ``cols % lanes`` tail is one more vector step over the row's
    last ``lanes`` elements, whose lanes before the tail the sum leaves out and the scaling writes back unchanged (the
    max takes them again: the same max); a row shorter than ``lanes`` is scalar. A float32 softmax
    keeps ``exp(x - max)`` in ``y`` between the last two passes (as onnxruntime does). A float16 one keeps it
    with ``scratch`` in a float32 row buffer (a per-row workspace: a float16 ``y`` would hold an unscaled,
    twice-rounded value), else recomputes it (1.35x slower). ``prefetch``: the exp pass also prefetches the
    next row, one vector's address per step.
    """
    full, tail = divmod(cols, lanes)
    over = full > 0 and tail > 0  # the tail as an overlapping vector step (from ``last``) of which tail_n lanes count
    last, tail_n, tail = cols - lanes, tail, 0 if full > 0 else tail
    in_y = dtype == ACC
    keep = kind == "softmax" and (in_y or scratch)
    row_buf = cols if keep and not in_y else 1
    assert lanes & (lanes - 1) == 0 and lanes <= 64, lanes
    # log2(lanes) vector halvings reduce the lanes-wide partial max / sum (LLVM made a chain of lanes - 1
    # dependent scalar ops of them, 8192 x 128: -25 %); TVMScript has no Python loops: 6 steps, unused ones 0.
    h0, h1, h2, h3, h4, h5 = (lanes >> s for s in range(1, 7))

    def nxt(x, r, k):
        return T.address_of(x[T.min(r + 1, rows - 1), k])

    def exp_of(x, y, e, r, k, stat):
        """exp(x[r, k] - row max): kept in y or e, or computed."""
        if keep:
            return y[r, k] if in_y else e[k]
        return vexp(_f32(x[r, k], dtype) - stat[0])

    def value(x, y, e, r, k, stat):
        """Output element k of row r, with stat = (row max, 1 / row sum or log row sum)."""
        if kind == "log_softmax":
            return T.Cast(dtype, _f32(x[r, k], dtype) - stat[0] - stat[1])
        return T.Cast(dtype, exp_of(x, y, e, r, k, stat) * stat[1])

    @T.prim_func(s_tir=True)
    def func(x: T.Buffer((rows, cols), dtype), y: T.Buffer((rows, cols), dtype)):
        T.func_attr({"tirx.noalias": True})
        for r in range(rows):
            with T.sblock("row"):
                vr = T.axis.spatial(rows, r)
                T.reads(x[vr, 0:cols])  # y is read only where this block wrote it
                T.writes(y[vr, 0:cols])
                acc = T.sblock_alloc_buffer((lanes,), ACC)  # "global" scope: on the stack ("local": heap)
                stat = T.sblock_alloc_buffer((2,), ACC)
                e = T.sblock_alloc_buffer((row_buf,), ACC)  # exp(x - max) of a float16 row (scratch)
                for l in T.vectorized(lanes):
                    acc[l] = T.min_value(ACC)
                for ko in range(full):
                    for l in T.vectorized(lanes):
                        acc[l] = T.max(acc[l], _f32(x[vr, ko * lanes + l], dtype))
                for t in range(tail):
                    acc[t] = T.max(acc[t], _f32(x[vr, full * lanes + t], dtype))
                if over:
                    for l in T.vectorized(lanes):
                        acc[l] = T.max(acc[l], _f32(x[vr, last + l], dtype))
                _fold(acc, h0, T.max)
                _fold(acc, h1, T.max)
                _fold(acc, h2, T.max)
                _fold(acc, h3, T.max)
                _fold(acc, h4, T.max)
                _fold(acc, h5, T.max)
                stat[0] = acc[0]
                for l in T.vectorized(lanes):
                    acc[l] = T.float32(0)
                for ko in range(full):
                    if prefetch:  # the next row (the same thread's, mostly): read, keep in all cache levels
                        T.evaluate(T.call_llvm_intrin("void", "llvm.prefetch", nxt(x, vr, ko * lanes), 0, 3, 1))
                    for l in T.vectorized(lanes):
                        if keep and in_y:
                            y[vr, ko * lanes + l] = vexp(_f32(x[vr, ko * lanes + l], dtype) - stat[0])
                        if keep and not in_y:
                            e[ko * lanes + l] = vexp(_f32(x[vr, ko * lanes + l], dtype) - stat[0])
                        acc[l] = acc[l] + exp_of(x, y, e, vr, ko * lanes + l, stat)
                for t in range(tail):
                    if keep and in_y:
                        y[vr, full * lanes + t] = vexp(_f32(x[vr, full * lanes + t], dtype) - stat[0])
                    if keep and not in_y:
                        e[full * lanes + t] = vexp(_f32(x[vr, full * lanes + t], dtype) - stat[0])
                    acc[t] = acc[t] + exp_of(x, y, e, vr, full * lanes + t, stat)
                if over:  # (lanes before the tail: their exp again, the same bits, not summed again)
                    for l in T.vectorized(lanes):
                        if keep and in_y:
                            y[vr, last + l] = vexp(_f32(x[vr, last + l], dtype) - stat[0])
                        if keep and not in_y:
                            e[last + l] = vexp(_f32(x[vr, last + l], dtype) - stat[0])
                        acc[l] = acc[l] + T.Select(l >= lanes - tail_n, exp_of(x, y, e, vr, last + l, stat),
                                                   T.float32(0))
                _fold(acc, h0, _add)
                _fold(acc, h1, _add)
                _fold(acc, h2, _add)
                _fold(acc, h3, _add)
                _fold(acc, h4, _add)
                _fold(acc, h5, _add)
                stat[1] = acc[0]
                stat[1] = T.log(stat[1]) if kind == "log_softmax" else T.float32(1) / stat[1]
                for ko in range(full):
                    for l in T.vectorized(lanes):
                        y[vr, ko * lanes + l] = value(x, y, e, vr, ko * lanes + l, stat)
                for t in range(tail):
                    y[vr, full * lanes + t] = value(x, y, e, vr, full * lanes + t, stat)
                if over:  # (lanes before the tail are final already: written back as they are)
                    for l in T.vectorized(lanes):
                        y[vr, last + l] = T.Select(l >= lanes - tail_n, value(x, y, e, vr, last + l, stat),
                                                   y[vr, last + l])

    return func
