"""Fused attention for CPUs: tiled, online softmax, vectorised, parallel over batch x heads x query tiles.

Each task owns ``BQ`` query rows of one (batch, head): it streams the keys in tiles of ``BK``, keeping
scores for one tile only and the running max / sum / output rows, so the score matrix never reaches
memory. Key tiles wholly above a causal diagonal are skipped. All arithmetic is fp32 whatever the input
type. Everything is held transposed, query rows across the vector lanes: the scores as Sᵀ (keys x
queries), the output as Oᵀ (value columns x queries), Q as Qᵀ. Both products then broadcast one
element of a K or V row as it lies in memory against whole vectors of queries, in register blocks of
``rj`` keys (``RC`` value columns) x ``qb`` queries; the softmax's row max and sum are lane-wise (no
reduction across lanes) and rescaling a row is a vector multiply. Only Q's copy and the output's store
are transposed, once per task, not per key tile (and a bias that varies along the query rows, per key
tile). (Rows across the lanes instead, with the K tile transposed for every query tile and each row's max
and sum reduced across the lanes, took 1.2-1.7x as long: ``benchmarks/attention.py --cpu`` on 2 AVX-512
cores.) ``exp`` is a vectorisable polynomial. Few query rows per head take ``attention_cpu_decode``.
"""

from __future__ import annotations

import math

import tvm
from tvm import tirx
from tvm.script import tirx as T
from tvm.target import codegen

from .attention import broadcast_index, causal_offset, kernel_signature
from .softmax_tir import vexp as exp  # the softmax kernel's vectorisable e^(x - max); NaN stays NaN

BQ = 64  # query rows per task at most (amortises Qᵀ's copy; a whole number of register blocks' lanes)
BK = 64  # keys per tile at most (rounded up to whole register blocks)
RC = 4  # value columns per register block of Oᵀ


def lanes(target: tvm.target.Target) -> int:
    """float32 lanes of a vector register: 16 with AVX-512, else 8 (AVX2)."""
    return 16 if codegen.target_has_features("avx512f", target) else 8


def blocks(target: tvm.target.Target) -> list[tuple[int, int]]:
    """Register blocks of Sᵀ, (query lanes, keys): the main one, then, narrowest first, at most two for a sequence's
    last task where it has at most that many rows. ViT's 197 tokens are 3 tasks of 64 rows and one of 5: as 16 lanes
    instead of 64 it took 1 x 197 x 12 x 64 from 0.42 to 0.35 ms; a last task of 22 rows (150 tokens) as 32 lanes
    0.26 -> 0.22 ms, of 26 (90 tokens) 0.11 -> 0.09 (best of rounds). AVX-512's 32 registers hold 4 keys x 4 vectors
    of accumulators (6 x 4: 3 % slower at 512 keys; 8 x 4 spills; 8 x 2: 5 % slower), the narrower blocks 8 x 1 and
    8 x 2; AVX2's 16 hold 6 x 2 (4 x 2: 2 % slower, timed as AVX2 code on an AVX-512 machine)."""
    return [(64, 4), (16, 8), (32, 8)] if lanes(target) == 16 else [(16, 6)]


def transpose(rows: list) -> list:
    """The transpose of n vectors of n lanes (n a power of two) as log2(n) stages of two-input shuffles, row r and row
    r + s swapping their blocks of s lanes, which LLVM keeps in registers (unpack and permute instructions). TIR
    has no transpose of a vector block; written element by element, a 512 x 512 float32 transpose took 3.4x as long."""
    n = len(rows)
    for s in (1 << k for k in range(n.bit_length() - 1)):
        pick = [[blk + off + (n - s if off >= s else 0) + hi * s for blk in range(0, n, 2 * s) for off in range(2 * s)]
                for hi in (0, 1)]  # the lanes of (row r, row r + s) that make the new row r and row r + s
        rows = [tirx.Shuffle([rows[r & ~s], rows[r | s]], pick[bool(r & s)]) for r in range(n)]
    return rows


# Padded query rows and keys are computed in full: static lengths get the tile sizes that pad least.


def query_rows(seq_q, qb: int) -> int:
    """Query rows per task: as many tasks as BQ needs, rows shared evenly, in multiples of ``qb``; BQ if symbolic."""
    if not isinstance(seq_q, int):
        return BQ
    per_task = -(-seq_q // -(-seq_q // BQ))
    return qb * -(-per_task // qb)


def key_tile(seq_kv, rj: int) -> int:
    """Keys per tile, a multiple of ``rj`` up to BK rounded up to one: the least padding, ties to the longer tile
    (fewer rescales); the longest if symbolic."""
    longest = -(-BK // rj) * rj
    if not isinstance(seq_kv, int):
        return longest
    return min(range(4 * rj, longest + 1, rj), key=lambda t: (-(-seq_kv // t) * t, -t))


def kernel(spec, target: tvm.target.Target) -> tvm.tirx.PrimFunc:
    """The CPU kernel for ``spec`` (an ``AttentionSpec``; its shapes may be symbolic)."""
    return kernel_signature(spec, body(spec, target))


def body(spec, target: tvm.target.Target):
    """The kernel's body: a TVMScript macro ``(q, k, v, bias, out)``."""
    H, D, DV, G = spec.heads, spec.head_dim, spec.head_dim_v, spec.group
    dtype, scale = spec.dtype, spec.scale
    has_bias, causal = spec.bias_shape is not None, spec.causal != "none"
    batch, sq, skv = spec.batch, spec.seq_q, spec.seq_kv
    f32, neg_inf = "float32", T.float32("-inf")
    L = lanes(target)
    # A bias that varies along the query rows varies across the vector lanes. Read there, each vector is a gather
    # from QB bias rows; when their stride is a multiple of 1 KB those rows' cache lines share a few L1 sets and
    # evict each other between keys. Then each key tile's bias is transposed into Sᵀ first, in L x L blocks (1 x s x 8
    # x 64 with a [1, 1, s, s] bias: 1024 keys 11.0 -> 6.3 ms, 768 3.42 -> 3.24, 512 (12 heads) 2.84 -> 2.15, 256
    # 0.386 -> 0.363); at other lengths the gathers are level with it or up to 8 % faster (150, 197, 640 keys).
    # One that at least 4 (batch, head)s share (HF decoders' [b, 1, s, s] causal + padding mask) is transposed once
    # per call instead, before the tasks, into ``bt``: [1, 1, s, s] with 8-12 heads 1.06-1.15x at 197-1024 keys
    # (2 x 4 heads sharing it: level; a bias per head: 0.77-0.88x, a round trip through memory per head).
    row_bias = has_bias and not (isinstance(spec.bias_shape[-2], int) and spec.bias_shape[-2] == 1)
    stride = skv * tvm.DataType(spec.bias_dtype).bits // 8 if has_bias and isinstance(skv, int) else 0
    shared = [n for n, extent in zip((batch, H), spec.bias_shape or ()) if isinstance(extent, int) and extent == 1]
    hoist = row_bias and math.prod(n for n in shared if isinstance(n, int)) >= 4
    stage_bias = row_bias and not hoist and stride % 1024 == 0

    (QB, RJ), *few = blocks(target)
    assert all(rj % 2 == 0 for _, rj in [(QB, RJ), *few]), "a block's keys are held in two halves (acc0, acc1)"
    BQ = query_rows(sq, QB)
    if isinstance(sq, int):  # the narrowest block the last task fits, if any (a symbolic length keeps them all)
        few = [f for f in few if 0 < sq % BQ <= f[0]][:1]
    BK = key_tile(skv, math.lcm(RJ, *(rj for _, rj in few)))
    (F1, J1), (F2, J2) = (few + [(0, 1)] * 2)[:2]  # (a missing block's loop is not written)
    # each register block is held in two halves: TVM puts a local buffer of 1 KB or more on the heap, where LLVM
    # cannot keep it in registers (16 vectors of 64 bytes in one buffer: half the speed)
    HC = RC // 2
    DVP = -(-DV // RC) * RC  # Oᵀ's rows, padded to whole register blocks (zero value columns, dropped)
    if hoist:  # bt: per bias slice, keys (padded to whole tiles and L) x query rows (padded to whole tasks)
        nb, nh = (1 if isinstance(n, int) and n == 1 else n for n in spec.bias_shape[:2])
        SKP = ((skv + BK - 1) // BK * BK + L - 1) // L * L
        SQP = (sq + BQ - 1) // BQ * BQ

    @T.macro
    def store_scores(acc, rows, jb, ib, j0, i0, b, h, bias, st, QB, RJ):
        for r in T.unroll(RJ // 2):
            for ii in T.vectorized(QB):
                j = T.meta_var(jb * RJ + rows + r)
                i = T.meta_var(ib * QB + ii)
                visible = T.meta_var(spec.visible(i0 + i, j0 + j))
                if hoist:  # (``bias`` is bt)
                    row = T.meta_var(((b if nb != 1 else 0) * nh + (h if nh != 1 else 0)) * SKP + j0 + j)
                    st[j, i] = T.if_then_else(visible, acc[r, ii] + bias[row, i0 + i], neg_inf)
                elif stage_bias:
                    st[j, i] = T.if_then_else(visible, acc[r, ii] + st[j, i], neg_inf)
                elif has_bias:
                    st[j, i] = T.if_then_else(visible, acc[r, ii] + spec.bias_at(bias, b, h, i0 + i, j0 + j), neg_inf)
                else:
                    st[j, i] = T.if_then_else(visible, acc[r, ii], neg_inf)

    def bias_rows(bias, b, h, i, j) -> list:
        """L vectors of the bias in fp32: rows i .. i + L - 1 (clamped to the last), keys j .. j + L - 1."""
        row = [broadcast_index(spec.bias_shape, b, h, T.min(i + r, sq - 1)) for r in range(L)]
        return [bias[(*row[r], T.Ramp(j, 1, L))].astype(f"float32x{L}") for r in range(L)]

    @T.macro
    def bias_columns(bias, st, b, h, i, j, ii, jj, c, again):
        """Sᵀ rows jj + c .. jj + L - 1, lanes ii .. ii + L - 1 = the bias's rows i .. i + L - 1, keys j + c ..
        j + L - 1. (TVMScript has no Python loop over statements: the macro unrolls itself by calling ``again``, itself.)"""
        if c < L:
            st[jj + c, T.Ramp(ii, 1, L)] = transpose(bias_rows(bias, b, h, i, j))[c]
            again(bias, st, b, h, i, j, ii, jj, c + 1, again)

    @T.macro
    def stage_tile(bias, st, b, h, i0, j0, NQ):
        """The bias of the key tile from j0 into Sᵀ, transposed: whole L x L blocks in registers, the rest (keys past
        the end; a tile's last BK % L keys) element by element."""
        for ib, jb in T.grid(NQ // L, BK // L):
            if j0 + jb * L + L <= skv:
                bias_columns(bias, st, b, h, i0 + ib * L, j0 + jb * L, ib * L, jb * L, 0, bias_columns)
            else:
                for i, jj in T.grid(L, L):
                    st[jb * L + jj, ib * L + i] = spec.bias_at(bias, b, h, i0 + ib * L + i, j0 + jb * L + jj)
        for i, jj in T.grid(NQ, BK % L):
            st[BK - BK % L + jj, i] = spec.bias_at(bias, b, h, i0 + i, j0 + BK - BK % L + jj)

    @T.macro
    def task(q, k, v, bias, out, b, h, i0, NQ, QB, RJ):
        """NQ query rows from i0 (past the end: zeros, dropped), in register blocks of QB lanes x RJ keys."""
        hk = T.meta_var(h // G)
        HJ = T.meta_var(RJ // 2)
        offset = T.meta_var(causal_offset(sq, skv, spec.causal))
        qt = T.alloc_buffer((D, NQ), f32)
        vf = T.alloc_buffer((BK, DVP), f32)
        st = T.alloc_buffer((BK, NQ), f32)
        ot = T.alloc_buffer((DVP, NQ), f32)
        m = T.alloc_buffer((NQ,), f32)  # running max, per query row
        lsum = T.alloc_buffer((NQ,), f32)
        mx = T.alloc_buffer((NQ,), f32)  # the running max with this tile
        base = T.alloc_buffer((NQ,), f32)  # the exponents' base: mx, or 0 where every score so far is masked
        alpha = T.alloc_buffer((NQ,), f32)  # the rescale of what was accumulated so far
        acc0 = T.alloc_buffer((max(HJ, HC), QB), f32)  # a register block's two halves
        acc1 = T.alloc_buffer((max(HJ, HC), QB), f32)
        for i, dd in T.grid(NQ, D):
            qt[dd, i] = T.if_then_else(
                i0 + i < sq, T.Cast(f32, q[b, T.min(i0 + i, sq - 1), h, dd]) * T.float32(scale), T.float32(0)
            )
        for i in T.vectorized(NQ):
            m[i] = neg_inf
            lsum[i] = T.float32(0)
        for c in range(DVP):
            for i in T.vectorized(NQ):
                ot[c, i] = T.float32(0)
        kv_end = T.meta_var(T.min(skv, T.min(i0 + NQ, sq) + offset) if causal else skv)
        for t in range((kv_end + BK - 1) // BK):
            j0 = T.meta_var(t * BK)
            for jj in range(BK):
                for c in T.vectorized(DVP):
                    vf[jj, c] = T.if_then_else(
                        j0 + jj < skv and c < DV, spec.kv_at(v, b, j0 + jj, hk, T.min(c, DV - 1)), T.float32(0)
                    )
            # Sᵀ = K Qᵀ, RJ keys x QB queries at a time (each Qᵀ vector loaded once for RJ keys; K read where it
            # lies, keys past the end clamped to the last and masked: a float32 copy of the tile measured 2-5 % slower)
            if stage_bias:
                stage_tile(bias, st, b, h, i0, j0, NQ)
            for jb, ib in T.grid(BK // RJ, NQ // QB):
                for r in T.unroll(HJ):
                    for ii in T.vectorized(QB):
                        acc0[r, ii] = T.float32(0)
                        acc1[r, ii] = T.float32(0)
                for dd in range(D):
                    for r in T.unroll(HJ):
                        for ii in T.vectorized(QB):
                            acc0[r, ii] = acc0[r, ii] + spec.kv_at(k, b, j0 + jb * RJ + r, hk, dd) * qt[dd, ib * QB + ii]
                    for r in T.unroll(HJ):
                        for ii in T.vectorized(QB):
                            acc1[r, ii] = acc1[r, ii] + spec.kv_at(k, b, j0 + jb * RJ + HJ + r, hk, dd) * qt[dd, ib * QB + ii]
                store_scores(acc0, 0, jb, ib, j0, i0, b, h, bias, st, QB, RJ)
                store_scores(acc1, HJ, jb, ib, j0, i0, b, h, bias, st, QB, RJ)
            # online softmax, lane-wise: new running max, exponentials, rescale of what was accumulated so far
            for i in T.vectorized(NQ):
                mx[i] = m[i]
            for jj in range(BK):
                for i in T.vectorized(NQ):
                    mx[i] = T.max(mx[i], st[jj, i])
            for i in T.vectorized(NQ):
                base[i] = T.if_then_else(mx[i] == neg_inf, T.float32(0), mx[i])  # all masked so far: p = 0, not NaN
                alpha[i] = exp(m[i] - base[i])
                m[i] = mx[i]
                lsum[i] = lsum[i] * alpha[i]
            for jj in range(BK):
                for i in T.vectorized(NQ):
                    st[jj, i] = exp(st[jj, i] - base[i])
                    lsum[i] = lsum[i] + st[jj, i]
            # Oᵀ = alpha Oᵀ + Vᵀ P, RC value columns x QB queries at a time
            for cb, ib in T.grid(DVP // RC, NQ // QB):
                for r in T.unroll(HC):
                    for ii in T.vectorized(QB):
                        acc0[r, ii] = ot[cb * RC + r, ib * QB + ii] * alpha[ib * QB + ii]
                        acc1[r, ii] = ot[cb * RC + HC + r, ib * QB + ii] * alpha[ib * QB + ii]
                for jj in range(BK):
                    for r in T.unroll(HC):
                        for ii in T.vectorized(QB):
                            acc0[r, ii] = acc0[r, ii] + vf[jj, cb * RC + r] * st[jj, ib * QB + ii]
                    for r in T.unroll(HC):
                        for ii in T.vectorized(QB):
                            acc1[r, ii] = acc1[r, ii] + vf[jj, cb * RC + HC + r] * st[jj, ib * QB + ii]
                for r in T.unroll(HC):
                    for ii in T.vectorized(QB):
                        ot[cb * RC + r, ib * QB + ii] = acc0[r, ii]
                        ot[cb * RC + HC + r, ib * QB + ii] = acc1[r, ii]
        # Oᵀ's column i gathered into output row i: +3-4 % at 128-197 tokens against element by element, level at 512
        # (Qᵀ's copy by gathers measured 5 % slower at 512 and stays element by element)
        for i in range(T.min(NQ, sq - i0)):
            for c in T.vectorized(DV):
                out[b, i0 + i, h, c] = T.Cast(dtype, ot[c, i] / lsum[i])  # 0/0 = NaN for a fully masked row

    nq = (sq + BQ - 1 - max([0] + [qb for qb, _ in few])) // BQ  # tasks of the main register block per (batch, head)
    has_main = not isinstance(nq, int) or nq > 0

    @T.macro
    def last_task(q, k, v, bias, out, low, FQ, FJ):
        """The (batch, head)s' last query task where it has low < rows <= FQ."""
        for t in T.parallel(batch * H):
            if low < sq % BQ and sq % BQ <= FQ:
                task(q, k, v, bias, out, t // H, t % H, sq - sq % BQ, FQ, FQ, FJ)

    @T.macro
    def transpose_bias(bias, bt):
        """bt = each bias slice transposed, L x L blocks in registers (keys past the end element by element)."""
        for t in T.parallel(nb * nh * (SQP // L)):
            sl = T.meta_var(t // (SQP // L))
            ib = T.meta_var(t % (SQP // L))
            for jb in range(SKP // L):
                if jb * L + L <= skv:
                    bias_columns(bias, bt, sl // nh, sl % nh, ib * L, jb * L, ib * L, sl * SKP + jb * L, 0, bias_columns)
                else:
                    for i, jj in T.grid(L, L):
                        bt[sl * SKP + jb * L + jj, ib * L + i] = spec.bias_at(bias, sl // nh, sl % nh, ib * L + i,
                                                                             jb * L + jj)

    @T.macro
    def tasks(q, k, v, bias, out):
        # the tasks of few rows in parallel loops of their own: in one loop body, StorageRewrite gave both kinds of
        # task the same memory for their register blocks, which LLVM then no longer kept in registers (1.6x as long)
        if has_main:
            for t in T.parallel(batch * H * nq):
                task(q, k, v, bias, out, t // (H * nq), t // nq % H, t % nq * BQ, BQ, QB, RJ)
        if len(few) > 0:
            last_task(q, k, v, bias, out, 0, F1, J1)
        if len(few) > 1:
            last_task(q, k, v, bias, out, F1, F2, J2)

    @T.macro
    def body(q, k, v, bias, out):
        if hoist:
            bt = T.alloc_buffer((nb * nh * SKP, SQP), f32)
            transpose_bias(bias, bt)
            tasks(q, k, v, bt, out)
        else:
            tasks(q, k, v, bias, out)

    return body
