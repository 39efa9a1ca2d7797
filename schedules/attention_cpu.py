"""Fused attention for CPUs: tiled, online softmax, vectorised, parallel over batch x heads x query tiles.

Each task owns ``BQ`` query rows of one (batch, head): it streams the keys in tiles of ``BK``,
keeping scores for one tile only (``BQ x BK`` floats) and the running max / sum / output rows,
so the score matrix never reaches memory. Key tiles wholly above a causal diagonal are skipped.
All arithmetic is fp32 whatever the input type. The key tile is stored transposed so that both
products (Q·Kᵀ and P·V) are unit-stride vector loops, run in register blocks of ``RB`` rows x two
vector registers; ``exp`` is a vectorisable polynomial.
"""

from __future__ import annotations

import tvm
from tvm.script import tirx as T
from tvm.target import codegen

from .attention import causal_offset, kernel_signature
from .softmax_tir import _add
from .softmax_tir import vexp as exp  # the softmax kernel's vectorisable e^(x - max); NaN stays NaN

BQ = 64  # query rows per task at most (amortises the K-tile transpose)
BK = 64  # keys per tile at most
RB = 4  # rows per register block


def tiles(seq_q, seq_kv, vs: int) -> tuple[int, int]:
    """(query rows per task, keys per tile): for static lengths the sizes that pad least, since padded rows and
    keys are computed in full (ViT's 197 tokens: 208 x 224 instead of 256 x 256, 1.4x less work); BQ, BK for
    symbolic ones."""
    bq, bk = BQ, BK
    if isinstance(seq_q, int):
        per_task = -(-seq_q // -(-seq_q // BQ))  # as many tasks as BQ needs, rows shared evenly
        bq = RB * -(-per_task // RB)
    if isinstance(seq_kv, int):  # a multiple of the score vectors; ties: the longer tile (fewer rescales)
        bk = min(range(max(vs, 32), BK + 1, vs), key=lambda t: (-(-seq_kv // t) * t, -t))
    return bq, bk


def kernel(spec, target: tvm.target.Target) -> tvm.tirx.PrimFunc:
    """The CPU kernel for ``spec`` (an ``AttentionSpec``; its shapes may be symbolic)."""
    H, D, DV, G = spec.heads, spec.head_dim, spec.head_dim_v, spec.group
    dtype, scale = spec.dtype, spec.scale
    has_bias, causal = spec.bias_shape is not None, spec.causal != "none"
    batch, sq, skv = spec.batch, spec.seq_q, spec.seq_kv
    f32, neg_inf = "float32", T.float32("-inf")

    # register blocks of RB rows x two vector registers of lanes: 8 independent FMA chains hide FMA latency
    VS = 32 if codegen.target_has_features("avx512f", target) else 16
    VO = next(w for w in (VS, 16, 8, 4, 2, 1) if DV % w == 0)  # output columns per register block
    BQ, BK = tiles(sq, skv, VS)

    @T.macro
    def reduce_row(s, part, i, op, init):
        """part[0] <- op over row i of the score tile: lane-wise over its vectors, then halving the lanes. (A scalar
        chain over the row's BK scores, each op waiting for the last, left the kernel 10-20 % slower: float32,
        2 x 512 x 8 x 64, 2 cores, best of 20 runs, with and without a mask.)"""
        for jj in T.vectorized(VS):
            part[jj] = init
        for jb in range(BK // VS):
            for jj in T.vectorized(VS):
                part[jj] = op(part[jj], s[i, jb * VS + jj])
        if VS == 32:  # (VS is 16 or 32)
            for jj in T.vectorized(16):
                part[jj] = op(part[jj], part[jj + 16])
        for jj in T.vectorized(8):
            part[jj] = op(part[jj], part[jj + 8])
        for jj in T.vectorized(4):
            part[jj] = op(part[jj], part[jj + 4])
        for jj in T.vectorized(2):
            part[jj] = op(part[jj], part[jj + 2])
        part[0] = op(part[0], part[1])

    @T.macro
    def body(q, k, v, bias, out):
        nq = T.meta_var((sq + BQ - 1) // BQ)
        offset = T.meta_var(causal_offset(sq, skv, spec.causal))
        for task in T.parallel(batch * H * nq):
            b = T.meta_var(task // (H * nq))
            h = T.meta_var(task // nq % H)
            i0 = T.meta_var(task % nq * BQ)
            hk = T.meta_var(h // G)
            qs = T.alloc_buffer((BQ, D), f32)
            kt = T.alloc_buffer((D, BK), f32)
            vt = T.alloc_buffer((BK, DV), f32)
            s = T.alloc_buffer((BQ, BK), f32)
            o = T.alloc_buffer((BQ, DV), f32)
            m = T.alloc_buffer((BQ,), f32)
            lsum = T.alloc_buffer((BQ,), f32)
            st = T.alloc_buffer((3,), f32)  # tile max, exponent base, tile sum
            acc = T.alloc_buffer((RB, VS), f32)  # register block of scores / outputs
            part = T.alloc_buffer((VS,), f32)  # a row's partial max / sum, one per lane
            for i, dd in T.grid(BQ, D):
                qs[i, dd] = T.if_then_else(
                    i0 + i < sq, T.Cast(f32, q[b, T.min(i0 + i, sq - 1), h, dd]) * T.float32(scale), T.float32(0)
                )
            for i in range(BQ):
                m[i] = neg_inf
                lsum[i] = T.float32(0)
                for c in T.vectorized(DV):
                    o[i, c] = T.float32(0)
            kv_end = T.meta_var(T.min(skv, T.min(i0 + BQ, sq) + offset) if causal else skv)
            for t in range((kv_end + BK - 1) // BK):
                j0 = T.meta_var(t * BK)
                for jj, dd in T.grid(BK, D):
                    kt[dd, jj] = T.if_then_else(j0 + jj < skv, T.Cast(f32, k[b, T.min(j0 + jj, skv - 1), hk, dd]), T.float32(0))
                for jj in range(BK):
                    for c in T.vectorized(DV):
                        vt[jj, c] = T.if_then_else(j0 + jj < skv, T.Cast(f32, v[b, T.min(j0 + jj, skv - 1), hk, c]), T.float32(0))
                # scores, RB rows x VS keys at a time (each key vector loaded once for RB rows)
                for ib, jb in T.grid(BQ // RB, BK // VS):
                    for r in T.unroll(RB):
                        for jj in T.vectorized(VS):
                            acc[r, jj] = T.float32(0)
                    for dd in range(D):
                        for r in T.unroll(RB):
                            for jj in T.vectorized(VS):
                                acc[r, jj] = acc[r, jj] + qs[ib * RB + r, dd] * kt[dd, jb * VS + jj]
                    for r in T.unroll(RB):
                        for jj in T.vectorized(VS):
                            i = T.meta_var(ib * RB + r)
                            j = T.meta_var(jb * VS + jj)
                            visible = T.meta_var(spec.visible(i0 + i, j0 + j))
                            if has_bias:
                                s[i, j] = T.if_then_else(visible, acc[r, jj] + spec.bias_at(bias, b, h, i0 + i, j0 + j), neg_inf)
                            else:
                                s[i, j] = T.if_then_else(visible, acc[r, jj], neg_inf)
                # online softmax per row: new running max, rescale what was accumulated so far
                for i in range(BQ):
                    reduce_row(s, part, i, T.max, neg_inf)
                    st[0] = T.max(m[i], part[0])
                    st[1] = T.if_then_else(st[0] == neg_inf, T.float32(0), st[0])  # all masked so far: p = 0, not NaN
                    for jj in T.vectorized(BK):
                        s[i, jj] = exp(s[i, jj] - st[1])
                    reduce_row(s, part, i, _add, T.float32(0))
                    st[2] = part[0]
                    for c in T.vectorized(DV):
                        o[i, c] = o[i, c] * exp(m[i] - st[1])
                    lsum[i] = lsum[i] * exp(m[i] - st[1]) + st[2]
                    m[i] = st[0]
                # o += p v, RB rows x VO columns at a time
                for ib, cb in T.grid(BQ // RB, DV // VO):
                    for r in T.unroll(RB):
                        for c in T.vectorized(VO):
                            acc[r, c] = o[ib * RB + r, cb * VO + c]
                    for jj in range(BK):
                        for r in T.unroll(RB):
                            for c in T.vectorized(VO):
                                acc[r, c] = acc[r, c] + s[ib * RB + r, jj] * vt[jj, cb * VO + c]
                    for r in T.unroll(RB):
                        for c in T.vectorized(VO):
                            o[ib * RB + r, cb * VO + c] = acc[r, c]
            for i in range(T.min(BQ, sq - i0)):
                for c in T.vectorized(DV):
                    out[b, i0 + i, h, c] = T.Cast(dtype, o[i, c] / lsum[i])  # 0/0 = NaN for a fully masked row

    return kernel_signature(spec, body)
