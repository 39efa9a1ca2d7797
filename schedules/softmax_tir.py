"""TensorIR definitions of (log-)softmax over the last axis of a ``rows x cols`` tensor.

``canonical`` is what legalisation emits: the plain three-block softmax (row max, sum of exponentials,
normalise) with float32 accumulation. The other functions restate the same computation in the tiled
index space that a schedule needs, because TVM's ``transform_layout`` / ``transform_block_layout``
cannot pad a row to a tile multiple nor keep a thread's slice of the row compact:

- ``cuda_rows``: one row per group of ``lanes`` threads; each thread holds ``per_thread`` vectors of
  ``vec`` elements, element ``((j * lanes) + l) * vec + v`` of the row (coalesced, 128-bit when
  ``vec * itemsize == 16``), cached on chip and read from memory once.
- ``cuda_split``: the same tiling over ``chunks`` slices of a long row, in two kernels: per-chunk
  (max, sum of exp) partials, then a combine + normalise pass.
- ``cuda_chunks``: a row in ``chunks`` blocks that keep their slices in registers and combine their
  statistics inside the kernel (read once at any length), odd row lengths included; written scheduled,
  with a serial form for the CPU.
- ``cpu``: one block per row, three vectorised passes (max, exp with sum, scale) with ``vexp``.

Numerics (ONNX Softmax / LogSoftmax, opset 13): ``y = exp(x - max) / sum(exp(x - max))`` and
``y = x - max - log(sum(exp(x - max)))`` over the row, computed in float32 for every input type.
``-inf`` entries give 0, a row holding NaN or ``+inf`` gives NaN, huge magnitudes stay finite.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

ACC = "float32"


def _normalized(kind: str, x, row_max, row_sum, exp=T.exp):
    """One output element (float32) from the float32 input value and the row's statistics."""
    if kind == "log_softmax":
        return x - row_max - T.log(row_sum)
    return exp(x - row_max) * (T.float32(1) / row_sum)


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


def cuda_rows(rows: int, cols: int, dtype: str, kind: str, lanes: int, vec: int, per_thread: int, cache: str = ""):
    """Row-resident softmax: blocks load / row_max / row_sum / normalize / store over [r, j, l, v].

    ``cache`` is the dtype of the cached row (default: the input's).
    """
    nvec = cols // vec  # vectors per row; slots j * lanes + l >= nvec are padding
    J, L, V = per_thread, lanes, vec
    cache = cache or dtype

    @T.prim_func(s_tir=True)
    def func(x: T.Buffer((rows, cols), dtype), y: T.Buffer((rows, cols), dtype)):
        T.func_attr({"tirx.noalias": True})
        xc = T.sblock_alloc_buffer((rows, J, L, V), cache)
        row_max = T.sblock_alloc_buffer((rows,), ACC)
        ec = T.sblock_alloc_buffer((rows, J, L, V), ACC)  # exp(x - max), computed once per element
        row_sum = T.sblock_alloc_buffer((rows,), ACC)
        yc = T.sblock_alloc_buffer((rows, J, L, V), dtype)
        for r, j, l, v in T.grid(rows, J, L, V):
            with T.sblock("load"):
                vr, vj, vl, vv = T.axis.remap("SSSS", [r, j, l, v])
                xc[vr, vj, vl, vv] = T.if_then_else(
                    vj * L + vl < nvec, T.Cast(cache, x[vr, (vj * L + vl) * V + vv]), T.Cast(cache, T.float32("-inf"))
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
                ec[vr, vj, vl, vv] = T.exp(T.Cast(ACC, xc[vr, vj, vl, vv]) - row_max[vr])
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


def cuda_split(rows: int, cols: int, dtype: str, kind: str, lanes: int, vec: int, per_thread: int, chunks: int):
    """Split-row softmax: kernel 1 writes per-chunk (max, sum exp(x - max)); kernel 2 combines them
    (``S = sum_q s_q * exp(m_q - M)``) and normalises its chunk. Chunk ``p`` holds row vectors
    ``(p * per_thread + j) * lanes + l``."""
    nvec = cols // vec
    J, L, V, P = per_thread, lanes, vec, chunks

    @T.prim_func(s_tir=True)
    def func(x: T.Buffer((rows, cols), dtype), y: T.Buffer((rows, cols), dtype)):
        T.func_attr({"tirx.noalias": True})
        xa = T.sblock_alloc_buffer((rows, P, J, L, V), dtype)
        part_max = T.sblock_alloc_buffer((rows, P), ACC)
        part_sum = T.sblock_alloc_buffer((rows, P), ACC)
        part = T.sblock_alloc_buffer((rows, P, 2), ACC)  # kernel 1 -> kernel 2: (max, sum) per chunk
        xb = T.sblock_alloc_buffer((rows, P, J, L, V), dtype)
        row_max = T.sblock_alloc_buffer((rows, P), ACC)
        row_sum = T.sblock_alloc_buffer((rows, P), ACC)
        yb = T.sblock_alloc_buffer((rows, P, J, L, V), dtype)
        for r, p, j, l, v in T.grid(rows, P, J, L, V):
            with T.sblock("load_1"):
                vr, vp, vj, vl, vv = T.axis.remap("SSSSS", [r, p, j, l, v])
                xa[vr, vp, vj, vl, vv] = T.if_then_else(
                    (vp * J + vj) * L + vl < nvec,
                    x[vr, ((vp * J + vj) * L + vl) * V + vv],
                    T.Cast(dtype, T.float32("-inf")),
                )
        for r, p, j, l, v in T.grid(rows, P, J, L, V):
            with T.sblock("part_max"):
                vr, vp, vj, vl, vv = T.axis.remap("SSRRR", [r, p, j, l, v])
                with T.init():
                    part_max[vr, vp] = T.min_value(ACC)
                part_max[vr, vp] = T.max(part_max[vr, vp], T.Cast(ACC, xa[vr, vp, vj, vl, vv]))
        for r, p, j, l, v in T.grid(rows, P, J, L, V):
            with T.sblock("part_sum"):
                vr, vp, vj, vl, vv = T.axis.remap("SSRRR", [r, p, j, l, v])
                with T.init():
                    part_sum[vr, vp] = T.float32(0)
                part_sum[vr, vp] = part_sum[vr, vp] + T.exp(T.Cast(ACC, xa[vr, vp, vj, vl, vv]) - part_max[vr, vp])
        for r, p, i in T.grid(rows, P, 2):
            with T.sblock("save"):
                vr, vp, vi = T.axis.remap("SSS", [r, p, i])
                part[vr, vp, vi] = T.Select(vi == 0, part_max[vr, vp], part_sum[vr, vp])
        # Kernel 2 walks the chunks in reverse, so it starts on those kernel 1 read last (still in L2).
        for r, p, j, l, v in T.grid(rows, P, J, L, V):
            with T.sblock("load_2"):
                vr, vp, vj, vl, vv = T.axis.remap("SSSSS", [r, p, j, l, v])
                xb[vr, vp, vj, vl, vv] = T.if_then_else(
                    ((P - 1 - vp) * J + vj) * L + vl < nvec,
                    x[rows - 1 - vr, (((P - 1 - vp) * J + vj) * L + vl) * V + vv],
                    T.Cast(dtype, T.float32("-inf")),
                )
        for r, p, q in T.grid(rows, P, P):
            with T.sblock("row_max"):
                vr, vp, vq = T.axis.remap("SSR", [r, p, q])
                with T.init():
                    row_max[vr, vp] = T.min_value(ACC)
                row_max[vr, vp] = T.max(row_max[vr, vp], part[rows - 1 - vr, vq, 0])
        for r, p, q in T.grid(rows, P, P):
            with T.sblock("row_sum"):
                vr, vp, vq = T.axis.remap("SSR", [r, p, q])
                with T.init():
                    row_sum[vr, vp] = T.float32(0)
                row_sum[vr, vp] = row_sum[vr, vp] + part[rows - 1 - vr, vq, 1] * T.exp(
                    part[rows - 1 - vr, vq, 0] - row_max[vr, vp]
                )
        for r, p, j, l, v in T.grid(rows, P, J, L, V):
            with T.sblock("normalize"):
                vr, vp, vj, vl, vv = T.axis.remap("SSSSS", [r, p, j, l, v])
                yb[vr, vp, vj, vl, vv] = T.Cast(
                    dtype, _normalized(kind, T.Cast(ACC, xb[vr, vp, vj, vl, vv]), row_max[vr, vp], row_sum[vr, vp])
                )
        for r, p, j, l, v in T.grid(rows, P, J, L, V):
            with T.sblock("store"):
                vr, vp, vj, vl, vv = T.axis.remap("SSSSS", [r, p, j, l, v])
                if ((P - 1 - vp) * J + vj) * L + vl < nvec:
                    y[rows - 1 - vr, (((P - 1 - vp) * J + vj) * L + vl) * V + vv] = yb[vr, vp, vj, vl, vv]

    return func


# Group handshake states of a chunk (``cuda_chunks`` with chunks > 1).
_WAITING, _RELEASED, _GAVE_UP = 0, 1, 2


def cuda_chunks(rows: int, cols: int, dtype: str, kind: str, lanes: int, vec: int, per_thread: int, chunks: int,
                min_blocks: int = 0, patience: int = 1 << 21, cuda: bool = True):
    """Softmax that reads the input once at any row length, written already scheduled: a row is cut into
    ``chunks`` slices, one per block of ``lanes`` threads, each thread holding ``per_thread`` vectors of
    ``vec`` elements of its slice in registers until the row's statistics are known.

    Statistics go thread -> block -> row: each thread takes its own max ``m_t`` and ``s_t = sum exp(x - m_t)``
    (no barrier, so a warp starts on its exponentials as soon as its loads land), the block combines those,
    and with several chunks the row's blocks combine theirs through global memory (below). The output is
    ``exp(x - m_t) * (exp(m_t - M) / S)`` from the kept float32 exponentials.

    Odd row lengths keep 128-bit accesses: each row is cut into a head (up to the first ``vec``-aligned
    element), aligned body vectors and a tail; the at most ``2 * (vec - 1)`` head and tail elements are
    single elements held by the first lanes of the row's last chunk.

    Row combine (a small kernel zeroes the flags first): a block writes its (max, sum) partial, then counts
    itself in, and waits until the row's count is complete; then all read the partials. A block still waiting
    after ``patience`` clock cycles (more chunks than the GPU holds at once, e.g. a MIG slice) gives its slice
    up instead (its state ``_WAITING -> _GAVE_UP``) and exits; the block that completes the count settles
    every other chunk's state (``_WAITING -> _RELEASED``, one atomic each, so exactly one of the two wins)
    and normalises the given-up slices from memory. No block waits on one that is not running, so no grid
    size can deadlock. ``min_blocks`` (>= 1) is the launch bound's blocks per SM, which caps the registers per
    thread. ``cuda=False`` emits the same kernel with serial loops and plain memory operations for the CPU,
    where every block but the last of a row gives up.
    """
    L, V, J, P = lanes, vec, per_thread, chunks
    NB, NF = rows * P, rows * (P + 1)  # blocks; flags: each chunk's handshake state, then each row's count
    NZ = max(NF, 2 * NB)
    E = 2 * (V - 1) if cols % V else 0  # head + tail elements
    assert P <= L and E <= L and P * J * L * V >= cols - E, "one partial and one edge element per thread, all covered"
    keep = kind == "softmax"  # log_softmax needs the input, not the exponentials
    local, shared = ("local", "shared") if cuda else ("global", "global")
    ninf = T.Cast(dtype, T.float32("-inf"))

    def loop(n: int, tag: str):
        return T.thread_binding(n, thread=tag) if cuda else T.serial(n)

    vloop = T.vectorized if cuda else T.serial

    def row(b):
        return b // P

    def head(b):
        """Elements before the row's first ``vec``-aligned one (all of them in a row shorter than that).
        Written as ``first aligned vector * vec - row start`` so that TVM can prove body accesses aligned."""
        if not E:
            return 0
        h = (row(b) * cols + V - 1) // V * V - row(b) * cols
        return T.min(h, cols) if cols < V else h

    def nbody(b):
        return (cols - head(b)) // V

    def col(b, q, j, l, v):
        """Column of element v of body vector j of thread l in chunk q."""
        return head(b) + ((q * J + j) * L + l) * V + v

    def in_body(b, q, j, l):
        return (q * J + j) * L + l < nbody(b)

    def edge_col(l):
        """Head elements 0 .. vec-2, then tail elements from the row's end backwards."""
        return T.Select(l < V - 1, l, cols + V - 2 - l)

    def in_edge(b, q, l):
        tail = cols - head(b) - nbody(b) * V
        return tirx.all(q == P - 1, l < E, T.Select(l < V - 1, l < head(b), l - (V - 1) < tail))

    def value(xv, m, s):
        return T.Cast(dtype, _normalized(kind, T.Cast(ACC, xv), m, s))

    def max_init(xe, b, l):
        return T.max(T.Cast(ACC, xe[b, l]), T.min_value(ACC)) if E else T.min_value(ACC)

    def sum_init(xe, ee, tmax, b, l):
        if not E:
            return T.float32(0)
        return ee[b, l] if keep else T.exp(T.Cast(ACC, xe[b, l]) - tmax[b, l])

    def exp_of(xc, ec, tmax, b, j, l, v):
        return ec[b, j, l, v] if keep else T.exp(T.Cast(ACC, xc[b, j, l, v]) - tmax[b, l])

    def kept(gone, b, l):
        """This block still owns its slice (it did not give it up)."""
        return gone[b, l] == 0 if P > 1 else tirx.const(True)

    def from_l2(buf, i):
        """``buf[i]`` written by other blocks: from L2 on the GPU (L1 is not coherent across blocks)."""
        return T.call_extern(buf.dtype, "__ldcg", T.address_of(buf[i])) if cuda else buf[i]

    def stats(gmax, gsum, bmax, bsum, b):
        """The row's (max, sum): the row combine's (chunks > 1) or the block's."""
        return (gmax[b], gsum[b]) if P > 1 else (bmax[b], bsum[b])

    def scale_of(tmax, st):
        """A thread's output scale ``exp(m_t - M) / S``."""
        return T.exp(tmax - st[0]) * (T.float32(1) / st[1])

    def out(xv, ev, scale, st):
        """Output element from the kept exponential ev (times the thread's scale) or the cached input xv."""
        return T.Cast(dtype, ev * scale) if keep else value(xv, *st)

    @T.prim_func(s_tir=True)
    def func(x: T.Buffer((rows, cols), dtype), y: T.Buffer((rows, cols), dtype)):
        T.func_attr({"tirx.noalias": True})
        xc = T.sblock_alloc_buffer((NB, J, L, V), dtype, scope=local)
        xe = T.sblock_alloc_buffer((NB, L), dtype, scope=local)
        ec = T.sblock_alloc_buffer((NB, J, L, V), ACC, scope=local)
        yc = T.sblock_alloc_buffer((NB, J, L, V), dtype, scope=local)
        ee = T.sblock_alloc_buffer((NB, L), ACC, scope=local)
        tmax = T.sblock_alloc_buffer((NB, L), ACC, scope=local)
        tsum = T.sblock_alloc_buffer((NB, L), ACC, scope=local)
        bmax = T.sblock_alloc_buffer((NB,), ACC, scope=local)
        bsum = T.sblock_alloc_buffer((NB,), ACC, scope=local)
        pm = T.sblock_alloc_buffer((NB, L), ACC, scope=local)
        ps = T.sblock_alloc_buffer((NB, L), ACC, scope=local)
        gmax = T.sblock_alloc_buffer((NB,), ACC, scope=local)
        gsum = T.sblock_alloc_buffer((NB,), ACC, scope=local)
        sc = T.sblock_alloc_buffer((NB, L), ACC, scope=local)
        part = T.sblock_alloc_buffer((NB * 2,), ACC)
        flags = T.sblock_alloc_buffer((NF,), "int32")
        sh = T.sblock_alloc_buffer((NB, 2), "int32", scope=shared)  # [last to arrive, gave up]
        redo = T.sblock_alloc_buffer((NB, P), "int32", scope=shared)
        # the shared flags, copied to registers (TVM's barrier planning rejects shared loads in conditions)
        last = T.sblock_alloc_buffer((NB, L), "int32", scope=local)
        gone = T.sblock_alloc_buffer((NB, L), "int32", scope=local)
        todo = T.sblock_alloc_buffer((NB, L), "int32", scope=local)
        if P > 1:  # (zeroing the partials too keeps their allocation outside the blocks on the CPU)
            for bz in loop((NZ + 255) // 256, "blockIdx.x"):
                for tz in loop(256, "threadIdx.x"):
                    with T.sblock("zero"):
                        vz = T.axis.spatial((NZ + 255) // 256 * 256, bz * 256 + tz)
                        T.reads()
                        T.writes(flags[vz], part[vz])
                        if vz < NF:
                            flags[vz] = _WAITING
                        if vz < NB * 2:
                            part[vz] = T.float32(0)
        for b in loop(NB, "blockIdx.x"):
            with T.attr(0, "tirx.launch_bounds_min_blocks_per_sm", max(1, min_blocks)):
                for l in loop(L, "threadIdx.x"):
                    for j in T.unroll(J):
                        for v in vloop(V):
                            with T.sblock("load"):
                                vb, vj, vl, vv = T.axis.remap("SSSS", [b, j, l, v])
                                xc[vb, vj, vl, vv] = T.if_then_else(
                                    in_body(vb, vb % P, vj, vl), x[row(vb), col(vb, vb % P, vj, vl, vv)], ninf)
                    if E > 0:
                        with T.sblock("load_edge"):
                            vb, vl = T.axis.remap("SS", [b, l])
                            xe[vb, vl] = T.if_then_else(in_edge(vb, vb % P, vl), x[row(vb), edge_col(vl)], ninf)
                for l in loop(L, "threadIdx.x"):
                    for j in T.unroll(J):
                        for v in T.unroll(V):
                            with T.sblock("thread_max"):
                                vb, vj, vl, vv = T.axis.remap("SRSR", [b, j, l, v])
                                with T.init():
                                    tmax[vb, vl] = max_init(xe, vb, vl)
                                tmax[vb, vl] = T.max(tmax[vb, vl], T.Cast(ACC, xc[vb, vj, vl, vv]))
                    if keep:
                        for j in T.unroll(J):
                            for v in T.unroll(V):
                                with T.sblock("exp"):
                                    vb, vj, vl, vv = T.axis.remap("SSSS", [b, j, l, v])
                                    ec[vb, vj, vl, vv] = T.exp(T.Cast(ACC, xc[vb, vj, vl, vv]) - tmax[vb, vl])
                        if E > 0:
                            with T.sblock("exp_edge"):
                                vb, vl = T.axis.remap("SS", [b, l])
                                ee[vb, vl] = T.exp(T.Cast(ACC, xe[vb, vl]) - tmax[vb, vl])
                    for j in T.unroll(J):
                        for v in T.unroll(V):
                            with T.sblock("thread_sum"):
                                vb, vj, vl, vv = T.axis.remap("SRSR", [b, j, l, v])
                                with T.init():
                                    tsum[vb, vl] = sum_init(xe, ee, tmax, vb, vl)
                                tsum[vb, vl] = tsum[vb, vl] + exp_of(xc, ec, tmax, vb, vj, vl, vv)
                for l in loop(L, "threadIdx.x"):
                    with T.sblock("block_max"):
                        vb, vl = T.axis.remap("SR", [b, l])
                        with T.init():
                            bmax[vb] = T.min_value(ACC)
                        bmax[vb] = T.max(bmax[vb], tmax[vb, vl])
                for l in loop(L, "threadIdx.x"):
                    with T.sblock("block_sum"):
                        vb, vl = T.axis.remap("SR", [b, l])
                        with T.init():
                            bsum[vb] = T.float32(0)
                        bsum[vb] = bsum[vb] + tsum[vb, vl] * T.exp(tmax[vb, vl] - bmax[vb])
                if P > 1:
                    for l in loop(L, "threadIdx.x"):
                        with T.sblock("arrive"):
                            vb, vl = T.axis.remap("SS", [b, l])
                            T.reads(bmax[vb], bsum[vb], flags[NB + row(vb)])
                            T.writes(part[vb * 2:vb * 2 + 2], flags[NB + row(vb)], sh[vb, 0])
                            if vl == 0:
                                part[vb * 2] = bmax[vb]
                                part[vb * 2 + 1] = bsum[vb]
                                if cuda:
                                    T.evaluate(T.call_extern("void", "__threadfence"))
                                    sh[vb, 0] = T.Cast("int32", T.call_extern(
                                        "int32", "atomicAdd", T.address_of(flags[NB + row(vb)]), 1) == P - 1)
                                else:
                                    flags[NB + row(vb)] = flags[NB + row(vb)] + 1
                                    sh[vb, 0] = T.Cast("int32", flags[NB + row(vb)] == P)
                    for l in loop(L, "threadIdx.x"):
                        with T.sblock("last"):
                            vb, vl = T.axis.remap("SS", [b, l])
                            last[vb, vl] = sh[vb, 0]
                    for l in loop(L, "threadIdx.x"):
                        with T.sblock("handshake"):
                            vb, vl = T.axis.remap("SS", [b, l])
                            T.reads(last[vb, vl], flags[row(vb) * P:row(vb) * P + P], flags[NB + row(vb)])
                            T.writes(sh[vb, 1], redo[vb, 0:P], flags[row(vb) * P:row(vb) * P + P])
                            if last[vb, vl] == 1:  # the last to arrive: release the others, note who gave up
                                if vl == 0:
                                    sh[vb, 1] = 0
                                    if cuda:  # the partials written before the others' counts are visible now
                                        T.evaluate(T.call_extern("void", "__threadfence"))
                                if vl < P:
                                    redo[vb, vl] = 0
                                    if vl != vb % P:
                                        if cuda:
                                            redo[vb, vl] = T.Cast("int32", T.call_extern(
                                                "int32", "atomicCAS", T.address_of(flags[row(vb) * P + vl]),
                                                _WAITING, _RELEASED) == _GAVE_UP)
                                        else:
                                            redo[vb, vl] = T.Cast("int32", flags[row(vb) * P + vl] == _GAVE_UP)
                                            flags[row(vb) * P + vl] = T.Select(
                                                flags[row(vb) * P + vl] == _WAITING, _RELEASED, flags[row(vb) * P + vl])
                            elif vl == 0:  # wait for the row's count, or give the slice up
                                if cuda:  # (__ldcg is volatile: read again on every iteration)
                                    t0 = T.call_extern("int64", "clock64")
                                    while from_l2(flags, NB + row(vb)) < P and (
                                            T.call_extern("int64", "clock64") - t0 < T.int64(patience)):
                                        T.evaluate(0)
                                    sh[vb, 1] = 0
                                    if from_l2(flags, NB + row(vb)) < P:
                                        sh[vb, 1] = T.Cast("int32", T.call_extern(
                                            "int32", "atomicCAS", T.address_of(flags[vb]), _WAITING, _GAVE_UP
                                        ) == _WAITING)
                                    T.evaluate(T.call_extern("void", "__threadfence"))
                                else:
                                    sh[vb, 1] = T.Cast("int32", flags[vb] == _WAITING)
                                    flags[vb] = T.Select(flags[vb] == _WAITING, _GAVE_UP, flags[vb])
                    for l in loop(L, "threadIdx.x"):
                        with T.sblock("gone"):
                            vb, vl = T.axis.remap("SS", [b, l])
                            gone[vb, vl] = sh[vb, 1]
                    for l in loop(L, "threadIdx.x"):
                        with T.sblock("load_part"):
                            vb, vl = T.axis.remap("SS", [b, l])
                            T.reads(part[row(vb) * P * 2:row(vb) * P * 2 + P * 2])
                            T.writes(pm[vb, vl], ps[vb, vl])
                            pm[vb, vl] = T.min_value(ACC)
                            ps[vb, vl] = T.float32(0)
                            if vl < P:
                                pm[vb, vl] = from_l2(part, (row(vb) * P + vl) * 2)
                                ps[vb, vl] = from_l2(part, (row(vb) * P + vl) * 2 + 1)
                    for l in loop(L, "threadIdx.x"):
                        with T.sblock("row_max"):
                            vb, vl = T.axis.remap("SR", [b, l])
                            with T.init():
                                gmax[vb] = T.min_value(ACC)
                            gmax[vb] = T.max(gmax[vb], pm[vb, vl])
                    for l in loop(L, "threadIdx.x"):
                        with T.sblock("row_sum"):
                            vb, vl = T.axis.remap("SR", [b, l])
                            with T.init():
                                gsum[vb] = T.float32(0)
                            gsum[vb] = gsum[vb] + ps[vb, vl] * T.exp(pm[vb, vl] - gmax[vb])
                for l in loop(L, "threadIdx.x"):
                    if keep:
                        with T.sblock("scale"):
                            vb, vl = T.axis.remap("SS", [b, l])
                            sc[vb, vl] = scale_of(tmax[vb, vl], stats(gmax, gsum, bmax, bsum, vb))
                    for j in T.unroll(J):  # per vector: normalise in registers (unrolled), then one vector store
                        for v in T.unroll(V):
                            with T.sblock("normalize"):
                                vb, vj, vl, vv = T.axis.remap("SSSS", [b, j, l, v])
                                yc[vb, vj, vl, vv] = out(xc[vb, vj, vl, vv], ec[vb, vj, vl, vv], sc[vb, vl],
                                                         stats(gmax, gsum, bmax, bsum, vb))
                        for v in vloop(V):
                            with T.sblock("store"):
                                vb, vj, vl, vv = T.axis.remap("SSSS", [b, j, l, v])
                                if kept(gone, vb, vl) and in_body(vb, vb % P, vj, vl):
                                    y[row(vb), col(vb, vb % P, vj, vl, vv)] = yc[vb, vj, vl, vv]
                    if E > 0:
                        with T.sblock("store_edge"):
                            vb, vl = T.axis.remap("SS", [b, l])
                            if kept(gone, vb, vl) and in_edge(vb, vb % P, vl):
                                y[row(vb), edge_col(vl)] = out(
                                    xe[vb, vl], ee[vb, vl], sc[vb, vl], stats(gmax, gsum, bmax, bsum, vb))
                if P > 1:  # the releasing block normalises the slices given up, from memory
                    for l in loop(L, "threadIdx.x"):
                        for q in range(P):
                            with T.sblock("redo_flag"):
                                vb, vl, vq = T.axis.remap("SSS", [b, l, q])
                                todo[vb, vl] = redo[vb, vq] * last[vb, vl]
                            for j, v in T.grid(J, V):  # scalar: a fallback, not a fast path
                                with T.sblock("redo"):
                                    vb, vq, vj, vl, vv = T.axis.remap("SSSSS", [b, q, j, l, v])
                                    if todo[vb, vl] == 1 and in_body(vb, vq, vj, vl):
                                        y[row(vb), col(vb, vq, vj, vl, vv)] = value(
                                            x[row(vb), col(vb, vq, vj, vl, vv)], gmax[vb], gsum[vb])
                            if E > 0:
                                with T.sblock("redo_edge"):
                                    vb, vl, vq = T.axis.remap("SSS", [b, l, q])
                                    if todo[vb, vl] == 1 and in_edge(vb, vq, vl):
                                        y[row(vb), edge_col(vl)] = value(x[row(vb), edge_col(vl)], gmax[vb], gsum[vb])
    return func


def vexp(value):
    """float32 ``exp`` from +, *, floor and bit shifts (the Cephes ``expf`` polynomial, ~1 ulp).

    Hand-written because LLVM scalarises ``llvm.exp`` on vectors into libm calls, and TVM's
    ``fast_exp`` clamps NaN away (a NaN row must stay NaN). Here ``exp(-inf) = 0``, ``exp(+inf) = inf``
    and NaN propagates; results below 2^-126 flush to 0 and arguments above 88 give inf (softmax only
    evaluates x - max <= 0).
    """
    f32 = lambda c: tirx.const(c, ACC)  # noqa: E731
    lo, hi = f32(-87.33654), f32(88.0)
    v, t, n, f = (tirx.Var(name, ACC) for name in "vtnf")
    poly = f32(1.9875691500e-4)
    for c in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        poly = poly * f + f32(c)
    poly = poly * f * f + f + f32(1)
    # t = v / ln2 + 1.5 * 2^23 rounds v / ln2 to the integer n held in t's low mantissa bits, so
    # (bits(t) << 23) + (127 << 23) are the bits of 2^n: no float -> int conversion (undefined for NaN).
    # Out-of-range v is answered by the Selects; NaN flows through poly.
    two_n = tirx.reinterpret(ACC, tirx.shift_left(tirx.reinterpret("int32", t), 23) + (127 << 23))
    body = tirx.Select(v < lo, f32(0), tirx.Select(v > hi, f32(float("inf")), poly * two_n))
    body = tirx.Let(f, v - n * f32(0.693359375) + n * f32(2.12194440e-4), body)
    body = tirx.Let(n, t - f32(12582912.0), body)
    body = tirx.Let(t, v * f32(1.4426950408889634) + f32(12582912.0), body)
    return tirx.Let(v, value, body)


def cpu(rows: int, cols: int, dtype: str, kind: str, lanes: int):
    """One block per row (the schedule runs rows in parallel): three passes over the row while it is in
    cache, a ``lanes``-wide running max, ``exp(x - max)`` with a running sum, and the scaling.

    The vector loops are written vectorised, the ``cols % lanes`` tail scalar: TVM's ``vectorize`` refuses
    a loop that carries a reduction, and ``rfactor`` does not compose with ``compute_at``. A float32 softmax
    keeps ``exp(x - max)`` in ``y`` between the last two passes (as onnxruntime does); otherwise it is
    recomputed, so a float16 ``y`` never holds an unscaled, twice-rounded value.
    """
    full, tail = divmod(cols, lanes)
    keep = kind == "softmax" and dtype == ACC

    def exp_of(x, y, r, k, stat):
        """exp(x[r, k] - row max): kept in y, or computed."""
        return y[r, k] if keep else vexp(T.Cast(ACC, x[r, k]) - stat[0])

    def value(x, y, r, k, stat):
        """Output element k of row r, with stat = (row max, 1 / row sum or log row sum)."""
        if kind == "log_softmax":
            return T.Cast(dtype, T.Cast(ACC, x[r, k]) - stat[0] - stat[1])
        return T.Cast(dtype, exp_of(x, y, r, k, stat) * stat[1])

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
                for l in T.vectorized(lanes):
                    acc[l] = T.min_value(ACC)
                for ko in range(full):
                    for l in T.vectorized(lanes):
                        acc[l] = T.max(acc[l], T.Cast(ACC, x[vr, ko * lanes + l]))
                for t in range(tail):
                    acc[t] = T.max(acc[t], T.Cast(ACC, x[vr, full * lanes + t]))
                stat[0] = acc[0]
                for l in range(1, lanes):
                    stat[0] = T.max(stat[0], acc[l])
                for l in T.vectorized(lanes):
                    acc[l] = T.float32(0)
                for ko in range(full):
                    for l in T.vectorized(lanes):
                        if keep:
                            y[vr, ko * lanes + l] = vexp(T.Cast(ACC, x[vr, ko * lanes + l]) - stat[0])
                        acc[l] = acc[l] + exp_of(x, y, vr, ko * lanes + l, stat)
                for t in range(tail):
                    if keep:
                        y[vr, full * lanes + t] = vexp(T.Cast(ACC, x[vr, full * lanes + t]) - stat[0])
                    acc[t] = acc[t] + exp_of(x, y, vr, full * lanes + t, stat)
                stat[1] = acc[0]
                for l in range(1, lanes):
                    stat[1] = stat[1] + acc[l]
                stat[1] = T.log(stat[1]) if kind == "log_softmax" else T.float32(1) / stat[1]
                for ko in range(full):
                    for l in T.vectorized(lanes):
                        y[vr, ko * lanes + l] = value(x, y, vr, ko * lanes + l, stat)
                for t in range(tail):
                    y[vr, full * lanes + t] = value(x, y, vr, full * lanes + t, stat)

    return func
