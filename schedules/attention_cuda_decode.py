"""Fused attention on CUDA where each key/value head has few query rows (decoding with a KV cache: one query row per
head, or a few; grouped heads share K and V): flash-decoding on CUDA cores.

The prefill kernels (``attention_cuda``) hold 64-row query tiles, one CTA per (batch, head) and tile: for one row
that is a handful of CTAs each streaming a whole K/V head, with 63 of 64 rows padding. Decoding is a read of K and V
at memory speed, so here:

* a CTA takes one (batch, key/value head) and a chunk of keys, with every query row of the group (``group x
  seq_q`` rows, so K and V are read once for all of them); there are enough chunks to fill the GPU ``WAVES`` times;
* its lanes split into groups of ``LPK`` lanes per key row, each lane taking 16 bytes of the row: a warp's copy
  covers whole consecutive rows; each group takes ``U`` keys per step;
* each thread streams its own 16-byte pieces of K and V through a ring of ``STAGES`` steps in shared memory with
  ``cp.async`` (steps t+1 .. t+STAGES-1 in flight while step t is computed) and reads back only what it copied
  itself, so the ring needs no barrier;
* a score is the group's lanes' partial dot products summed by shuffles; each group keeps an online softmax (in
  base 2, the scale folded into Q; with a bias, natural units) and its slice of the output rows in registers; the CTA's groups merge through
  shared memory at the end;
* the chunks' (max, sum, output) go to a workspace, and a second kernel merges them per row (flash-decoding's
  combine). A single chunk writes the output directly.
"""

from __future__ import annotations

import tvm
from tvm.script import tirx as T

from .attention import causal_offset, kernel_signature, static
from .common import LOG2E, ex2, sm_count, warp_shuffle_xor

MAX_SEQ_Q = 4  # query rows per head up to which this kernel runs (prefill takes more, on tensor cores)
NT = 128  # threads per CTA
LANE_FLOATS = 64  # registers per lane for its slice of the CTA's output rows
SCORES = 32  # registers per lane for a step's scores (keys x rows)
# H200, fp16, 5 shapes, two runs (benchmarks/results/rerun/attention-decode-variants/): 4 loads of 16 bytes per lane per
# step, a ring of 3 steps (2 in flight): 1.25x the same loads straight into registers with 4 query rows per head,
# level with 1; 8 loads (more registers), 2 loads in a ring of 4 or 6, 256 threads, and fewer registers by launch
# bounds (spills) were level or slower. Chunks for 2 CTAs per SM: 1.02-1.24x 4 on 4 of 5 shapes, 0.93x with 4 rows.
LOADS = 4  # 16-byte loads of K (and as many of V) per lane per step
STAGES = 3  # steps in each thread's cp.async ring
WAVES = 2  # chunks aimed for: this many CTAs per SM in all


def layout(spec) -> tuple[int, int, int] | None:
    """(elements per 16-byte load, lanes per key row, loads per lane per row), or None if a row does not split so."""
    vec = 128 // tvm.DataType(spec.dtype).bits
    if spec.head_dim != spec.head_dim_v or spec.head_dim % vec:
        return None
    loads = spec.head_dim // vec
    lpk = min(32, loads)
    return (vec, lpk, loads // lpk) if 32 % lpk == 0 and loads % lpk == 0 else None


def block_rows(spec) -> int:
    """Query rows per CTA: every row of a key/value head's group (``group x seq_q``, the most possible if ``seq_q``
    is symbolic), up to what the lanes' registers hold; more rows take more CTAs, each reading K and V again."""
    vec, _, nvl = layout(spec)
    most = max(1, LANE_FLOATS // (nvl * vec))
    return min(most, spec.group * (spec.seq_q if isinstance(spec.seq_q, int) else MAX_SEQ_Q))


def fits(spec) -> bool:
    """Few query rows per head (or a count known only at run time) and key rows that split into 16-byte loads."""
    few = not isinstance(spec.seq_q, int) or spec.seq_q <= MAX_SEQ_Q
    shape = layout(spec)
    return few and shape is not None and shape[0] * shape[2] <= LANE_FLOATS


def kernel(spec) -> tvm.tirx.PrimFunc:
    """The decode kernel for ``spec`` (``fits``)."""
    return kernel_signature(spec, body(spec))


def body(spec):
    """The decode kernel's body: a TVMScript macro ``(q, k, v, bias, out)``."""
    HKV, G, D, dtype = spec.kv_heads, spec.group, spec.head_dim, spec.dtype
    batch, sq, skv = spec.batch, spec.seq_q, spec.seq_kv
    has_bias, causal = spec.bias_shape is not None, spec.causal != "none"
    VEC, LPK, NVL = layout(spec)
    R = block_rows(spec)  # rows of a CTA: row r of block rb is row rb * R + r of the group, query row % sq of head // sq
    rows = G * sq  # rows of a key/value head
    RG = G * (sq if isinstance(sq, int) else MAX_SEQ_Q)  # ... at most (a static count: grid and workspace)
    NRB = (RG + R - 1) // R  # row blocks per key/value head
    U = max(1, min(LOADS // NVL, SCORES // R))  # keys per lane group per step
    NG = NT // LPK  # lane groups per CTA
    KS = NG * U  # keys per CTA step
    f32, neg_inf = "float32", T.float32("-inf")
    offset = causal_offset(sq, skv, spec.causal)
    kv_end = static(T.min(skv, sq + offset)) if causal else skv  # the keys some row sees
    steps = (kv_end + KS - 1) // KS
    ctas = WAVES * sm_count()
    per_cta = static(T.max(1, (steps * batch * HKV * NRB + ctas - 1) // ctas))  # steps per chunk
    nc = (steps + per_cta - 1) // per_cta  # chunks per (batch, key/value head, row block)
    split = not isinstance(nc, int) or nc > 1

    # scores in base 2 (the scale and log2(e) folded into Q); with a bias, in natural units, each exponent's argument
    # then multiplied by log2(e): a float32 bias of -FLT_MAX (a mask, as exported) times log2(e) would be -inf, and a
    # row masked so everywhere would give NaN where the unfused graph gives the mean of V
    unit = 1.0 if has_bias else LOG2E

    def exp(x):  # e to the power of a difference of scores
        return ex2(x * T.float32(LOG2E)) if has_bias else ex2(x)

    def below(x, n):  # x < n, in Python (which widens an int32 index to a symbolic length's int64; the parser does not)
        return x < n

    def gr(rb, r):  # row r of row block rb in its group (clamped: rows past the group's are computed, not stored)
        return T.min(rb * R + r, rows - 1)

    def col(lane, nv, e):  # the head-dim column of element e of the lane's load nv
        return (nv * LPK + lane) * VEC + e

    def key_of(c, i, u, g):  # key u of lane group g in step i of chunk c (clamped: keys past the end are masked)
        return T.min((c * per_cta + i) * KS + u * NG + g, skv - 1)

    @T.macro
    def issue(ks, vs, k, v, b, hk, c, i, n, tx):
        """Step i (< n) of chunk c: this thread's K and V loads into ring slot i % STAGES, one commit group (empty past
        the chunk's end, so that the groups count steps)."""
        if i < n:
            for u in T.unroll(U):
                for nv in T.unroll(NVL):
                    T.ptx["cp.async.cg.shared.global"](ks.ptr_to([i % STAGES, u, nv, tx, 0]), k.ptr_to(
                        [b, key_of(c, i, u, tx // LPK), hk, col(tx % LPK, nv, 0)]), 16, T.uint32(16))
                    T.ptx["cp.async.cg.shared.global"](vs.ptr_to([i % STAGES, u, nv, tx, 0]), v.ptr_to(
                        [b, key_of(c, i, u, tx // LPK), hk, col(tx % LPK, nv, 0)]), 16, T.uint32(16))
        T.ptx.cp.async_.commit_group()

    @T.macro
    def merged(acc, n, m_at, l_at, o_at):
        """acc <- (max, its exponents' base, sum, output) of n partial softmaxes, partial i's max, sum and output
        ``m_at(i)``, ``l_at(i)``, ``o_at(i)``: each rescaled to the largest max (the CTA's lane groups; the chunks)."""
        acc[0] = neg_inf
        for i in range(n):
            acc[0] = T.max(acc[0], m_at(i))
        acc[1] = T.if_then_else(acc[0] == neg_inf, T.float32(0), acc[0])
        acc[2] = T.float32(0)
        acc[3] = T.float32(0)
        for i in range(n):
            acc[2] = acc[2] + l_at(i) * exp(m_at(i) - acc[1])
            acc[3] = acc[3] + o_at(i) * exp(m_at(i) - acc[1])

    @T.macro
    def chunk(q, k, v, bias, out, wm, wl, wo, c, y, b, tx):
        qr = T.alloc_buffer((R, NVL, VEC), f32, scope="local")
        kr = T.alloc_buffer((U, NVL, VEC), dtype, scope="local")
        vr = T.alloc_buffer((U, NVL, VEC), dtype, scope="local")
        s = T.alloc_buffer((U, R), f32, scope="local")
        o = T.alloc_buffer((R, NVL, VEC), f32, scope="local")
        st = T.alloc_buffer((R, 2), f32, scope="local")  # running max (in the scores' units), sum
        mx = T.alloc_buffer((4,), f32, scope="local")  # a row's new max, its exponents' base; a merged sum, output
        red = T.alloc_buffer((NG, R, 2), f32, scope="shared.dyn")
        ro = T.alloc_buffer((NG, R, D), f32, scope="shared.dyn")
        ks = T.alloc_buffer((STAGES, U, NVL, NT, VEC), dtype, scope="shared.dyn")  # the ring
        vs = T.alloc_buffer((STAGES, U, NVL, NT, VEC), dtype, scope="shared.dyn")
        hk, rb = T.meta_var(y // NRB), T.meta_var(y % NRB)
        lane, g = T.meta_var(tx % LPK), T.meta_var(tx // LPK)

        for r in T.unroll(R):
            for nv in T.unroll(NVL):
                for e in T.unroll(VEC):
                    qr[r, nv, e] = T.Cast(f32, q[b, gr(rb, r) % sq, hk * G + gr(rb, r) // sq, col(lane, nv, e)]) * T.float32(
                        spec.scale * unit)
                    o[r, nv, e] = T.float32(0)
            st[r, 0] = neg_inf
            st[r, 1] = T.float32(0)
        # steps of this chunk (none in a row block past a symbolic seq_q's rows)
        n = T.meta_var(T.if_then_else(below(rb * R, rows), T.min(per_cta, steps - c * per_cta), 0))
        for i in T.unroll(STAGES - 1):
            issue(ks, vs, k, v, b, hk, c, i, n, tx)
        for t in range(n):
            k0 = T.meta_var((c * per_cta + t) * KS)
            issue(ks, vs, k, v, b, hk, c, t + STAGES - 1, n, tx)
            T.ptx.cp.async_.wait_group(STAGES - 1)
            for u in T.unroll(U):
                for nv in T.unroll(NVL):
                    kr[u, nv, T.Ramp(0, 1, VEC)] = ks[t % STAGES, u, nv, tx, T.Ramp(0, 1, VEC)]
                    vr[u, nv, T.Ramp(0, 1, VEC)] = vs[t % STAGES, u, nv, tx, T.Ramp(0, 1, VEC)]
            for u in T.unroll(U):
                for r in T.unroll(R):
                    s[u, r] = T.float32(0)
                    for nv in T.unroll(NVL):
                        for e in T.unroll(VEC):
                            s[u, r] = s[u, r] + qr[r, nv, e] * T.Cast(f32, kr[u, nv, e])
                    for lg in T.unroll(LPK.bit_length() - 1):
                        s[u, r] = s[u, r] + warp_shuffle_xor(s[u, r], 1 << lg)
                    key = T.meta_var(k0 + u * NG + g)
                    if has_bias:
                        s[u, r] = s[u, r] + spec.bias_at(bias, b, hk * G + gr(rb, r) // sq, gr(rb, r) % sq, key)
                    s[u, r] = T.if_then_else(spec.visible(gr(rb, r) % sq, key), s[u, r], neg_inf)
            for r in T.unroll(R):
                mx[0] = st[r, 0]
                for u in T.unroll(U):
                    mx[0] = T.max(mx[0], s[u, r])
                mx[1] = T.if_then_else(mx[0] == neg_inf, T.float32(0), mx[0])  # all masked so far: p = 0
                if mx[0] > st[r, 0]:  # the running max moved: rescale (run3 of the variants: +1-4 %, level)
                    mx[2] = exp(st[r, 0] - mx[1])
                    st[r, 0] = mx[0]
                    st[r, 1] = st[r, 1] * mx[2]
                    for nv in T.unroll(NVL):
                        for e in T.unroll(VEC):
                            o[r, nv, e] = o[r, nv, e] * mx[2]
                for u in T.unroll(U):
                    s[u, r] = exp(s[u, r] - mx[1])
                    st[r, 1] = st[r, 1] + s[u, r]
                    for nv in T.unroll(NVL):
                        for e in T.unroll(VEC):
                            o[r, nv, e] = o[r, nv, e] + s[u, r] * T.Cast(f32, vr[u, nv, e])
        # the CTA's lane groups merged per row: rescaled to the largest max and summed (``ro`` and ``red`` may reuse the
        # ring's shared memory: all threads done with it first. Explicit barriers: TVM cannot insert its own into a
        # kernel under the host's branch of ``by_query_rows``)
        T.tvm_storage_sync("shared.dyn")
        for r in T.unroll(R):
            if lane == 0:
                red[g, r, 0] = st[r, 0]
                red[g, r, 1] = st[r, 1]
            for nv in T.unroll(NVL):
                for e in T.unroll(VEC):
                    ro[g, r, col(lane, nv, e)] = o[r, nv, e]
        T.tvm_storage_sync("shared.dyn")
        for i in T.unroll((R * D + NT - 1) // NT):
            r, d = T.meta_var((i * NT + tx) // D), T.meta_var((i * NT + tx) % D)
            if i * NT + tx < R * D and below(rb * R + r, rows):
                merged(mx, NG, lambda gg: red[gg, r, 0], lambda gg: red[gg, r, 1], lambda gg: ro[gg, r, d])
                if split:
                    w = T.meta_var(((b * HKV + hk) * nc + c) * RG + rb * R + r)
                    wo[w, d] = mx[3]
                    if d == 0:
                        wm[w] = mx[0]
                        wl[w] = mx[2]
                else:
                    out[b, gr(rb, r) % sq, hk * G + gr(rb, r) // sq, d] = T.Cast(dtype, mx[3] / mx[2])

    @T.macro
    def combine(wm, wl, wo, out, r, hk, b, d):
        """Row r of (b, hk), column d, from its chunks (0/0 = NaN: a fully masked row, as the unfused graph)."""
        acc = T.alloc_buffer((4,), f32, scope="local")
        w0 = T.meta_var((b * HKV + hk) * nc * RG + r)
        merged(acc, nc, lambda c: wm[w0 + c * RG], lambda c: wl[w0 + c * RG], lambda c: wo[w0 + c * RG, d])
        out[b, r % sq, hk * G + r // sq, d] = T.Cast(dtype, acc[3] / acc[2])

    @T.macro
    def body(q, k, v, bias, out):
        wm = T.alloc_buffer((batch * HKV * nc * RG,), f32)
        wl = T.alloc_buffer((batch * HKV * nc * RG,), f32)
        wo = T.alloc_buffer((batch * HKV * nc * RG, D), f32)
        for c in T.thread_binding(nc, thread="blockIdx.x"):
            for y in T.thread_binding(HKV * NRB, thread="blockIdx.y"):
                for b in T.thread_binding(batch, thread="blockIdx.z"):
                    for tx in T.thread_binding(NT, thread="threadIdx.x"):
                        with T.sblock("attention_decode"):
                            T.reads()
                            T.writes()
                            chunk(q, k, v, bias, out, wm, wl, wo, c, y, b, tx)
        if split:
            for r in T.thread_binding(RG, thread="blockIdx.x"):
                for hk in T.thread_binding(HKV, thread="blockIdx.y"):
                    for b in T.thread_binding(batch, thread="blockIdx.z"):
                        for d in T.thread_binding(D, thread="threadIdx.x"):
                            with T.sblock("attention_decode_combine"):
                                T.reads()
                                T.writes()
                                if below(r, rows):
                                    combine(wm, wl, wo, out, r, hk, b, d)

    return body
