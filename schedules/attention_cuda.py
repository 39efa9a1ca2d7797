"""Fused attention for CUDA: a FlashAttention-2 style tensor-core kernel, and a SIMT fallback.

Why hand-written TVMScript and not schedule primitives: the two GEMMs share register-resident
fragments (the fp32 score accumulators are re-packed in registers as the A operand of P·V, the
FA2 layout trick), which tensorize-based schedules cannot express; TVM's own TIR prefill kernels
(``relax/frontend/nn/llm/_prefill_kernels.py``, the starting point studied for this) run both
GEMMs on CUDA cores through shared memory. So the kernel below is written at the level of PTX
instructions (``mma.sync.m16n8k16``, ``ldmatrix``, ``cp.async``), with the same online-softmax
skeleton as those kernels.

Tensor-core kernel (fp16 / bf16, head_dim == head_dim_v in {32, 64, 96, 128}):

* one CTA = ``BM`` query rows of one (batch, head) (``TileConfig``; by default 4 warps x 32 rows,
  FA2's shape): each warp owns 16-row MMA tiles and re-reads its Q fragments from shared memory
  with ``ldmatrix`` per k-step (or keeps them in registers, ``q_in_regs``);
* K and V stream through shared memory in tiles of ``BN`` keys with ``cp.async`` into a
  ``stages``-deep ring: tiles j+1 .. j+stages-1 are in flight while tile j is computed;
* S = Q·Kᵀ and O += P·V on ``mma.sync.m16n8k16`` with fp32 accumulators; rows are padded by 16
  bytes in shared memory so ``ldmatrix`` and the copies are free of bank conflicts;
* online softmax in registers with ``exp2`` and the scale folded into one FMA, row max/sum reduced
  across the 4 lanes of a quad with shuffles; O is rescaled only when the running max moves;
* causal: key tiles beyond the diagonal are never loaded; the tiles every row sees whole run in a loop
  without mask code, those crossing the diagonal (and the ragged tail) in a second, masked loop, where
  a warp whose rows all end before the tile's first key skips it; the query tiles of all heads are
  launched heaviest first (largest-processing-time order: no long tile starts in the last wave);
  bias / key padding masks are added per score; grouped-query heads read their shared K/V head; rows
  or keys past the sequence end are zero-filled by ``cp.async`` (src-size 0) and masked, so any
  length works;
* optional ping-pong (``pingpong``, FA3's schedule on mma.sync): two warp groups hand the tensor cores
  to each other with named barriers, so one group's softmax runs under the other's GEMM instead of
  all warps reaching their softmax together (they are kept in step by the per-tile CTA barriers);
* the epilogue stages O through shared memory for 16-byte coalesced stores.

Fragment layouts (PTX ISA, mma.m16n8k16; g = lane / 4, t = lane % 4): A regs a0..a3 hold rows
(g, g+8, g, g+8) x cols (2t, 2t, 2t+8, 2t+8); B regs b0, b1 hold k rows 2t, 2t+8 of column g;
C holds (g, 2t..2t+1) and (g+8, 2t..2t+1). Hence the S accumulators of n-tiles 2kk and 2kk+1 are,
in register order, exactly the A fragment of P for k-step kk.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm.script import tirx as T

from .attention import causal_offset, kernel_signature
from .common import LOG2E, SMS, sm_version, warp_shuffle_xor

TC_HEAD_DIMS = (32, 64, 96, 128)
TC_DTYPES = {"float16": "fp16", "bfloat16": "bf16"}


def tensor_cores(dtype: str, head_dim: int, head_dim_v: int, target: tvm.target.Target) -> bool:
    """Whether attention of this type and head dims gets the tensor-core kernel on ``target``."""
    return dtype in TC_DTYPES and head_dim == head_dim_v and head_dim in TC_HEAD_DIMS and sm_version(target) >= 80


def kernel(spec, target: tvm.target.Target) -> tvm.tirx.PrimFunc:
    """The fused kernel for ``spec`` (an ``AttentionSpec``): tensor cores where they apply."""
    if tensor_cores(spec.dtype, spec.head_dim, spec.head_dim_v, target):
        return flash_mma(spec, choose(spec))
    return flash_simt(spec, simt_split(spec))


@dataclass(frozen=True)
class TileConfig:
    """Tensor-core kernel shape: ``warps`` x ``m_tiles`` x 16 query rows per CTA, ``bn`` keys per tile."""

    warps: int = 4
    m_tiles: int = 2  # 16-row MMA tiles per warp: 2 halves the shared-memory reads per MMA
    bn: int = 64  # keys per K/V tile
    stages: int = 2  # K/V tiles in flight (cp.async ring)
    q_in_regs: bool = False  # Q fragments in registers for the whole kernel (one ldmatrix per use otherwise)
    min_blocks: int = 0  # CTAs that must fit on one SM (caps registers per thread; 0: no cap)
    lpt: bool = True  # causal: launch the longest query tiles of all heads first (largest-processing-time order)
    pingpong: bool = False  # two warp groups take turns on the tensor cores: one's GEMM overlaps the other's softmax

    @property
    def name(self) -> str:
        return (f"w{self.warps}m{self.m_tiles}n{self.bn}s{self.stages}{'q' if self.q_in_regs else ''}"
                f"{f'b{self.min_blocks}' if self.min_blocks else ''}{'p' if self.pingpong else ''}{'' if self.lpt else 'x'}")


def choose(spec) -> TileConfig:
    """The tile configuration for ``spec``, from the tile sweep on the H200 (benchmarks/results/attention-h200.json).

    head_dim <= 64 with a causal mask: 128-key tiles (one tile holds a 128-row query tile's diagonal; the
    64-key tiles lost 6-14 % there). Otherwise 64-key tiles: for d64 without mask they need 168 registers, so
    3 CTAs share an SM (+4 % at seq 512 and 8192 over 128-key tiles); for d128 128-key tiles do not fit the registers.
    """
    return TileConfig(bn=128 if spec.head_dim <= 64 and spec.causal != "none" else 64)


def flash_mma(spec, cfg: TileConfig = TileConfig()) -> tvm.tirx.PrimFunc:
    """The tensor-core flash-attention kernel (see the module docstring)."""
    H, G, D, dtype = spec.heads, spec.group, spec.head_dim, spec.dtype
    ab = TC_DTYPES[dtype]
    batch, sq, skv = spec.batch, spec.seq_q, spec.seq_kv
    has_bias, causal = spec.bias_shape is not None, spec.causal != "none"
    offset = causal_offset(sq, skv, spec.causal)
    lpt = causal and cfg.lpt
    MT, stages = cfg.m_tiles, cfg.stages
    WM, NT = 16 * MT, 32 * cfg.warps  # rows per warp, threads
    BM, BN = WM * cfg.warps, cfg.bn
    DP = D + 8  # padded smem row (elements): 16 B shift per row, no ldmatrix bank conflicts
    CPR = D // 8  # 16-byte chunks per row
    Q_OFF, K_OFF, V_OFF = 0, BM * DP, BM * DP + stages * BN * DP  # in one shared buffer (elements)
    SMEM = V_OFF + stages * BN * DP
    KS, NS, ND = D // 16, BN // 8, D // 8  # k-steps of Q·Kᵀ, n-tiles of S, n-tiles of O
    QF = MT * KS * 8 if cfg.q_in_regs else MT * 8  # Q fragment registers (halves)
    nq = (sq + BM - 1) // BM
    # scores go to the exp2 domain with one FMA: p = exp2(s * c - m), c = scale * log2(e); with a bias
    # the logits are formed in natural units first (c would overflow a -FLT_MAX mask to -inf)
    fold = spec.scale > 0 and not has_bias
    c2 = spec.scale * LOG2E
    f32, neg_inf = "float32", T.float32("-inf")
    shfl = warp_shuffle_xor

    assert (BM * CPR) % NT == 0 and (BN * CPR) % NT == 0, "tile copies must split evenly over the threads"
    assert not cfg.pingpong or cfg.warps % 2 == 0, "ping-pong needs two equal warp groups"

    def tile_start(bx):  # causal: the heaviest query tiles first
        return (nq - 1 - bx) * BM if causal else bx * BM

    def kv_limit(q0):  # keys past this are masked for every row of the tile
        return T.min(skv, T.min(q0 + BM, sq) + offset) if causal else skv

    def plain_tiles(q0):  # leading key tiles inside the sequence that every row of the query tile sees whole
        return T.min(skv // BN, (q0 + offset + 1) // BN) if causal else skv // BN

    def exp_units(x, base):  # exp(logit - max) for a logit and max in the units the running max is kept in
        return T.exp2((x - base) * T.float32(LOG2E)) if has_bias else T.exp2(x - base)

    def prob(s, base):  # the softmax numerator of score accumulator s
        return T.exp2(s * T.float32(c2) - base) if fold else exp_units(s, base)

    def q_frag(mt, kk):  # offset of Q's A fragment (m-tile mt, k-step kk) in qf
        return (mt * KS + kk) * 8 if cfg.q_in_regs else mt * 8

    @T.macro
    def load_rows(smem, base, src, b, row0, nrows, head, rows, tx):
        """cp.async ``rows`` rows src[b, row0 + r, head, :] -> smem[base + r * DP:], zero past ``nrows``."""
        for it in T.unroll(rows * CPR // NT):
            cid = T.meta_var(it * NT + tx)
            r = T.meta_var(cid // CPR)
            col = T.meta_var(cid % CPR * 8)
            T.ptx["cp.async.cg.shared.global"](
                smem.ptr_to([base + r * DP + col]),
                src.ptr_to([b, T.min(row0 + r, nrows - 1), head, col]),
                16,
                T.Cast("uint32", T.if_then_else(row0 + r < nrows, 16, 0)),
            )

    @T.macro
    def ldmatrix(trans, frag, frag_off, smem, smem_off):
        T.ptx_legacy.ldmatrix(trans, 4, ".b16", frag.data, frag_off, smem.access_ptr("r"), smem_off, dtype=dtype)

    @T.macro
    def mma(a, a_off, b, b_off, c, c_off):
        T.ptx_legacy.mma("m16n8k16", "row", "col", ab, ab, "fp32", a.data, a_off, b.data, b_off, c.data, c_off, False,
                         dtype=f32)

    @T.macro
    def load_q(qf, smem, warp, lane, mt, kk):  # A fragment rows (lane % 16), cols kk*16 + (lane / 16) * 8
        ldmatrix(False, qf, q_frag(mt, kk), smem, Q_OFF + (warp * WM + mt * 16 + lane % 16) * DP + kk * 16 + lane // 16 * 8)

    @T.macro
    def attend(smem, q, k, v, bias, out, bx, h, b, tx):
        qf = T.alloc_buffer((QF,), dtype, scope="local")
        kf = T.alloc_buffer((8,), dtype, scope="local")
        vf = T.alloc_buffer((8,), dtype, scope="local")
        sacc = T.alloc_buffer((MT * NS * 4,), f32, scope="local")
        pf = T.alloc_buffer((MT * NS * 4,), dtype, scope="local")
        oacc = T.alloc_buffer((MT * ND * 4,), f32, scope="local")
        # per row held by this thread (m-tile mt, row g + r*8 at index mt*2 + r): running max and sum; the
        # tile's max, sum, rescale factor and exponent base
        m = T.alloc_buffer((MT * 2,), f32, scope="local")
        lsum = T.alloc_buffer((MT * 2,), f32, scope="local")
        mx = T.alloc_buffer((MT * 2,), f32, scope="local")
        rs = T.alloc_buffer((MT * 2,), f32, scope="local")
        al = T.alloc_buffer((MT * 2,), f32, scope="local")
        bs = T.alloc_buffer((MT * 2,), f32, scope="local")
        warp = T.meta_var(tx // 32)
        lane = T.meta_var(tx % 32)
        g = T.meta_var(lane // 4)
        t4 = T.meta_var(lane % 4)
        q0 = T.meta_var(tile_start(bx))
        hk = T.meta_var(h // G)
        n_kv = T.meta_var((kv_limit(q0) + BN - 1) // BN)
        load_rows(smem, Q_OFF, q, b, q0, sq, h, BM, tx)
        for p in T.unroll(stages - 1):  # prologue: tiles 0 .. stages-2 in flight, one commit group each
            if p < n_kv:
                load_rows(smem, K_OFF + p * (BN * DP), k, b, p * BN, skv, hk, BN, tx)
                load_rows(smem, V_OFF + p * (BN * DP), v, b, p * BN, skv, hk, BN, tx)
            T.ptx.cp.async_.commit_group()
        for i in T.unroll(MT * ND * 4):
            oacc[i] = T.float32(0)
        for i in T.unroll(MT * 2):
            m[i] = neg_inf
            lsum[i] = T.float32(0)
        @T.inline
        def my_turn():  # ping-pong: wait until the other warp group has issued its GEMM (named barrier 1 + group)
            if cfg.pingpong:
                T.ptx["bar.sync"](T.Cast("uint32", 1 + warp // (cfg.warps // 2)), T.uint32(NT))

        @T.inline
        def your_turn():  # ping-pong: this group's GEMM is issued, the other group's may start
            if cfg.pingpong:
                T.ptx["bar.arrive"](T.Cast("uint32", 2 - warp // (cfg.warps // 2)), T.uint32(NT))

        @T.inline
        def qk(stage):
            """S = Q Kᵀ for the key tile in smem stage ``stage``."""
            # K's B fragments: rows (keys) n2*16 + (lane / 16) * 8 + lane % 8, cols kk*16 + (lane / 8 % 2) * 8
            for i in T.unroll(MT * NS * 4):
                sacc[i] = T.float32(0)
            for kk in T.unroll(KS):
                if not cfg.q_in_regs:
                    for mt in T.unroll(MT):
                        load_q(qf, smem, warp, lane, mt, kk)
                for n2 in T.unroll(NS // 2):
                    ldmatrix(False, kf, 0, smem,
                             K_OFF + stage + (n2 * 16 + lane // 16 * 8 + lane % 8) * DP + kk * 16 + lane // 8 % 2 * 8)
                    for mt in T.unroll(MT):
                        mma(qf, q_frag(mt, kk), kf, 0, sacc, (mt * NS + n2 * 2) * 4)
                        mma(qf, q_frag(mt, kk), kf, 4, sacc, (mt * NS + n2 * 2 + 1) * 4)

        @T.inline
        def softmax(k0, masked):
            """S -> P (in registers, as the A fragments of P V); running max / sum and O rescaled."""
            # logits: scale, bias, masks (sacc[(mt*NS + n)*4 + c]: row mt*16 + g + c//2*8, key n*8 + 2t + c%2)
            if masked:
                for mt in T.unroll(MT):
                    for n in T.unroll(NS):
                        for c in T.unroll(4):
                            row = T.meta_var(q0 + warp * WM + mt * 16 + g + c // 2 * 8)
                            key = T.meta_var(k0 + n * 8 + t4 * 2 + c % 2)
                            i = T.meta_var((mt * NS + n) * 4 + c)
                            if has_bias:
                                sacc[i] = T.if_then_else(spec.visible(row, key), sacc[i] * T.float32(spec.scale)
                                                         + spec.bias_at(bias, b, h, row, key), neg_inf)
                            else:
                                sacc[i] = T.if_then_else(spec.visible(row, key), sacc[i], neg_inf)
            if not (fold or has_bias):
                for i in T.unroll(MT * NS * 4):
                    sacc[i] = sacc[i] * T.float32(c2)
            # online softmax per row: max over the tile (4 lanes of a quad share a row), rescale, exponentiate
            for mt in T.unroll(MT):
                for r in T.unroll(2):
                    i = T.meta_var(mt * 2 + r)
                    mx[i] = neg_inf
                    for n in T.unroll(NS):
                        for e in T.unroll(2):
                            mx[i] = T.max(mx[i], sacc[(mt * NS + n) * 4 + r * 2 + e])
                    mx[i] = T.max(mx[i], shfl(mx[i], 1))
                    mx[i] = T.max(mx[i], shfl(mx[i], 2))
                    if fold:
                        mx[i] = T.max(m[i], mx[i] * T.float32(c2))
                    else:
                        mx[i] = T.max(m[i], mx[i])
                    # a row masked so far has max -inf: exponentiate against 0 (p = 0, not NaN)
                    bs[i] = T.if_then_else(mx[i] == neg_inf, T.float32(0), mx[i])
                    al[i] = exp_units(m[i], bs[i])
                    if al[i] != T.float32(1):  # the max moved: rescale (skipped once the max settles)
                        for d in T.unroll(ND):
                            for e in T.unroll(2):
                                oacc[(mt * ND + d) * 4 + r * 2 + e] = oacc[(mt * ND + d) * 4 + r * 2 + e] * al[i]
                        lsum[i] = lsum[i] * al[i]
                    m[i] = mx[i]
                    rs[i] = T.float32(0)
                    for n in T.unroll(NS):
                        for e in T.unroll(2):
                            x = T.meta_var(sacc[(mt * NS + n) * 4 + r * 2 + e])
                            sacc[(mt * NS + n) * 4 + r * 2 + e] = prob(x, bs[i])
                            rs[i] = rs[i] + sacc[(mt * NS + n) * 4 + r * 2 + e]
                    lsum[i] = lsum[i] + rs[i]
            for i in T.unroll(MT * NS * 4):
                pf[i] = T.Cast(dtype, sacc[i])

        @T.inline
        def pv(stage):
            """O += P V for the value tile in smem stage ``stage``."""
            # O += P V; P's A fragment for k-step kk is S n-tiles 2kk, 2kk+1 as they lie in registers;
            # V's B fragments (ldmatrix.trans): rows (keys) kk*16 + (lane / 8 % 2) * 8 + lane % 8, cols d2*16 + (lane / 16) * 8
            for kk in T.unroll(BN // 16):
                for d2 in T.unroll(D // 16):
                    ldmatrix(True, vf, 0, smem,
                             V_OFF + stage + (kk * 16 + lane // 8 % 2 * 8 + lane % 8) * DP + d2 * 16 + lane // 16 * 8)
                    for mt in T.unroll(MT):
                        mma(pf, (mt * NS + kk * 2) * 4, vf, 0, oacc, (mt * ND + d2 * 2) * 4)
                        mma(pf, (mt * NS + kk * 2) * 4, vf, 4, oacc, (mt * ND + d2 * 2 + 1) * 4)

        @T.inline
        def tile(j, masked):
            """Key tile j: prefetch tile j + stages - 1, wait for tile j, compute (``masked``: scores masked)."""
            k0 = T.meta_var(j * BN)
            stage = T.meta_var(j % stages * (BN * DP))
            if j + stages - 1 < n_kv:  # into the stage read in iteration j-1 (all warps past its end barrier)
                nxt = T.meta_var((j + stages - 1) % stages * (BN * DP))
                load_rows(smem, K_OFF + nxt, k, b, k0 + (stages - 1) * BN, skv, hk, BN, tx)
                load_rows(smem, V_OFF + nxt, v, b, k0 + (stages - 1) * BN, skv, hk, BN, tx)
            T.ptx.cp.async_.commit_group()
            T.ptx.cp.async_.wait_group(stages - 1)  # all but the newest stages-1 groups done: tile j is in
            T.tvm_storage_sync("shared")
            if cfg.q_in_regs:
                if j == 0:
                    for mt in T.unroll(MT):
                        for kk in T.unroll(KS):
                            load_q(qf, smem, warp, lane, mt, kk)
            # a warp whose rows all end before the tile's first key skips it (its scores would all be -inf)
            live = T.meta_var(k0 <= q0 + warp * WM + WM - 1 + offset if masked and causal else True)
            my_turn()
            if live:
                qk(stage)
            your_turn()
            if live:
                softmax(k0, masked)
            my_turn()
            if live:
                pv(stage)
            your_turn()
            T.tvm_storage_sync("shared")

        if cfg.pingpong:  # group 0 has the first turn
            if warp >= cfg.warps // 2:
                T.ptx["bar.arrive"](T.uint32(1), T.uint32(NT))
        if has_bias:  # every score takes its bias: one loop
            for j in T.serial(n_kv):
                tile(j, True)
        else:  # first the tiles inside the sequence and wholly below the causal diagonal, unmasked; then the rest
            n_plain = T.meta_var(T.min(n_kv, plain_tiles(q0)))
            for j in T.serial(n_plain):
                tile(j, False)
            for j in T.serial(n_plain, n_kv):
                tile(j, True)
        if cfg.pingpong:  # group 0 takes group 1's last hand-over: every arrival is matched
            if warp < cfg.warps // 2:
                T.ptx["bar.sync"](T.uint32(1), T.uint32(NT))
        T.ptx.cp.async_.wait_group(0)
        # epilogue: O / rowsum (0/0 = NaN for a fully masked row, as the unfused softmax), staged through
        # this warp's own Q rows in shared memory, then 16-byte coalesced stores
        for i in T.unroll(MT * 2):
            lsum[i] = lsum[i] + shfl(lsum[i], 1)
            lsum[i] = lsum[i] + shfl(lsum[i], 2)
            lsum[i] = T.float32(1) / lsum[i]
        for mt in T.unroll(MT):
            for d in T.unroll(ND):
                for c in T.unroll(4):
                    smem[Q_OFF + (warp * WM + mt * 16 + g + c // 2 * 8) * DP + d * 8 + t4 * 2 + c % 2] = T.Cast(
                        dtype, oacc[(mt * ND + d) * 4 + c] * lsum[mt * 2 + c // 2]
                    )
        T.tvm_storage_sync("shared")
        for it in T.unroll(BM * CPR // NT):
            cid = T.meta_var(it * NT + tx)
            r = T.meta_var(cid // CPR)
            col = T.meta_var(cid % CPR * 8)
            if q0 + r < sq:
                for e in T.vectorized(8):
                    out[b, q0 + r, h, col + e] = smem[Q_OFF + r * DP + col + e]

    @T.macro
    def block(q, k, v, bias, out, bx, h, b, tx):
        with T.sblock("flash_attention"):
            T.reads()
            T.writes()
            # Q | K stages | V stages; > 48 KB is opted in at launch. Named per dtype: kernels
            # of both types can share one CUDA module (same-named extern __shared__ arrays must agree)
            if dtype == "float16":
                smem_f16 = T.alloc_buffer((SMEM,), dtype, scope="shared.dyn")
                attend(smem_f16, q, k, v, bias, out, bx, h, b, tx)
            else:
                smem_bf16 = T.alloc_buffer((SMEM,), dtype, scope="shared.dyn")
                attend(smem_bf16, q, k, v, bias, out, bx, h, b, tx)

    @T.macro
    def cta(q, k, v, bias, out, bx, h, b):
        for tx in T.thread_binding(NT, thread="threadIdx.x"):
            if cfg.min_blocks > 0:  # __launch_bounds__(NT, min_blocks): ptxas caps the registers so that many CTAs fit an SM
                with T.attr(0, "tirx.launch_bounds_min_blocks_per_sm", cfg.min_blocks):
                    block(q, k, v, bias, out, bx, h, b, tx)
            else:
                block(q, k, v, bias, out, bx, h, b, tx)

    @T.macro
    def body(q, k, v, bias, out):
        if lpt:  # query tiles slowest: the whole grid runs heaviest tiles first (blocks start in index order)
            for h in T.thread_binding(H, thread="blockIdx.x"):
                for b in T.thread_binding(batch, thread="blockIdx.y"):
                    for bx in T.thread_binding(nq, thread="blockIdx.z"):
                        cta(q, k, v, bias, out, bx, h, b)
        else:  # query tiles fastest: CTAs running together share their K/V in L2
            for bx in T.thread_binding(nq, thread="blockIdx.x"):
                for h in T.thread_binding(H, thread="blockIdx.y"):
                    for b in T.thread_binding(batch, thread="blockIdx.z"):
                        cta(q, k, v, bias, out, bx, h, b)

    return kernel_signature(spec, body)


SIMT_THREADS = 128
SIMT_MIN_CTAS = 2 * SMS["sm_90"]  # two CTAs per SM on the H200


def simt_split(spec) -> int:
    """Lanes that share one query row in the SIMT kernel: 2 when one lane per row gives fewer than
    ``SIMT_MIN_CTAS`` CTAs, else 1.

    One lane per row leaves short-sequence models with a handful of CTAs whose every lane walks all keys
    (BERT-base, batch 1: 12 CTAs). Splitting a row's keys over 2 lanes halves that chain and doubles the CTAs
    (H200, fp32, batch 1: BERT / GPT-2 / ViT 1.8-2.8 TFLOP/s, one lane 1.3-1.8); more lanes lose (0.7-1.7):
    each CTA then streams all of K and V through shared memory for fewer rows.
    A symbolic batch or sequence keeps one lane per row (its size is unknown; large is the safe guess).
    """
    if not (isinstance(spec.batch, int) and isinstance(spec.seq_q, int)):
        return 1
    return 2 if spec.batch * spec.heads * -(-spec.seq_q // SIMT_THREADS) < SIMT_MIN_CTAS else 1


def flash_simt(spec, split: int = 1) -> tvm.tirx.PrimFunc:
    """Correct fallback for any dtype / head dims on CUDA cores: ``split`` lanes per query row, K/V tiles in
    shared memory.

    Lane ``part`` of a row takes keys ``part, part + split, ...`` of each tile with its own online softmax;
    the lanes' partial (max, sum, output) are merged with warp shuffles at the end.
    """
    H, G, D, DV, dtype = spec.heads, spec.group, spec.head_dim, spec.head_dim_v, spec.dtype
    batch, sq, skv = spec.batch, spec.seq_q, spec.seq_kv
    has_bias, causal = spec.bias_shape is not None, spec.causal != "none"
    offset = causal_offset(sq, skv, spec.causal)
    NT = SIMT_THREADS
    rows = NT // split
    BK = 32 if max(D, DV) <= 128 else 16
    KP = BK // split  # keys of a tile per lane
    nq = (sq + rows - 1) // rows
    f32, neg_inf = "float32", T.float32("-inf")
    shfl = warp_shuffle_xor
    assert split & (split - 1) == 0 and split <= BK, "lanes per row: a power of two up to the tile's keys"

    def tile_start(bx):
        return (nq - 1 - bx) * rows if causal else bx * rows

    def kv_limit(q0):
        return T.min(skv, T.min(q0 + rows, sq) + offset) if causal else skv

    @T.macro
    def body(q, k, v, bias, out):
        for bx in T.thread_binding(nq, thread="blockIdx.x"):
            for h in T.thread_binding(H, thread="blockIdx.y"):
                for b in T.thread_binding(batch, thread="blockIdx.z"):
                    for tx in T.thread_binding(NT, thread="threadIdx.x"):
                        with T.sblock("attention_simt"):
                            T.reads()
                            T.writes()
                            # rows padded by one word: the lanes of a row read consecutive keys in different banks
                            ks = T.alloc_buffer((BK, D + 1), f32, scope="shared.dyn")
                            vs = T.alloc_buffer((BK, DV), f32, scope="shared.dyn")
                            qr = T.alloc_buffer((D,), f32, scope="local")
                            o = T.alloc_buffer((DV,), f32, scope="local")
                            s = T.alloc_buffer((KP,), f32, scope="local")
                            st = T.alloc_buffer((4,), f32, scope="local")  # running max, sum; tile max; rescale
                            q0 = T.meta_var(tile_start(bx))
                            row = T.meta_var(q0 + tx // split)
                            part = T.meta_var(tx % split)
                            hk = T.meta_var(h // G)
                            for dd in T.unroll(D):
                                qr[dd] = T.Cast(f32, q[b, T.min(row, sq - 1), h, dd]) * T.float32(spec.scale)
                            for c in T.unroll(DV):
                                o[c] = T.float32(0)
                            st[0] = neg_inf
                            st[1] = T.float32(0)
                            for j in T.serial((kv_limit(q0) + BK - 1) // BK):
                                k0 = T.meta_var(j * BK)
                                T.tvm_storage_sync("shared")
                                for it in range((BK * max(D, DV) + NT - 1) // NT):
                                    e = T.meta_var(it * NT + tx)
                                    if e < BK * D:
                                        ks[e // D, e % D] = T.Cast(f32, k[b, T.min(k0 + e // D, skv - 1), hk, e % D])
                                    if e < BK * DV:
                                        vs[e // DV, e % DV] = T.if_then_else(
                                            k0 + e // DV < skv, T.Cast(f32, v[b, T.min(k0 + e // DV, skv - 1), hk, e % DV]),
                                            T.float32(0),
                                        )
                                T.tvm_storage_sync("shared")
                                st[2] = st[0]
                                for jj in T.unroll(KP):
                                    key = T.meta_var(jj * split + part)
                                    s[jj] = T.float32(0)
                                    for dd in T.unroll(D):
                                        s[jj] = s[jj] + qr[dd] * ks[key, dd]
                                    if has_bias:
                                        s[jj] = s[jj] + spec.bias_at(bias, b, h, row, k0 + key)
                                    s[jj] = T.if_then_else(spec.visible(row, k0 + key), s[jj], neg_inf)
                                    st[2] = T.max(st[2], s[jj])
                                base = T.meta_var(T.if_then_else(st[2] == neg_inf, T.float32(0), st[2]))
                                st[3] = T.exp(st[0] - base)
                                st[0] = st[2]
                                st[1] = st[1] * st[3]
                                for c in T.unroll(DV):
                                    o[c] = o[c] * st[3]
                                for jj in T.unroll(KP):
                                    s[jj] = T.exp(s[jj] - base)
                                    st[1] = st[1] + s[jj]
                                    for c in T.unroll(DV):
                                        o[c] = o[c] + s[jj] * vs[jj * split + part, c]
                            if split > 1:  # merge the row's lanes (adjacent in the warp): rescale each to the row max, add
                                st[2] = st[0]
                                for lg in T.unroll(split.bit_length() - 1):
                                    st[2] = T.max(st[2], shfl(st[2], 1 << lg))
                                st[3] = T.exp(st[0] - T.if_then_else(st[2] == neg_inf, T.float32(0), st[2]))
                                st[1] = st[1] * st[3]
                                for lg in T.unroll(split.bit_length() - 1):
                                    st[1] = st[1] + shfl(st[1], 1 << lg)
                                for c in T.unroll(DV):
                                    o[c] = o[c] * st[3]
                                    for lg in T.unroll(split.bit_length() - 1):
                                        o[c] = o[c] + shfl(o[c], 1 << lg)
                            if row < sq:
                                for c in T.unroll(DV):  # the lanes of a row take turns by column (static register index)
                                    if c % split == part:
                                        out[b, row, h, c] = T.Cast(dtype, o[c] / st[1])

    return kernel_signature(spec, body)
