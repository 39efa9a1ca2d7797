"""Fused attention on CUDA where each key/value head has few query rows (decoding with a KV cache: one query row per
head, or a few; grouped heads share K and V): flash-decoding.

The prefill kernels (``attention_cuda``) hold 64-row query tiles, one CTA per (batch, head) and tile: for one row
that is a handful of CTAs each streaming a whole K/V head, with 63 of 64 rows padding. Decoding is a read of K and V
at memory speed, so here (``Chunks``) a CTA takes one (batch, key/value head) and a chunk of keys, with every query row
of the group (``group x seq_q`` rows, so K and V are read once for all of them); there are enough chunks to fill the GPU
``WAVES`` times. Each part of the CTA keeps an online softmax (in base 2, the scale folded in; with a bias, natural
units) of its keys; the parts merge through shared memory at the end, and the chunks' (max, sum, output) go to a
workspace that a second kernel merges per row (flash-decoding's combine; a single chunk writes the output directly).

On CUDA cores (``simt_body``; any dtype, key rows in 16-byte loads over a power of two of lanes):

* its lanes split into groups of ``LPK`` lanes per key row, each lane taking 16 bytes of the row: a warp's copy
  covers whole consecutive rows; each group takes ``U`` keys per step;
* each thread streams its own 16-byte pieces of K and V through a ring of ``STAGES`` steps in shared memory with
  ``cp.async`` (steps t+1 .. t+STAGES-1 in flight while step t is computed) and reads back only what it copied
  itself, so the ring needs no barrier;
* a score is the group's lanes' partial dot products summed by shuffles; each group keeps its slice of the output
  rows in registers. With R rows every K and V element costs R FMAs each way: at 4 rows x 4 heads per K/V head the
  kernel is issue-bound (ncu: IPC 2.85, warps eligible but not selected).

On tensor cores (``tc_body``, where ``on_tensor_cores``: fp16 / bf16, head dims 16..128 in steps of 16, sm_80 on,
and more than ``SIMT_ROWS`` rows per key/value head or key rows the SIMT form cannot split; with a query length known
here, up to ``TC_MAX_SEQ_Q`` query rows per head):

* the CTA's rows (up to 16) are one 16-row mma tile; each of its ``TC_WARPS`` warps streams its own ``BN`` keys per
  step (``TC_STEP_BYTES`` of K and of V) through its own ``TC_STAGES``-step cp.async ring (a ``__syncwarp`` per step,
  no CTA barrier);
* S = Q·Kᵀ on ``mma.sync.m16n8k16`` with Q's A fragments in registers (loaded once) and K's B fragments by
  ``ldmatrix``; the online softmax on the accumulators (a row's 4 lanes reduce by shuffles); O += P·V with P straight
  from the S registers (FA2's layout trick) and V by ``ldmatrix.trans``: two mma per 16 keys x 8 columns whatever the
  row count, where the SIMT form spends R FMAs per element.
"""

from __future__ import annotations

import tvm
from tvm.script import tirx as T

from .attention import causal_offset, kernel_signature, static
from .common import LOG2E, TC_DTYPES, ex2, mma_ops, row_copier, sm_count, sm_version, warp_shuffle_xor

# query rows per head up to which this kernel runs (the prefill kernels take more): the SIMT form, and either form at a
# query length known only at run time (its grid and workspace are sized for the most rows)
MAX_SEQ_Q = 4
# ... the tensor-core form at a static query length: one m16 tile of a plain head's rows (speculative decoding's
# draft tokens). H200, fp16 (benchmarks/results/rerun/attention-decode-forms/): 3.1x the prefill kernel at 8 rows x 4
# heads per K/V head (batch 8 x 4096 keys), 1.6x at 16 rows of plain heads
TC_MAX_SEQ_Q = 16
# rows per key/value head up to which the SIMT form runs where both apply. Same runs: at 4 rows (4 grouped heads x 1
# query row) and at 1, SIMT 1.02-1.08x the tensor-core form; at 16 rows the tensor-core form 2.5x SIMT
SIMT_ROWS = 4
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
TC_WARPS = 4  # warps per CTA of the tensor-core form, each streaming its own keys
TC_STAGES = 3  # steps in each warp's cp.async ring
TC_STEP_BYTES = 4096  # bytes of K (and as many of V) per warp step


def layout(spec) -> tuple[int, int, int] | None:
    """(elements per 16-byte load, lanes per key row, loads per lane per row), or None if a row does not split so."""
    vec = 128 // tvm.DataType(spec.dtype).bits
    if spec.head_dim != spec.head_dim_v or spec.head_dim % vec:
        return None
    loads = spec.head_dim // vec
    lpk = min(32, loads)
    return (vec, lpk, loads // lpk) if 32 % lpk == 0 and loads % lpk == 0 else None


def group_rows(spec) -> int:
    """Query rows per key/value head (``group x seq_q``; the most possible if ``seq_q`` is symbolic)."""
    return spec.group * (spec.seq_q if isinstance(spec.seq_q, int) else MAX_SEQ_Q)


def tensor_cores(spec, target: tvm.target.Target) -> bool:
    """Whether the tensor-core form applies: fp16 / bf16, head dims in whole k-steps of 16 up to 128 (the output's
    fragments in 64 registers per lane), sm_80 or later (mma.sync)."""
    D = spec.head_dim
    return spec.dtype in TC_DTYPES and D == spec.head_dim_v and D % 16 == 0 and D <= 128 and sm_version(target) >= 80


def block_rows(spec) -> int:
    """Query rows per CTA: every row of a key/value head's group (``group x seq_q``, the most possible if ``seq_q``
    is symbolic), up to what the lanes' registers hold; more rows take more CTAs, each reading K and V again."""
    vec, _, nvl = layout(spec)
    most = max(1, LANE_FLOATS // (nvl * vec))
    return min(most, group_rows(spec))


def simt_fits(spec) -> bool:
    """Whether the SIMT form takes ``spec``'s key rows: 16-byte loads over a power of two of lanes, each lane's slice
    of a row's output in ``LANE_FLOATS`` registers."""
    shape = layout(spec)
    return shape is not None and shape[0] * shape[2] <= LANE_FLOATS


def max_seq_q(spec, target: tvm.target.Target) -> int:
    """Query rows per head up to which the decode kernel runs: ``TC_MAX_SEQ_Q`` at a static query length on tensor
    cores, else ``MAX_SEQ_Q``."""
    return TC_MAX_SEQ_Q if isinstance(spec.seq_q, int) and tensor_cores(spec, target) else MAX_SEQ_Q


def fits(spec, target: tvm.target.Target) -> bool:
    """Few query rows per head (``max_seq_q``, or a count known only at run time) in a form that takes the key rows."""
    few = not isinstance(spec.seq_q, int) or spec.seq_q <= max_seq_q(spec, target)
    return few and (simt_fits(spec) or tensor_cores(spec, target))


def on_tensor_cores(spec, target: tvm.target.Target) -> bool:
    """Whether the decode kernel for ``spec`` (``fits``) takes the tensor-core form: where it applies and there are
    more than ``SIMT_ROWS`` rows per key/value head (SIMT spends an FMA per row on every element of K and V), or the
    SIMT form cannot split the key rows."""
    return tensor_cores(spec, target) and (group_rows(spec) > SIMT_ROWS or not simt_fits(spec))


def kernel(spec, target: tvm.target.Target) -> tvm.tirx.PrimFunc:
    """The decode kernel for ``spec`` (``fits``)."""
    return kernel_signature(spec, body(spec, target))


def body(spec, target: tvm.target.Target):
    """The decode kernel's body, a TVMScript macro ``(q, k, v, bias, out)``, in the form ``on_tensor_cores`` picks."""
    return tc_body(spec) if on_tensor_cores(spec, target) else simt_body(spec)


class Chunks:
    """How a decode kernel divides its work, and the code its two forms share around their main loops.

    A CTA of ``nt`` threads takes ``r`` rows of a key/value head's group (a row block) and a chunk of keys, ``ks``
    keys per step; partial softmaxes merge first across the CTA (``finish``, from shared memory), then across chunks
    (the second kernel of ``launch``)."""

    def __init__(self, spec, r: int, ks: int, nt: int):
        G, sq, skv = spec.group, spec.seq_q, spec.seq_kv
        self.spec, self.R, self.KS, self.NT = spec, r, ks, nt
        self.rows = G * sq  # rows of a key/value head
        self.RG = group_rows(spec)  # ... at most (a static count: grid and workspace)
        self.NRB = (self.RG + r - 1) // r  # row blocks per key/value head
        causal = spec.causal != "none"
        offset = causal_offset(sq, skv, spec.causal)
        kv_end = static(T.min(skv, sq + offset)) if causal else skv  # the keys some row sees
        self.steps = (kv_end + ks - 1) // ks
        ctas = WAVES * sm_count()
        # steps per chunk
        self.per_cta = static(T.max(1, (self.steps * spec.batch * spec.kv_heads * self.NRB + ctas - 1) // ctas))
        self.nc = (self.steps + self.per_cta - 1) // self.per_cta  # chunks per (batch, key/value head, row block)
        self.split = not isinstance(self.nc, int) or self.nc > 1
        # scores in base 2 (the scale and log2(e) folded in); with a bias, in natural units, each exponent's argument
        # then multiplied by log2(e): a float32 bias of -FLT_MAX (a mask, as exported) times log2(e) would be -inf,
        # and a row masked so everywhere would give NaN where the unfused graph gives the mean of V
        self.unit = 1.0 if spec.bias_shape is not None else LOG2E

    def exp(self, x):
        """e to the power of a difference of scores (in their units)."""
        return ex2(x * T.float32(LOG2E)) if self.spec.bias_shape is not None else ex2(x)

    @staticmethod
    def below(x, n):
        """x < n, in Python (which widens an int32 index to a symbolic length's int64; the parser does not)."""
        return x < n

    def gr(self, rb, r):
        """Row r of row block rb in its group (clamped: rows past the group's are computed, not stored)."""
        return T.min(rb * self.R + r, self.rows - 1)

    def q_index(self, b, hk, rb, r, col):
        """Q's index of column ``col`` of row r of row block rb: query row (group row % seq_q) of head (// seq_q)."""
        row = self.gr(rb, r)
        return b, row % self.spec.seq_q, hk * self.spec.group + row // self.spec.seq_q, col

    def n_steps(self, c, rb):
        """Steps of chunk c (none in a row block past a symbolic seq_q's rows)."""
        return T.if_then_else(self.below(rb * self.R, self.rows), T.min(self.per_cta, self.steps - c * self.per_cta), 0)

    def merged(self):
        """Macro ``merged(acc, n, m_at, l_at, o_at)``: acc <- (max, its exponents' base, sum, output) of n partial
        softmaxes, partial i's max, sum and output ``m_at(i)``, ``l_at(i)``, ``o_at(i)``: each rescaled to the largest
        max (the CTA's parts; the chunks)."""
        neg_inf, exp = T.float32("-inf"), self.exp

        @T.macro
        def merged(acc, n, m_at, l_at, o_at):
            acc[0] = neg_inf
            for i in range(n):
                acc[0] = T.max(acc[0], m_at(i))
            acc[1] = T.if_then_else(acc[0] == neg_inf, T.float32(0), acc[0])
            acc[2] = T.float32(0)
            acc[3] = T.float32(0)
            for i in range(n):
                acc[2] = acc[2] + l_at(i) * exp(m_at(i) - acc[1])
                acc[3] = acc[3] + o_at(i) * exp(m_at(i) - acc[1])

        return merged

    def finish(self):
        """Macro ``finish(red, ro, parts, acc, out, wm, wl, wo, c, hk, rb, b, tx)``: the CTA's ``parts`` partial
        softmaxes of its rows (max and sum ``red[part, r, :]``, output ``ro[part, r, :]`` in shared memory) merged per
        row and column by its threads, into the workspace (chunks to merge) or the output."""
        spec, R, NT, D, dtype, merged = self.spec, self.R, self.NT, self.spec.head_dim, self.spec.dtype, self.merged()
        HKV, RG, nc, split, below, q_index = spec.kv_heads, self.RG, self.nc, self.split, self.below, self.q_index
        rows = self.rows

        @T.macro
        def finish(red, ro, parts, acc, out, wm, wl, wo, c, hk, rb, b, tx):
            for i in T.unroll((R * D + NT - 1) // NT):
                r, d = T.meta_var((i * NT + tx) // D), T.meta_var((i * NT + tx) % D)
                if i * NT + tx < R * D and below(rb * R + r, rows):
                    merged(acc, parts, lambda p: red[p, r, 0], lambda p: red[p, r, 1], lambda p: ro[p, r, d])
                    if split:
                        w = T.meta_var(((b * HKV + hk) * nc + c) * RG + rb * R + r)
                        wo[w, d] = acc[3]
                        if d == 0:
                            wm[w] = acc[0]
                            wl[w] = acc[2]
                    else:
                        out[q_index(b, hk, rb, r, d)] = T.Cast(dtype, acc[3] / acc[2])

        return finish

    def combine(self):
        """Macro ``combine(wm, wl, wo, out, r, hk, b, d, acc)``: row r of (b, hk)'s group, column d, from its chunks'
        workspace entries (0 / 0 = NaN: a fully masked row, as the unfused graph)."""
        spec, merged, dtype, RG, nc = self.spec, self.merged(), self.spec.dtype, self.RG, self.nc
        HKV, G, sq = spec.kv_heads, spec.group, spec.seq_q

        @T.macro
        def combine(wm, wl, wo, out, r, hk, b, d, acc):
            w0 = T.meta_var((b * HKV + hk) * nc * RG + r)
            merged(acc, nc, lambda c: wm[w0 + c * RG], lambda c: wl[w0 + c * RG], lambda c: wo[w0 + c * RG, d])
            out[b, r % sq, hk * G + r // sq, d] = T.Cast(dtype, acc[3] / acc[2])

        return combine

    def launch(self, cta, name: str):
        """The kernel's body: ``cta(q, k, v, bias, out, wm, wl, wo, c, hk, rb, b, tx)`` over the grid of (chunk,
        key/value head x row block, batch), block ``name``, then the chunks' merge where there are several."""
        spec, D, combine = self.spec, self.spec.head_dim, self.combine()
        HKV, batch = spec.kv_heads, spec.batch
        RG, NRB, nc, NT = self.RG, self.NRB, self.nc, self.NT
        f32, below, rows = "float32", self.below, self.rows

        @T.macro
        def body(q, k, v, bias, out):
            wm = T.alloc_buffer((batch * HKV * nc * RG,), f32)
            wl = T.alloc_buffer((batch * HKV * nc * RG,), f32)
            wo = T.alloc_buffer((batch * HKV * nc * RG, D), f32)
            for c in T.thread_binding(nc, thread="blockIdx.x"):
                for y in T.thread_binding(HKV * NRB, thread="blockIdx.y"):
                    for b in T.thread_binding(batch, thread="blockIdx.z"):
                        for tx in T.thread_binding(NT, thread="threadIdx.x"):
                            with T.sblock(name):
                                T.reads()
                                T.writes()
                                cta(q, k, v, bias, out, wm, wl, wo, c, y // NRB, y % NRB, b, tx)
            if self.split:
                for r in T.thread_binding(RG, thread="blockIdx.x"):
                    for hk in T.thread_binding(HKV, thread="blockIdx.y"):
                        for b in T.thread_binding(batch, thread="blockIdx.z"):
                            for d in T.thread_binding(D, thread="threadIdx.x"):
                                with T.sblock("attention_decode_combine"):
                                    T.reads()
                                    T.writes()
                                    if below(r, rows):
                                        acc = T.alloc_buffer((4,), f32, scope="local")
                                        combine(wm, wl, wo, out, r, hk, b, d, acc)

        return body


def simt_body(spec):
    """The decode kernel on CUDA cores (the module docstring's first form)."""
    D, dtype = spec.head_dim, spec.dtype
    has_bias = spec.bias_shape is not None
    VEC, LPK, NVL = layout(spec)
    R = block_rows(spec)  # rows of a CTA: row r of block rb is row rb * R + r of the group, query row % sq of head // sq
    U = max(1, min(LOADS // NVL, SCORES // R))  # keys per lane group per step
    NG = NT // LPK  # lane groups per CTA
    ch = Chunks(spec, R, NG * U, NT)
    KS, per_cta, gr, exp, finish = ch.KS, ch.per_cta, ch.gr, ch.exp, ch.finish()
    f32, neg_inf, skv = "float32", T.float32("-inf"), spec.seq_kv

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
                        spec.kv_element(b, key_of(c, i, u, tx // LPK), hk, col(tx % LPK, nv, 0))), 16, T.uint32(16))
                    T.ptx["cp.async.cg.shared.global"](vs.ptr_to([i % STAGES, u, nv, tx, 0]), v.ptr_to(
                        spec.kv_element(b, key_of(c, i, u, tx // LPK), hk, col(tx % LPK, nv, 0))), 16, T.uint32(16))
        T.ptx.cp.async_.commit_group()

    @T.macro
    def cta(q, k, v, bias, out, wm, wl, wo, c, hk, rb, b, tx):
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
        lane, g = T.meta_var(tx % LPK), T.meta_var(tx // LPK)

        for r in T.unroll(R):
            for nv in T.unroll(NVL):
                for e in T.unroll(VEC):
                    qr[r, nv, e] = T.Cast(f32, q[ch.q_index(b, hk, rb, r, col(lane, nv, e))]) * T.float32(
                        spec.scale * ch.unit)
                    o[r, nv, e] = T.float32(0)
            st[r, 0] = neg_inf
            st[r, 1] = T.float32(0)
        n = T.meta_var(ch.n_steps(c, rb))
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
                        s[u, r] = s[u, r] + spec.bias_at(bias, b, hk * spec.group + gr(rb, r) // spec.seq_q,
                                                         gr(rb, r) % spec.seq_q, key)
                    s[u, r] = T.if_then_else(spec.visible(gr(rb, r) % spec.seq_q, key), s[u, r], neg_inf)
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
        finish(red, ro, NG, mx, out, wm, wl, wo, c, hk, rb, b, tx)

    return ch.launch(cta, "attention_decode")


def tc_body(spec):
    """The decode kernel on tensor cores (the module docstring's second form)."""
    D, dtype, sq = spec.head_dim, spec.dtype, spec.seq_q
    has_bias = spec.bias_shape is not None
    NW = TC_WARPS
    BN = min(64, max(16, TC_STEP_BYTES // (2 * D) // 16 * 16))  # keys per warp step
    ch = Chunks(spec, min(16, group_rows(spec)), NW * BN, 32 * NW)
    R, KS, per_cta, gr, exp, finish = ch.R, ch.KS, ch.per_cta, ch.gr, ch.exp, ch.finish()
    DP = D + 8  # a K/V row in shared memory, padded by 16 bytes: ldmatrix free of bank conflicts
    TILE = BN * DP  # elements of a warp's step of K (or V)
    KD, NS, ND = D // 16, BN // 8, D // 8  # k-steps of Q·Kᵀ, n-tiles of S, n-tiles of O
    load_rows = row_copier(D // 8, lambda base, r, col, rows: base + r * DP + col, index=spec.kv_element)
    ldmatrix, mma = mma_ops(dtype)
    f32, neg_inf, skv = "float32", T.float32("-inf"), spec.seq_kv

    def logit(score, bias, b, hk, row, key):  # in the scores' units
        x = score * T.float32(spec.scale * ch.unit)
        return x + spec.bias_at(bias, b, hk * spec.group + row // sq, row % sq, key) if has_bias else x

    def first_key(c, i, w):  # of warp w's step i in chunk c (in Python: the parser does not widen int32 to int64)
        return (c * per_cta + i) * KS + w * BN

    def slot(w, i, kv):  # offset of warp w's ring slot for step i, K (kv = 0) or V (1)
        return ((w * TC_STAGES + i % TC_STAGES) * 2 + kv) * TILE

    @T.macro
    def issue(smem, k, v, b, hk, c, w, i, n, lane):
        """Warp w's step i (< n) of chunk c: its BN keys of K and V (zero past the end) into its ring slot, one commit
        group (empty past the chunk's end, so that the groups count steps)."""
        if ch.below(i, n):
            load_rows(smem, slot(w, i, 0), k, b, first_key(c, i, w), skv, hk, BN, lane, 32)
            load_rows(smem, slot(w, i, 1), v, b, first_key(c, i, w), skv, hk, BN, lane, 32)
        T.ptx.cp.async_.commit_group()

    @T.macro
    def cta(q, k, v, bias, out, wm, wl, wo, c, hk, rb, b, tx):
        smem = T.alloc_buffer((NW * TC_STAGES * 2 * TILE,), dtype, scope="shared.dyn")  # each warp's ring
        red = T.alloc_buffer((NW, R, 2), f32, scope="shared.dyn")
        ro = T.alloc_buffer((NW, R, D), f32, scope="shared.dyn")
        qf = T.alloc_buffer((KD * 8,), dtype, scope="local")
        kf = T.alloc_buffer((8,), dtype, scope="local")
        vf = T.alloc_buffer((8,), dtype, scope="local")
        sacc = T.alloc_buffer((NS * 4,), f32, scope="local")
        pf = T.alloc_buffer((NS * 4,), dtype, scope="local")
        oacc = T.alloc_buffer((ND * 4,), f32, scope="local")
        st = T.alloc_buffer((2, 2), f32, scope="local")  # rows g, g + 8: running max, sum (of this lane's columns)
        mx = T.alloc_buffer((4,), f32, scope="local")  # a row's new max, exponents' base, rescale; merged sum, output
        w, lane = T.meta_var(tx // 32), T.meta_var(tx % 32)
        g, t4 = T.meta_var(lane // 4), T.meta_var(lane % 4)

        # Q's A fragments, from memory once: half e of register j of k-step kk is row g + j % 2 * 8, column
        # kk * 16 + j // 2 * 8 + 2 * t4 + e
        for kk in T.unroll(KD):
            for j in T.unroll(4):
                for e in T.unroll(2):
                    qf[kk * 8 + j * 2 + e] = q[ch.q_index(b, hk, rb, g + j % 2 * 8, kk * 16 + j // 2 * 8 + t4 * 2 + e)]
        for i in T.unroll(ND * 4):
            oacc[i] = T.float32(0)
        for r in T.unroll(2):
            st[r, 0] = neg_inf
            st[r, 1] = T.float32(0)
        n = T.meta_var(ch.n_steps(c, rb))
        for i in T.unroll(TC_STAGES - 1):
            issue(smem, k, v, b, hk, c, w, i, n, lane)
        for t in range(n):
            # step t in (all but the newest TC_STAGES - 2 groups done), for every lane of the warp; every lane done
            # with step t - 1, whose slot the next issue refills
            T.ptx.cp.async_.wait_group(TC_STAGES - 2)
            T.evaluate(T.call_extern("void", "__syncwarp"))
            issue(smem, k, v, b, hk, c, w, t + TC_STAGES - 1, n, lane)
            k0 = T.meta_var(first_key(c, t, w))
            # S = Q Kᵀ; K's B fragments: keys n2 * 16 + lane / 16 * 8 + lane % 8, columns kk * 16 + lane / 8 % 2 * 8
            for i in T.unroll(NS * 4):
                sacc[i] = T.float32(0)
            for kk in T.unroll(KD):
                for n2 in T.unroll(NS // 2):
                    ldmatrix(False, kf, 0, smem,
                             slot(w, t, 0) + (n2 * 16 + lane // 16 * 8 + lane % 8) * DP + kk * 16 + lane // 8 % 2 * 8)
                    mma(qf, kk * 8, kf, 0, sacc, n2 * 8)
                    mma(qf, kk * 8, kf, 4, sacc, n2 * 8 + 4)
            # logits in the scores' units (sacc[nn * 4 + e]: row g + e // 2 * 8, key k0 + nn * 8 + 2 * t4 + e % 2)
            for nn in T.unroll(NS):
                for e in T.unroll(4):
                    row, key = T.meta_var(gr(rb, g + e // 2 * 8)), T.meta_var(k0 + nn * 8 + t4 * 2 + e % 2)
                    sacc[nn * 4 + e] = T.if_then_else(spec.visible(row % sq, key),
                                                      logit(sacc[nn * 4 + e], bias, b, hk, row, key), neg_inf)
            # online softmax per row (4 lanes of a quad share one), the output rescaled only when the row's max moves
            for r in T.unroll(2):
                mx[0] = st[r, 0]
                for nn in T.unroll(NS):
                    for e in T.unroll(2):
                        mx[0] = T.max(mx[0], sacc[nn * 4 + r * 2 + e])
                mx[0] = T.max(mx[0], warp_shuffle_xor(mx[0], 1))
                mx[0] = T.max(mx[0], warp_shuffle_xor(mx[0], 2))
                mx[1] = T.if_then_else(mx[0] == neg_inf, T.float32(0), mx[0])  # all masked so far: p = 0
                if mx[0] > st[r, 0]:
                    mx[2] = exp(st[r, 0] - mx[1])
                    st[r, 0] = mx[0]
                    st[r, 1] = st[r, 1] * mx[2]
                    for d in T.unroll(ND):
                        for e in T.unroll(2):
                            oacc[d * 4 + r * 2 + e] = oacc[d * 4 + r * 2 + e] * mx[2]
                for nn in T.unroll(NS):
                    for e in T.unroll(2):
                        sacc[nn * 4 + r * 2 + e] = exp(sacc[nn * 4 + r * 2 + e] - mx[1])
                        st[r, 1] = st[r, 1] + sacc[nn * 4 + r * 2 + e]
            # O += P V: P's A fragment for k-step pk is S's n-tiles 2 pk, 2 pk + 1 as they lie in registers; V's B
            # fragments (transposed): keys pk * 16 + lane / 8 % 2 * 8 + lane % 8, columns d2 * 16 + lane / 16 * 8
            for i in T.unroll(NS * 4):
                pf[i] = T.Cast(dtype, sacc[i])
            for pk in T.unroll(BN // 16):
                for d2 in T.unroll(D // 16):
                    ldmatrix(True, vf, 0, smem,
                             slot(w, t, 1) + (pk * 16 + lane // 8 % 2 * 8 + lane % 8) * DP + d2 * 16 + lane // 16 * 8)
                    mma(pf, pk * 8, vf, 0, oacc, d2 * 8)
                    mma(pf, pk * 8, vf, 4, oacc, d2 * 8 + 4)
        for r in T.unroll(2):  # the row's sum: its quad's
            st[r, 1] = st[r, 1] + warp_shuffle_xor(st[r, 1], 1)
            st[r, 1] = st[r, 1] + warp_shuffle_xor(st[r, 1], 2)
        # the warps merged per row (``ro`` and ``red`` may reuse the rings' shared memory: all warps done with it)
        T.tvm_storage_sync("shared.dyn")
        for r in T.unroll(2):
            if g + r * 8 < R:
                if t4 == 0:
                    red[w, g + r * 8, 0] = st[r, 0]
                    red[w, g + r * 8, 1] = st[r, 1]
                for d in T.unroll(ND):
                    for e in T.unroll(2):
                        ro[w, g + r * 8, d * 8 + t4 * 2 + e] = oacc[d * 4 + r * 2 + e]
        T.tvm_storage_sync("shared.dyn")
        finish(red, ro, NW, mx, out, wm, wl, wo, c, hk, rb, b, tx)

    return ch.launch(cta, "attention_decode_tc")
