"""Fused attention for CPUs where each key/value head has few query rows (decoding with a KV cache: one query row
per head, or a few; grouped heads share K and V): rows down, the head dim across the vector lanes.

The main CPU kernel (``attention_cpu``) holds query rows across the lanes: with one row, 15 of 16 lanes idle, and
each query head of a group reads the shared K and V again. Here a task takes every query row of one key/value head
(``group x seq_q`` rows) over a chunk of keys, and reads each K and V row once for all of them, two rows at a time
from L1 (``rows``). A score is a dot product along the head dim: ``L`` lane-wise partial sums (two rows' L/2 keys, or
one row's L) are transposed in registers and added, one vector of L scores. The online softmax runs over vectors of
keys; P·V adds ``p x`` a V row, read as it lies, to the output rows. Chunks of keys run in parallel (as
flash-decoding does: one key/value head rarely fills the cores), and a second loop merges their (max, sum, output)
per row.
"""

from __future__ import annotations

import math

import tvm
from tvm import tirx
from tvm.script import tirx as T

from . import attention_cpu
from .attention import by_query_rows, causal_offset, kernel_signature
from .attention_cpu import lanes, transpose
from .softmax_tir import vexp as exp

# Query rows per head up to which this kernel runs: against the main kernel (2 AVX-512 cores, the kernels alone,
# interleaved, three runs, the last in rerun/attention-cpu-decode-pairs/; 32 heads sharing 8 of 128 over 2048 keys, and
# 4 x 16 heads of 64 over 1024): 4 rows 2.3-2.5x and 1.8-1.9x, 8 rows 1.1-1.3x and 1.2-1.4x, 12 rows 0.7-0.9x and
# 0.9-1.1x (its dot products and P·V grow with the rows, each pair of rows reading K and V again from L1; before
# pairs, 8 rows measured 0.6-0.8x)
MAX_SEQ_Q = 8
KC = 256  # keys per task
BT = 32  # keys per step of the online softmax (a K and a V tile of 32 x 128 float32 stay in L1)


def fits(spec, target: tvm.target.Target) -> bool:
    """Head dims in whole vectors, and not more than MAX_SEQ_Q query rows per head if that is known."""
    L = lanes(target)
    few = not isinstance(spec.seq_q, int) or spec.seq_q <= MAX_SEQ_Q
    return few and spec.head_dim % L == 0 and spec.head_dim_v % L == 0


def cpu_kernel(spec, target: tvm.target.Target) -> tvm.tirx.PrimFunc:
    """The CPU kernel for ``spec``: this one where it fits, else ``attention_cpu``'s. A query length known only at
    run time (a model exported for prefill and decoding steps alike) gets both, chosen by it."""
    if not fits(spec, target):
        return attention_cpu.kernel(spec, target)
    if isinstance(spec.seq_q, int):
        return kernel(spec, target)
    return by_query_rows(spec, MAX_SEQ_Q, body(spec, target), attention_cpu.body(spec, target))


def _reduce(v: tirx.PrimExpr, op, n: int) -> tirx.PrimExpr:
    """``op`` over the ``n`` lanes of vector ``v``, in log2(n) halvings."""
    while n > 1:
        x, n = tirx.Var("x", f"float32x{n}"), n // 2
        v = tirx.Let(x, v, op(tirx.Shuffle([x], list(range(n))), tirx.Shuffle([x], list(range(n, 2 * n)))))
    return v


def kernel(spec, target: tvm.target.Target) -> tvm.tirx.PrimFunc:
    """The decode kernel for ``spec`` (``fits``; its shapes may be symbolic)."""
    return kernel_signature(spec, body(spec, target))


def body(spec, target: tvm.target.Target):
    """The decode kernel's body: a TVMScript macro ``(q, k, v, bias, out)``."""
    HKV, G, D, DV = spec.kv_heads, spec.group, spec.head_dim, spec.head_dim_v
    dtype, batch, sq, skv = spec.dtype, spec.batch, spec.seq_q, spec.seq_kv
    has_bias, causal = spec.bias_shape is not None, spec.causal != "none"
    L, R = lanes(target), G * sq  # lanes; rows of a task: query row i of head hk * G + g is row g * sq + i
    f32, neg_inf = "float32", T.float32("-inf")
    ninf = tirx.Broadcast(neg_inf, L)
    offset = causal_offset(sq, skv, spec.causal)
    kv_end = T.min(skv, sq + offset) if causal else skv  # the keys some row sees
    nc = (kv_end + KC - 1) // KC  # chunks of keys per (batch, key/value head)
    CB = math.gcd(DV // L, 4)  # output vectors per register block of P·V

    def scores(acc0, acc1):
        """The L dot products whose lane-wise partial sums are acc0's L/2 vectors, then acc1's: transposed and added."""
        cols = transpose([a[r, T.Ramp(0, 1, L)] for a in (acc0, acc1) for r in range(L // 2)])
        while len(cols) > 1:
            cols = [a + b for a, b in zip(cols[::2], cols[1::2])]
        return cols[0]

    def half(x, hi: int):
        """Lanes [0, L/2) (hi = 0) or [L/2, L) of vector x."""
        return tirx.Shuffle([x], list(range(hi * L // 2, (hi + 1) * L // 2)))

    @T.macro
    def rows(q, k, v, bias, qf, sc, m, lsum, o, acc0, acc1, tm, stat, ob, b, hk, j0, r0, nb):
        """Rows r0 .. r0 + nb - 1 (nb = 1 or 2) over keys j0 .. j0 + BT: scores, masks, online softmax, P·V. Two rows
        share every K and V vector loaded, each load feeding two FMAs: acc0 sums row r0's dot products and acc1 row
        r0 + 1's, of the same L/2 keys (one row: acc0 and acc1 take L/2 keys each). (Against one row at a time, 2
        AVX-512 cores, the kernel alone: 1.8-2.0x with 4 to 16 rows per key/value head, 1.0-1.1x with 1.)"""
        W = T.meta_var(L // nb)  # keys per transposed vector of scores
        for u in range(BT // W):
            for kk in T.unroll(L // 2):
                for l in T.vectorized(L):
                    acc0[kk, l] = T.float32(0)
                    acc1[kk, l] = T.float32(0)
            for dd in range(D // L):
                for kk in T.unroll(L // 2):
                    for l in T.vectorized(L):
                        acc0[kk, l] = acc0[kk, l] + qf[r0, dd * L + l] * spec.kv_at(
                            k, b, j0 + u * W + kk, hk, dd * L + l)
                        acc1[kk, l] = acc1[kk, l] + qf[r0 + nb - 1, dd * L + l] * spec.kv_at(
                            k, b, j0 + u * W + (L // 2 if nb == 1 else 0) + kk, hk, dd * L + l)
            # (the transposition written twice, computed once by LLVM; stored and read back in halves instead, the
            # kernel ran 7-15 % slower)
            sc[r0, T.Ramp(u * W, 1, L // 2)] = half(scores(acc0, acc1), 0)
            sc[r0 + nb - 1, T.Ramp(u * W + (L // 2 if nb == 1 else 0), 1, L // 2)] = half(scores(acc0, acc1), 1)
        for rr in T.unroll(nb):
            r = T.meta_var(r0 + rr)
            # masks and bias; then the online softmax of the row's BT keys: lane-wise max, then across the lanes
            for jb in range(BT // L):
                j = T.meta_var(T.Ramp(j0 + jb * L, 1, L))
                seen = T.meta_var(spec.visible(r % sq, j))  # (a chunk is whole steps: none reaches the next)
                if has_bias:
                    sc[r, T.Ramp(jb * L, 1, L)] = T.Select(
                        seen, sc[r, T.Ramp(jb * L, 1, L)] + spec.bias_at(bias, b, hk * G + r // sq, r % sq, j), ninf)
                else:
                    sc[r, T.Ramp(jb * L, 1, L)] = T.Select(seen, sc[r, T.Ramp(jb * L, 1, L)], ninf)
            for l in T.vectorized(L):
                tm[l] = m[r]
            for jb in range(BT // L):
                for l in T.vectorized(L):
                    tm[l] = T.max(tm[l], sc[r, jb * L + l])
            stat[rr, 0] = _reduce(tm[T.Ramp(0, 1, L)], T.max, L)
            stat[rr, 1] = T.if_then_else(stat[rr, 0] == neg_inf, T.float32(0), stat[rr, 0])  # all masked so far: p = 0
            stat[rr, 2] = exp(m[r] - stat[rr, 1])
            m[r] = stat[rr, 0]
            for l in T.vectorized(L):
                lsum[r, l] = lsum[r, l] * stat[rr, 2]
            for jb in range(BT // L):
                for l in T.vectorized(L):
                    sc[r, jb * L + l] = exp(sc[r, jb * L + l] - stat[rr, 1])
                    lsum[r, l] = lsum[r, l] + sc[r, jb * L + l]
        # o = rescale * o + P·V, CB vectors of each output row at a time
        for cb in range(DV // L // CB):
            for rr in T.unroll(nb):
                for w in T.unroll(CB):
                    for l in T.vectorized(L):
                        ob[rr, w, l] = o[r0 + rr, (cb * CB + w) * L + l] * stat[rr, 2]
            for jj in range(BT):
                for w in T.unroll(CB):
                    for rr in T.unroll(nb):
                        for l in T.vectorized(L):
                            ob[rr, w, l] = ob[rr, w, l] + sc[r0 + rr, jj] * spec.kv_at(
                                v, b, j0 + jj, hk, (cb * CB + w) * L + l)
            for rr in T.unroll(nb):
                for w in T.unroll(CB):
                    for l in T.vectorized(L):
                        o[r0 + rr, (cb * CB + w) * L + l] = ob[rr, w, l]

    @T.macro
    def task(q, k, v, bias, wm, wl, wo, b, hk, c):
        """Rows of (b, hk) over keys [c * KC, (c + 1) * KC): their running max, sum and output into wm / wl / wo."""
        qf = T.alloc_buffer((R, D), f32)
        sc = T.alloc_buffer((R, BT), f32)
        m = T.alloc_buffer((R,), f32)
        lsum = T.alloc_buffer((R, L), f32)  # lane-wise
        o = T.alloc_buffer((R, DV), f32)
        acc0 = T.alloc_buffer((L // 2, L), f32)  # partial dot products (each < 1 KB: registers)
        acc1 = T.alloc_buffer((L // 2, L), f32)
        tm = T.alloc_buffer((L,), f32)
        stat = T.alloc_buffer((2, 3), f32)  # per row of a block: new max, exponents' base, rescale
        ob = T.alloc_buffer((2, CB, L), f32)
        for r, d in T.grid(R, D):
            qf[r, d] = T.Cast(f32, q[b, r % sq, hk * G + r // sq, d]) * T.float32(spec.scale)
        for r in range(R):
            m[r] = neg_inf
            for l in T.vectorized(L):
                lsum[r, l] = T.float32(0)
            for d in T.vectorized(DV):
                o[r, d] = T.float32(0)
        end = T.meta_var(T.min((c + 1) * KC, kv_end))
        for t in range((T.min(KC, end - c * KC) + BT - 1) // BT):
            j0 = T.meta_var(c * KC + t * BT)
            for p in range(R // 2):
                rows(q, k, v, bias, qf, sc, m, lsum, o, acc0, acc1, tm, stat, ob, b, hk, j0, p * 2, 2)
            if R % 2 == 1:
                rows(q, k, v, bias, qf, sc, m, lsum, o, acc0, acc1, tm, stat, ob, b, hk, j0, R - 1, 1)
        w = T.meta_var((b * HKV + hk) * nc + c)
        for r in range(R):
            wm[w, r] = m[r]
            wl[w, r] = _reduce(lsum[r, T.Ramp(0, 1, L)], lambda x, y: x + y, L)
            for d in T.vectorized(DV):
                wo[w, r, d] = o[r, d]

    @T.macro
    def merge(wm, wl, wo, out, b, hk, r):
        """Row r of (b, hk) from its chunks: rescaled to the largest max, summed, divided (0/0 = NaN: fully masked)."""
        mx = T.alloc_buffer((2,), f32)  # max, base
        total = T.alloc_buffer((1,), f32)
        acc = T.alloc_buffer((DV,), f32)
        w0 = T.meta_var((b * HKV + hk) * nc)
        mx[0] = neg_inf
        for c in range(nc):
            mx[0] = T.max(mx[0], wm[w0 + c, r])
        mx[1] = T.if_then_else(mx[0] == neg_inf, T.float32(0), mx[0])
        total[0] = T.float32(0)
        for d in T.vectorized(DV):
            acc[d] = T.float32(0)
        for c in range(nc):
            total[0] = total[0] + wl[w0 + c, r] * exp(wm[w0 + c, r] - mx[1])
            for d in T.vectorized(DV):
                acc[d] = acc[d] + wo[w0 + c, r, d] * exp(wm[w0 + c, r] - mx[1])
        for d in T.vectorized(DV):
            out[b, r % sq, hk * G + r // sq, d] = T.Cast(dtype, acc[d] / total[0])

    @T.macro
    def body(q, k, v, bias, out):
        wm = T.alloc_buffer((batch * HKV * nc, R), f32)
        wl = T.alloc_buffer((batch * HKV * nc, R), f32)
        wo = T.alloc_buffer((batch * HKV * nc, R, DV), f32)
        for t in T.parallel(batch * HKV * nc):
            task(q, k, v, bias, wm, wl, wo, t // (HKV * nc), t // nc % HKV, t % nc)
        for t in T.parallel(batch * HKV * R):
            merge(wm, wl, wo, out, t // (HKV * R), t // R % HKV, t % R)

    return body
