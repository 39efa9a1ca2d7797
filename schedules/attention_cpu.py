"""Fused attention for CPUs: tiled, online softmax, vectorised, parallel over batch x heads x query tiles.

Each task owns ``BQ`` query rows of one (batch, head): it streams the keys in tiles of ``BK``,
keeping scores for one tile only (``BQ x BK`` floats) and the running max / sum / output rows,
so the score matrix never reaches memory. Key tiles wholly above a causal diagonal are skipped.
All arithmetic is fp32 whatever the input type; the key tile is stored transposed so that the
score and the output updates are both unit-stride vector loops.
"""

from __future__ import annotations

import tvm
from tvm.script import tirx as T

BQ = 16  # query rows per task
BK = 64  # keys per tile (the vector loops run over it)


def kernel(spec, target: tvm.target.Target) -> tvm.tirx.PrimFunc:
    """The CPU kernel for ``spec`` (an ``AttentionSpec``; its shapes may be symbolic)."""
    H, HKV, D, DV, G = spec.heads, spec.kv_heads, spec.head_dim, spec.head_dim_v, spec.group
    dtype, scale = spec.dtype, spec.scale
    has_bias, causal, bottom_right = spec.bias_shape is not None, spec.causal != "none", spec.causal == "BottomRight"
    # bias broadcasts over an axis of extent 1; index it with 0 there
    bias_full = [not (isinstance(n, tvm.tirx.IntImm) and n.value == 1) for n in (spec.bias_shape or [1] * 3)[:3]]
    f32, neg_inf = "float32", T.float32("-inf")

    def keep(i, j, skv, offset):  # key j exists and is visible from query row i
        return tvm.tirx.all(j < skv, j <= i + offset) if causal else j < skv

    def bias_at(bias, b, h, i, j):
        idx = [x if full else 0 for x, full in zip((b, h, i), bias_full)]
        return T.Cast(f32, bias[(*idx, j)])

    @T.macro
    def body(q, k, v, bias, out, batch, sq, skv):
        nq = (sq + BQ - 1) // BQ
        offset = T.max(sq - skv, skv - sq) if bottom_right else T.int64(0)
        for task in T.parallel(batch * H * nq):
            b = task // (H * nq)
            h = task // nq % H
            i0 = task % nq * BQ
            hk = h // G
            qs = T.alloc_buffer((BQ, D), f32)
            kt = T.alloc_buffer((D, BK), f32)
            vt = T.alloc_buffer((BK, DV), f32)
            s = T.alloc_buffer((BQ, BK), f32)
            o = T.alloc_buffer((BQ, DV), f32)
            m = T.alloc_buffer((BQ,), f32)
            lsum = T.alloc_buffer((BQ,), f32)
            mx = T.alloc_buffer((1,), f32)
            for i, dd in T.grid(BQ, D):
                qs[i, dd] = T.if_then_else(
                    i0 + i < sq, T.Cast(f32, q[b, T.min(i0 + i, sq - 1), h, dd]) * T.float32(scale), T.float32(0)
                )
            for i in range(BQ):
                m[i] = neg_inf
                lsum[i] = T.float32(0)
                for c in T.vectorized(DV):
                    o[i, c] = T.float32(0)
            kv_end = T.min(skv, T.min(i0 + BQ, sq) + offset) if causal else skv
            for t in range((kv_end + BK - 1) // BK):
                j0 = t * BK
                for jj, dd in T.grid(BK, D):
                    kt[dd, jj] = T.if_then_else(j0 + jj < skv, T.Cast(f32, k[b, T.min(j0 + jj, skv - 1), hk, dd]), T.float32(0))
                for jj in range(BK):
                    for c in T.vectorized(DV):
                        vt[jj, c] = T.if_then_else(j0 + jj < skv, T.Cast(f32, v[b, T.min(j0 + jj, skv - 1), hk, c]), T.float32(0))
                for i in range(BQ):
                    for jj in T.vectorized(BK):
                        s[i, jj] = T.float32(0)
                    for dd in range(D):
                        for jj in T.vectorized(BK):
                            s[i, jj] = s[i, jj] + qs[i, dd] * kt[dd, jj]
                    for jj in T.vectorized(BK):
                        visible = T.meta_var(keep(i0 + i, j0 + jj, skv, offset))
                        if has_bias:
                            add = T.meta_var(bias_at(bias, b, h, T.min(i0 + i, sq - 1), T.min(j0 + jj, skv - 1)))
                            s[i, jj] = T.if_then_else(visible, s[i, jj] + add, neg_inf)
                        else:
                            s[i, jj] = T.if_then_else(visible, s[i, jj], neg_inf)
                    # online softmax: new running max, rescale what was accumulated so far
                    mx[0] = m[i]
                    for jj in range(BK):
                        mx[0] = T.max(mx[0], s[i, jj])
                    base = T.if_then_else(mx[0] == neg_inf, T.float32(0), mx[0])  # all masked so far: p = 0, not NaN
                    alpha = T.exp(m[i] - base)
                    m[i] = mx[0]
                    for jj in T.vectorized(BK):
                        s[i, jj] = T.exp(s[i, jj] - base)
                    mx[0] = T.float32(0)
                    for jj in range(BK):
                        mx[0] = mx[0] + s[i, jj]
                    lsum[i] = lsum[i] * alpha + mx[0]
                    for c in T.vectorized(DV):
                        o[i, c] = o[i, c] * alpha
                    for jj in range(BK):
                        for c in T.vectorized(DV):
                            o[i, c] = o[i, c] + s[i, jj] * vt[jj, c]
            for i in range(T.min(BQ, sq - i0)):
                for c in T.vectorized(DV):
                    out[b, i0 + i, h, c] = T.Cast(dtype, o[i, c] / lsum[i])  # 0/0 = NaN for a fully masked row

    batch, sq, skv = spec.batch, spec.seq_q, spec.seq_kv
    bias_shape = spec.bias_shape

    if has_bias:

        @T.prim_func(private=True, s_tir=True)
        def attention(q_h: T.handle, k_h: T.handle, v_h: T.handle, b_h: T.handle, o_h: T.handle):
            q = T.match_buffer(q_h, (batch, sq, H, D), dtype)
            k = T.match_buffer(k_h, (batch, skv, HKV, D), dtype)
            v = T.match_buffer(v_h, (batch, skv, HKV, DV), dtype)
            bias = T.match_buffer(b_h, bias_shape, spec.bias_dtype)
            out = T.match_buffer(o_h, (batch, sq, H, DV), dtype)
            body(q, k, v, bias, out, batch, sq, skv)

    else:

        @T.prim_func(private=True, s_tir=True)
        def attention(q_h: T.handle, k_h: T.handle, v_h: T.handle, o_h: T.handle):
            q = T.match_buffer(q_h, (batch, sq, H, D), dtype)
            k = T.match_buffer(k_h, (batch, skv, HKV, D), dtype)
            v = T.match_buffer(v_h, (batch, skv, HKV, DV), dtype)
            out = T.match_buffer(o_h, (batch, sq, H, DV), dtype)
            body(q, k, v, None, out, batch, sq, skv)

    return attention
