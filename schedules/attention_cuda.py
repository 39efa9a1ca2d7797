"""Fused attention for CUDA: FlashAttention-2/3 style tensor-core kernels (mma.sync, wgmma), and a SIMT fallback.

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
* online softmax in registers with ``ex2.approx.ftz`` and the scale folded into one FMA, row max/sum reduced
  across the 4 lanes of a quad with shuffles; O is rescaled only when the running max moves;
* causal: key tiles beyond the diagonal are never loaded; the tiles every row sees whole run in a loop
  without mask code, those crossing the diagonal (and the ragged tail) in a second, masked loop, where
  a warp whose rows all end before the tile's first key skips it; the query tiles of all heads are
  launched heaviest first (largest-processing-time order: no long tile starts in the last wave), or of
  sections of heads whose K/V fit L2 together (``lpt_section``);
  bias / key padding masks are added per score; grouped-query heads read their shared K/V head; rows
  or keys past the sequence end are zero-filled by ``cp.async`` (src-size 0) and masked, so any
  length works;
* optional ping-pong (``pingpong``, FA3's schedule on mma.sync): two warp groups hand the tensor cores
  to each other with named barriers, so one group's softmax runs under the other's GEMM instead of
  all warps reaching their softmax together (they are kept in step by the per-tile CTA barriers);
* the epilogue stages O through shared memory for 16-byte coalesced stores.

Hopper variant (``wgmma``, sm_90a; the rule's choice for long sequences, see ``choose``):

* each warpgroup (4 warps) owns 64 query rows and runs both GEMMs as ``wgmma.mma_async.m64nNk16``: S from Q
  and K in shared memory, O += P·V with P straight from the S registers (wgmma's A-register fragment is
  mma.m16n8k16's) and V read transposed; Q/K/V tiles sit in wgmma's 128-byte swizzled layout (head dims of 64
  and 128; others in the no-swizzle core-matrix layout), which cp.async fills directly, 8 lanes copying 128
  contiguous bytes of a row into 8 bank groups (H200, same run, on the benchmark's wgmma shapes: +2-11 % for 4
  warpgroups of 32-key tiles (d128), +5-10 % for d64; unswizzled, 3 warpgroups of 64-key tiles (d128) ran 17-27 %
  slower, in the next run);
* FlashAttention-3's in-warpgroup pipeline over a ring of 3 K/V stages: S of tile j+1 is issued, O rescaled
  under it, P·V of tile j issued; tile j+1's softmax runs while P·V is on the tensor cores; with TMA the last tile
  runs after the loop, P·V alone (``peel``);
* every wgmma is issued and waited on every path (ptxas serialises all of them otherwise), and empty-asm
  register pins keep the compiler from moving register uses across the waits;
* head dims of 64 and 128 (``tma``): warp-specialised as FlashAttention-3 and cuDNN. One more warpgroup, the
  producer, gives its registers to the others (``setmaxnreg``: 24 per thread, 240 for each of 2 computing
  warpgroups, enough for 128-key tiles) and one of its threads streams Q and every K/V tile into the stages with
  TMA (``cp.async.bulk.tensor`` from tensor maps the host function encodes, written in the 128-byte swizzle);
  a stage's mbarrier completes on its bytes, and the computing warps release it once their P·V has read it. No
  thread of the computing warpgroups copies, and no CTA barrier stands between tiles. Optionally (``pingpong``)
  the two computing warpgroups take turns issuing their GEMMs (named barriers). Persistent (``persistent``): one
  CTA per SM loops over the (query tile, head, batch) items; the K/V ring runs on across items, so the producer
  loads the next item's first tiles (and Q, once the computing warps release its buffer, or into a second buffer)
  while this item's last tiles and epilogue run, and the epilogue stores O from the registers, or (``tma_store``)
  through shared memory with ``stmatrix`` and one TMA tensor store per warpgroup; optionally
  (``carry``) the next item's first Q·Kᵀ is issued right behind the last P·V and runs under the epilogue;
* without TMA, causal (``group_diag``): each warpgroup stops at its own rows' diagonal; the per-tile barrier is
  then a named barrier over the warpgroups still at that tile (and those that stopped at it), and the last
  warpgroup copies every K/V tile.

Fragment layouts (PTX ISA, mma.m16n8k16; g = lane / 4, t = lane % 4): A regs a0..a3 hold rows
(g, g+8, g, g+8) x cols (2t, 2t, 2t+8, 2t+8); B regs b0, b1 hold k rows 2t, 2t+8 of column g;
C holds (g, 2t..2t+1) and (g+8, 2t..2t+1). Hence the S accumulators of n-tiles 2kk and 2kk+1 are,
in register order, exactly the A fragment of P for k-step kk.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import tvm
from tvm.script import tirx as T

from . import attention_cuda_decode
from .attention import by_query_rows, causal_offset, kernel_signature
from .common import (LOG2E, SMEM_BYTES, TC_DTYPES, ex2, has_wgmma, mbarrier_wait, mma_ops, pin, register_split,
                     row_copier, sm_count, sm_version, warp_shuffle_xor, wgmma_desc)

TC_HEAD_DIMS = (32, 64, 96, 128)


def tensor_cores(dtype: str, head_dim: int, head_dim_v: int, target: tvm.target.Target) -> bool:
    """Whether attention of this type and head dims gets the tensor-core kernel on ``target``."""
    return dtype in TC_DTYPES and head_dim == head_dim_v and head_dim in TC_HEAD_DIMS and sm_version(target) >= 80


def kernel(spec, target: tvm.target.Target) -> tvm.tirx.PrimFunc:
    """The fused kernel for ``spec`` (an ``AttentionSpec``): the decode kernel for few query rows per head
    (``attention_cuda_decode``), else tensor cores where they apply. A query length known only at run time (a model
    exported for prefill and decoding steps alike) gets both, chosen per call."""
    if not attention_cuda_decode.fits(spec, target):
        return kernel_signature(spec, prefill_body(spec, target))
    if isinstance(spec.seq_q, int):
        return attention_cuda_decode.kernel(spec, target)
    return by_query_rows(spec, attention_cuda_decode.MAX_SEQ_Q, attention_cuda_decode.body(spec, target),
                         prefill_body(spec, target))


def prefill_body(spec, target: tvm.target.Target):
    """The body of the kernel for many query rows per head: tensor cores where they apply, else SIMT."""
    assert spec.kv_layout == "BSNH", "K and V as [batch, seq, heads, dim] (attention._reads_in_place)"
    if tensor_cores(spec.dtype, spec.head_dim, spec.head_dim_v, target):
        return mma_body(spec, choose(spec, has_wgmma(target)))
    return simt_body(spec, simt_split(spec))


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
    lpt_heads: int = 0  # causal: LPT within sections of this many (batch, head) pairs, one after the other (0: one)
    pingpong: bool = False  # two warp groups take turns on the tensor cores: one's GEMM overlaps the other's softmax
    # (mma.sync; wgmma: with TMA and 2 computing warpgroups)
    wgmma: bool = False  # Hopper (sm_90a): each group of 4 warps runs both GEMMs as one wgmma.m64 (needs m_tiles=1)
    # exponentiate with the bare ex2.approx.ftz (``common.ex2``), not CUDA's exp2f (H200, one run: +2-10 % on 6 of the
    # 12 benchmark shapes, level on 4, -5-10 % for d128 at seq 512 in two runs)
    ftz_exp: bool = True
    group_diag: bool = False  # causal wgmma: each warpgroup stops at its own diagonal (``per_group`` in flash_mma)
    swizzle: bool = True  # wgmma, head_dim a multiple of 64: tiles in the 128-byte swizzled layout (see ``at``)
    # wgmma, swizzled: warp-specialised, one more warpgroup loads Q/K/V with TMA (``warps`` counts the others)
    tma: bool = False
    # TMA: this many CTAs (at most one per work item) loop over the (query tile, head, batch) work items, the producer
    # loading the next item's tiles under the current item's last tiles and epilogue (0: one CTA per item)
    persistent: int = 0
    # persistent: CTA c takes items in boustrophedon rounds (round r: item r * ctas + c, odd rounds r * ctas + ctas - 1 - c)
    # instead of c, c + ctas, ...: under the causal heaviest-first order each CTA then alternates heavy and light items
    snake: bool = False
    q_bufs: int = 1  # persistent: Q buffers (2: the next item's Q loads under the current item's tiles)
    # TMA: the last key tile of an item runs P·V alone (peeled from the loop, which otherwise issues one more Q·Kᵀ of a
    # stale stage and drops it: 1 GEMM of 2 * n_kv + 1 wasted, 11 % at 4 key tiles); persistent: Q's buffer released
    # as soon as the item's last S is in, so that the next item's Q loads under its last softmax, P·V and epilogue
    peel: bool = True
    # persistent, peeled: the next item's first Q·Kᵀ issued right behind this item's last P·V, so that the tensor
    # cores run it under the epilogue and the change of item instead of after them
    carry: bool = False
    # persistent, peeled: the epilogue writes O / row sum with ``stmatrix`` into shared memory (a buffer of its own where
    # the SM has room, else the K tile of the item's last stage) and one thread per warpgroup stores it with TMA, instead
    # of each thread storing 4 bytes at a time from its registers (``store_o``)
    tma_store: bool = False
    # causal TMA: the query tiles end at the sequence's end, so that a ragged tile (rows not a multiple of the tile's)
    # is the first, whose rows see the fewest keys, instead of the last, which sees them all (its rows before the
    # sequence are zero-filled by TMA and never stored). d64's 192-row tiles at seq 2048: 96 key tiles computed
    # instead of 101
    end_aligned: bool = False

    @property
    def name(self) -> str:
        return (f"w{self.warps}m{self.m_tiles}n{self.bn}s{self.stages}{'q' if self.q_in_regs else ''}"
                f"{f'b{self.min_blocks}' if self.min_blocks else ''}{'p' if self.pingpong else ''}{'' if self.lpt else 'x'}"
                f"{f'l{self.lpt_heads}' if self.lpt_heads else ''}{'g' if self.wgmma else ''}{'' if self.ftz_exp else 'e'}"
                f"{'d' if self.group_diag else ''}{'' if self.swizzle else 'u'}{'t' if self.tma else ''}"
                f"{f'P{self.persistent}' if self.persistent else ''}{f'Q{self.q_bufs}' if self.q_bufs > 1 else ''}"
                f"{'' if self.peel or not self.tma else 'z'}{'c' if self.carry else ''}{'o' if self.tma_store else ''}"
                f"{'r' if self.end_aligned else ''}{'S' if self.snake else ''}")


def wgmma_config(head_dim: int, causal: bool = False) -> TileConfig:
    """The wgmma kernel's shape (see ``choose``). Head dims of 64 and 128: warp-specialised, a TMA producer warpgroup
    and computing warpgroups of 128-key tiles in a ring of 3 stages, 3 of them (192 query rows) for head_dim 64, else
    2, in ping-pong under a causal mask. Others (no TMA: their rows do not fill the 128-byte swizzle): 64-key tiles
    copied by every thread, 4 warpgroups up to head_dim 64, else 3."""
    if head_dim % 64 == 0:
        return TileConfig(warps=12 if head_dim <= 64 else 8, m_tiles=1, bn=128, stages=3, wgmma=True, tma=True,
                          pingpong=causal and head_dim > 64)
    return cp_async_wgmma_config(head_dim)


def cp_async_wgmma_config(head_dim: int) -> TileConfig:
    """The wgmma kernel without TMA (the rule's before it): 64-key tiles, 4 warpgroups up to head_dim 64, else 3."""
    return TileConfig(warps=16 if head_dim <= 64 else 12, m_tiles=1, bn=64, stages=3, wgmma=True)


# K/V bytes the heads of one LPT section may share in L2. FlashAttention-3 takes 32 MB for the H100's 50 MB; Nsight
# Compute on the H100 (rerun/attention-h100-previous-rule/) had our causal kernels read 1.4-1.8x the minimum from DRAM
# with it (a head's K/V evicted between its query tiles by the section's Q, O and other K/V), and 8 MB ran faster:
# H100, two runs (rerun/attention-h100-lpt-sections/): causal seq 2048 d128 +5 %, d64 +6 %. With it they read the minimum
# (attention-ncu-h100-80gb-hbm3.json, attention-ncu-h200.json).
L2_KV_BYTES = 8 << 20


def lpt_section(spec) -> int:
    """(batch, head) pairs per section of the causal launch order (``TileConfig.lpt_heads``; 0: one section).

    Heaviest-first over all heads starts only a CTA or two of each head together: every CTA then streams its
    head's K/V from memory alone. In sections whose K/V fit L2 (a power of two of pairs, times the query heads
    per K/V head, as FA3's scheduler), a head's tiles run side by side and share their K/V reads. (H200, wgmma,
    causal d64 at seq 8192: DRAM reads 1.15 -> 0.32 GB, L2 hit rate 76 -> 92 %; against one section in the same
    run: +3-5 % at seq 2048 and 8192, d64 and d128. The mma.sync kernel, with more CTAs per SM, gained nothing in
    a sweep of section sizes.)
    """
    if not isinstance(spec.seq_kv, int):
        return 0
    fit = L2_KV_BYTES // (spec.seq_kv * (spec.head_dim + spec.head_dim_v) * 2)
    return (1 << fit.bit_length() - 1 if fit else 1) * spec.group


def at_least(n, rows: int) -> bool:
    """Whether a length is at least ``rows`` (a symbolic length counts as long)."""
    return not isinstance(n, int) or n >= rows


def causal_launch(cfg: TileConfig, spec) -> TileConfig:
    """wgmma ``cfg`` under a causal mask: launched in L2 sections (``lpt_section``); with TMA, the query tiles aligned
    to the sequence's end (``end_aligned``; H100, two runs, rerun/attention-end-aligned/: d64 at seq 2048 +3.1 % and
    +3.5 %, 8192 +1.6 % and +1.1 %); without TMA, each warpgroup up to its own diagonal up to 4096 rows (``group_diag``,
    see ``choose``)."""
    return replace(cfg, lpt_heads=lpt_section(spec), group_diag=not cfg.tma and not at_least(spec.seq_q, 4097),
                   end_aligned=cfg.tma)


def persistent_launch(cfg: TileConfig, spec) -> TileConfig:
    """TMA ``cfg`` as a persistent kernel (one CTA per SM of the H200, each looping over work items) without a causal
    mask, causal below 2048 rows, d128 below 4096 (there 2 computing warpgroups in ping-pong, for head_dim 64 with 2 Q
    buffers and the next item's first S carried, ``TileConfig.carry``). Without a mask, d128 in ping-pong from 2048 to
    4096 rows, d64 with 2 Q buffers below 2048 (3 warpgroups: no ping-pong). O stored with TMA below 4096 rows (d64:
    2048). d64 in a ring of 4 K/V stages (H100, rerun/attention-d64-stages/, per-round ratios against 3 stages: seq 512
    +3.6 % / +1.1 %, causal +8.3 % / +6.7 %, seq 2048 +0.5-1.9 % in four runs, 8192 +1.5-4.9 %; 5 and 6 stages no
    better; one CTA per query tile, causal d64 from 2048 rows: level at 2048, -0.1 to -2 % at 8192, so 3 there).

    H200, with the peeled last key tile (``TileConfig.peel``), two runs of one build (2026-12-01 19:2x, 5 rounds, and
    19:4x, 11 rounds, random order; same-run ratios): at seq 8192 persistence +6-9 % (d64) and +5 % (d128) over one CTA
    per item (before the peel it had measured -8 to +2 %: the static round robin ends less evenly than the hardware's
    launch order); causal 8192 -7-10 % (d128), level (d64). Earlier runs (12:2x, 12:4x, 15:40), against one CTA per
    item: seq 512 d128 +10-11 % (causal +11-13 %), d64 +14 % (causal +25 %), seq 2048 level to +3 %; ping-pong over
    persistence alone: d64 causal +3-5 %; d128 at 2048 +1-7 %, at 512 -5, 0, -3, -2 and -1 % in five runs (up
    to 2026-12-01 22:4x: not taken there); 2 Q buffers over 1 for d64: +3-7 % at seq 512, at 2048 -1 to -5 % in
    four runs (1 there). The next item's first S carried (2026-12-04, eight runs, README): d64 causal at seq 512 +6
    to +11 % (0.84 -> 0.90-0.93 of cuDNN); without ping-pong -2-3 %; with one Q buffer (d128: two do not fit beside 3
    stages) -4 to -17 % at seq 512 (the next item's Q, loaded only once this item's last S is in, is then waited for
    before the epilogue instead of under it; but d128 with 2 stages and 2 Q buffers lost 6-11 % carried too); d64
    without a mask (3 warpgroups) -6 to -9 % at seq 512, -2 to +3 % longer. Below 4096 rows O is stored through
    shared memory with TMA (``TileConfig.tma_store``; rerun/attention-tma-store/, H200, 15 rounds, median of the
    per-round ratios against the stores from registers): seq 512 d64 +9 % (causal +6 %), d128 +2 % (causal +4 %),
    seq 2048 d64 level, d128 +2 %; at 8192 d64 -8 % (every round), d128 level; then in the benchmark on the H100,
    against the previous rule, twice: d128 seq 512 +13 % / +15 % (causal +19 % both times), d64 +4 % / +9 % (causal
    +9 % both), d128 seq 2048 +2 %, d64 seq 2048 -0.5 % / -0.8 % (not taken from 2048 rows for d64). With it, causal
    d128 at seq 2048 runs persistent too (rerun/attention-causal-persistent-tma/, H100, two runs, per-round ratios against the rule's one CTA
    per query tile: +3.5 %, +3.6 %; in 8 MB sections 0.77x; d64 level, so unchanged; at 8192 both 0.71-0.96x; without
    the TMA store it had lost, rejected/attention-causal2048-persistent/), and causal d128 in ping-pong since
    (rerun/attention-d128-tma-store-forms/, H100, two runs: seq 512 1.009x / 1.008x, 2048 1.041x / 1.021x; 2 stages,
    freeing room for O and a second Q, lost 15-26 %). The grid is the target's SM count
    (``common.sm_count``: a GPU with fewer SMs would run the surplus CTAs as a second wave). Causal: the L2 sections
    hold at most a quarter of the grid's items, so that a head's query tiles run within one round of the CTAs and
    each CTA's items cycle through the heavy and light ones; H100, two runs (rerun/attention-h100-lpt-sections/), d128
    at seq 512: sections of 8 pairs (32 items) +14 % over 128 pairs (the 32 MB sections before), 16 pairs +9 %, 32
    pairs (128 items: each CTA kept the same weight of item from section to section) -13 %. The CTAs deal the items
    in snake rounds (``TileConfig.snake``), not round robin (CTA c: items c, c + ctas, ...), whose share of heavy
    items depends on where the sections end (rerun/attention-snake/balance.py: d128 at seq 2048 in sections of 2
    pairs, the most a CTA computes 1.09x the mean round robin, 1.03x in snake rounds). H100, three runs
    (rerun/attention-snake/), per-round ratios against round robin, median: d128 causal 2048 1.061x / 1.063x /
    1.053x (0.97-0.99 -> 1.03 of cuDNN), causal 512 1.023x / 1.032x / 1.032x; d64 causal 512 0.997x / 1.030x /
    1.000x."""
    causal, d64 = spec.causal != "none", spec.head_dim <= 64
    if not cfg.tma or (causal and at_least(spec.seq_q, 2048 if d64 else 4096)):
        return cfg
    cfg = replace(cfg, persistent=sm_count(), stages=4 if d64 else cfg.stages)  # (d128: 3 stages fill the SM)
    if at_least(spec.seq_q, 4096):
        return replace(cfg, pingpong=False)
    cfg = replace(cfg, tma_store=not (d64 and at_least(spec.seq_q, 2048)))
    if causal:  # sections of at most a quarter of the grid's items (see below)
        pairs = max(1, cfg.persistent // 4 // -(-spec.seq_q // 128))  # (128-row query tiles: 2 warpgroups)
        heads = min(cfg.lpt_heads or pairs * spec.group, (1 << pairs.bit_length() - 1) * spec.group)
        return replace(cfg, warps=8, pingpong=True, q_bufs=2 if d64 else 1, carry=d64, lpt_heads=heads, snake=True)
    long = at_least(spec.seq_q, 2048)
    return replace(cfg, q_bufs=2 if d64 and not long else 1, pingpong=cfg.warps == 8 and long)


def choose(spec, wgmma: bool = False) -> TileConfig:
    """The tile configuration for ``spec``, from the tile sweeps on the H200 (the last whole one:
    benchmarks/results/rerun/attention-h200-previous-rule/attention-h200.json).

    wgmma (sm_90a) where it won: no causal mask and at least 512 query rows (or a symbolic count), or a causal mask
    and at least 2048 rows (head dims 64 and 128, with TMA: 512), causal launched in L2 sections (``lpt_section``),
    the TMA kernel persistent, causal below 2048 rows, d128 4096 (``persistent_launch``).
    - Head dims of 64 and 128 (``wgmma_config``): the TMA kernel, computing warpgroups of 128-key tiles in 3
      stages. H200, same run (2026-12-01 09:33), against the cp.async kernel below: d128 +16-19 % at seq 8192,
      +11-14 % at 2048, +3-6 % at 512; d64 +12-33 % at 8192, +6-20 % at 2048, -3 % at 512 without a mask (an earlier
      run, 2 computing warpgroups for d64 too: +6-14 % at seq >= 2048). d128 causal at seq 512: +6-20 % over
      mma.sync in two runs (d64 there: -10-13 %, until the persistent kernel: +3 %). d64 without a mask: 3 computing warpgroups
      +14-20 % over 2 at seq >= 2048 in two runs (their 160 registers hold 128-key tiles of d64). 2 stages ran 13-32 %
      slower. Causal, from 2048 rows, since the peeled last key tile (``TileConfig.peel``; two runs, 2026-12-01 19:2x
      and 19:4x): d64 in 3 computing warpgroups, +8 % at seq 2048 and +13 % at 8192 over 2 (before the peel, 3 lost
      5-25 %); d128's 2 in ping-pong (``pingpong``), +2-3 % at 2048 and +2-5 % at 8192 (before: -6 to +17 % across
      shapes and three runs, not taken).
    - Other head dims, the cp.async kernel (``cp_async_wgmma_config``): up to 4096 rows each warpgroup also stops
      at its own diagonal (``group_diag``; H200, two runs: +2-6 % at seq 2048; at 8192, where the diagonal is a
      smaller share, -2 % for d64 and -4 % / +1 % for d128, one warpgroup issuing all copies). 64-key tiles. 4
      warpgroups (256 query rows) per CTA for head_dim <= 64: their GEMMs cover each other's waits at the per-tile
      barrier (3 warpgroups of 128-key tiles, two runs: no mask -10 % / 0 % at seq 512, +0-2 % at 2048, +5-6 % at
      8192; causal -8-23 %). 3 for larger heads, whose 64-key tiles do not fit 4 warpgroups' 128 registers per
      thread (H200, two runs, tiles swizzled: +7-14 % at seq >= 2048 over 4 warpgroups of 32-key tiles).
    Shorter sequences lose to mma.sync (a tile of 128-256 rows is mostly padding, and fewer CTAs fill the GPU).
    mma.sync: head_dim <= 64 with a causal mask: 128-key tiles (one tile holds a 128-row query tile's diagonal;
    the 64-key tiles lost 6-14 % there). Otherwise 64-key tiles: for d64 without mask they need 168 registers,
    so 3 CTAs share an SM (+4 % at seq 512 and 8192 over 128-key tiles); for d128 128-key tiles do not fit the
    registers.
    """
    causal = spec.causal != "none"
    if wgmma and at_least(spec.seq_q, 2048 if causal and not wgmma_config(spec.head_dim).tma else 512):
        return wgmma_rule(spec)
    return TileConfig(bn=128 if spec.head_dim <= 64 and causal else 64)


def wgmma_rule(spec) -> TileConfig:
    """The wgmma kernel as ``choose`` takes it for long sequences, whatever ``spec``'s length (the benchmark and the
    tests check it on short ones too): causal in L2 sections, the TMA kernel persistent where that measured ahead."""
    causal = spec.causal != "none"
    cfg = wgmma_config(spec.head_dim, causal)
    return persistent_launch(causal_launch(cfg, spec) if causal else cfg, spec)


def flash_mma(spec, cfg: TileConfig = TileConfig()) -> tvm.tirx.PrimFunc:
    """The tensor-core flash-attention kernel (see the module docstring)."""
    return kernel_signature(spec, mma_body(spec, cfg))


def mma_body(spec, cfg: TileConfig):
    """The tensor-core kernel's body: a TVMScript macro ``(q, k, v, bias, out)``."""
    H, G, D, dtype = spec.heads, spec.group, spec.head_dim, spec.dtype
    batch, sq, skv = spec.batch, spec.seq_q, spec.seq_kv
    has_bias, causal = spec.bias_shape is not None, spec.causal != "none"
    offset = causal_offset(sq, skv, spec.causal)
    lpt = causal and cfg.lpt
    HG = cfg.lpt_heads
    grouped = lpt and HG > 0
    MT, stages = cfg.m_tiles, cfg.stages
    WS = cfg.tma  # warp-specialised: a producer warpgroup (the last) loads every tile with TMA
    WM, NC = 16 * MT, 32 * cfg.warps  # rows per warp, threads that compute
    NT = NC + 128 * WS  # threads
    BM, BN = WM * cfg.warps, cfg.bn
    WG, NW = cfg.wgmma, cfg.warps // 4  # wgmma; warpgroups that compute
    # Causal wgmma: each warpgroup runs its own number of key tiles, up to its rows' diagonal, instead of all up to
    # the query tile's (a dead warpgroup's wgmma take the tensor cores from the others). The tile barrier then
    # counts the warpgroups still at a tile, and the last warpgroup (which sees every tile) copies the K/V tiles.
    per_group = WG and causal and cfg.group_diag
    DP = D + 8  # padded smem row (elements): 16 B shift per row, no ldmatrix bank conflicts
    CPR = D // 8  # 16-byte chunks per row
    RS = D if WG else DP  # elements per tile row: wgmma's layouts need no padding
    SW = WG and cfg.swizzle and D % 64 == 0  # wgmma's 128-byte swizzled layout (rows of 64 elements)
    PC, QB = cfg.persistent, cfg.q_bufs  # persistent CTAs (0: one per work item), Q buffers
    PS = PC > 0
    PEEL = WS and cfg.peel  # (see TileConfig.peel)
    CARRY = PS and PEEL and cfg.carry  # (see TileConfig.carry)
    TS = PS and PEEL and cfg.tma_store  # (see TileConfig.tma_store)
    Q_OFF, K_OFF = 0, QB * BM * RS  # in one shared buffer (elements): Q buffers, K stages, V stages
    V_OFF = K_OFF + stages * BN * RS
    SMEM = max(V_OFF + stages * BN * RS, BM * DP)  # the epilogue stages O in padded rows (not persistent)
    # ``TS``: O staged in a buffer of its own after the V stages where the SM has room for it (OWN), else in the K tile
    # of the item's last K/V stage
    O_OFF = V_OFF + stages * BN * RS
    OWN = TS and (O_OFF + BM * D + 4 * (2 * stages + 2 * QB)) * 2 <= SMEM_BYTES
    SMEM = O_OFF + BM * D if OWN else SMEM
    # TMA's mbarriers after the tiles: full[stages] (tile in), empty[stages] (tile consumed), Q full[QB], Q empty[QB]
    FULL, EMPTY, Q_FULL, Q_EMPTY = 0, stages, 2 * stages, 2 * stages + QB
    SMEM_ALLOC = SMEM + 4 * (2 * stages + 2 * QB) * WS
    min_blocks = 1 if WS else cfg.min_blocks
    EVEN_REGS, CONSUMER_REGS, PRODUCER_REGS = register_split(NT, NW)  # (setmaxnreg)
    KS, NS, ND = D // 16, BN // 8, D // 8  # k-steps of Q·Kᵀ, n-tiles of S, n-tiles of O
    QF = MT * KS * 8 if cfg.q_in_regs else MT * 8  # Q fragment registers (halves)
    nq = (sq + BM - 1) // BM
    # (see TileConfig.end_aligned; a length that is a multiple of the tile gives the same tiles either way)
    ALIGN = causal and cfg.end_aligned and not (isinstance(sq, int) and sq % BM == 0)
    items = nq * H * batch  # work items: (query tile, head, batch)
    ctas = min(PC, items) if isinstance(items, int) else PC  # persistent grid
    idx = "int32" if isinstance(items, int) else str(items.ty.dtype)
    # scores go to the exp2 domain with one FMA: p = exp2(s * c - m), c = scale * log2(e); with a bias
    # the logits are formed in natural units first (c would overflow a -FLT_MAX mask to -inf)
    fold = spec.scale > 0 and not has_bias
    exp2 = ex2 if cfg.ftz_exp else T.exp2
    c2 = spec.scale * LOG2E
    f32, neg_inf = "float32", T.float32("-inf")
    shfl = warp_shuffle_xor

    assert not cfg.pingpong or cfg.warps % 2 == 0, "ping-pong needs two equal warp groups"
    assert not WG or (MT == 1 and cfg.warps % 4 == 0 and not cfg.q_in_regs and BN <= 256), "wgmma: whole warpgroups, m64"
    assert not WG or stages == 3 or WS, "wgmma pipeline: a ring of 3 K/V stages (see tile_wgmma)"
    assert not (WG and cfg.pingpong) or (WS and NW == 2), "wgmma ping-pong: 2 computing warpgroups and a producer"
    assert not SW or (K_OFF * 2 % 1024, BN * RS * 2 % 1024) == (0, 0), "swizzled tiles start 1024-byte aligned"
    assert not WS or (SW and not per_group and stages >= 2), "TMA: swizzled wgmma tiles, one diagonal per CTA"
    assert not (PC or QB > 1) or (WS and QB in (1, 2)), "persistent CTAs: the TMA kernel, 1 or 2 Q buffers"
    assert not cfg.carry or CARRY, "the next item's first S carried: a persistent kernel, its last tile peeled"
    assert not cfg.snake or (PS and isinstance(items, int)), "snake rounds: a persistent kernel over a known item count"
    assert not cfg.tma_store or (TS and (OWN or BM <= BN)), "O stored with TMA: persistent, peeled, O fits a buffer"
    assert not cfg.end_aligned or WS, "query tiles aligned to the end: TMA (cp.async takes no rows before the sequence)"
    assert SMEM_ALLOC * 2 <= SMEM_BYTES, f"{cfg.name}: {SMEM_ALLOC * 2} bytes of shared memory, more than an SM has"

    def at(base, r, col, rows):
        """Element offset of row ``r``, column ``col`` (a multiple of 8 for wgmma) of the ``rows``-row tile at ``base``.

        Q and K are read by wgmma K-major (rows = M / N), V MN-major (rows = K).
        - ``SW``: 128-byte swizzle. Each 64 columns form a block of 128-byte rows (``rows`` x 64 elements), and the
          16-byte chunk c of row r sits at chunk c ^ (r % 8) of its row, which is what wgmma undoes (from address
          bits 7-9: tiles start 1024-byte aligned). A row's 128 contiguous bytes of global memory, copied by 8
          neighbouring lanes, then fill 8 different bank groups: one store wavefront, and whole 128-byte lines read.
          Descriptors: 8-row groups 1024 B apart (SBO); V's 64-column blocks rows * 128 B apart (LBO).
        - Otherwise, no swizzle: 8 x 8 core matrices of 128 contiguous bytes, core matrix (r // 8, col // 8) of a
          row band at ((r // 8) * CPR + col // 8) * 64, so both descriptors' strides are constants: 128 B to the next
          8 columns, 16 * D B to the next 8 rows. (8 lanes fill one core matrix: 8 rows' 16 bytes each.)
        - mma.sync: padded rows.
        """
        if SW:
            return base + col // 64 * (rows * 64) + r * 64 + (col % 64 // 8 ^ r % 8) * 8 + col % 8
        return base + (r // 8 * CPR + col // 8) * 64 + r % 8 * 8 + col % 8 if WG else base + r * DP + col

    def tile_start(bx):  # causal: the heaviest query tiles first (``ALIGN``: the last ends at the sequence's end)
        if ALIGN:
            return sq - (bx + 1) * BM
        return (nq - 1 - bx) * BM if causal else bx * BM

    def in_seq(row):  # a query row of the sequence (``ALIGN``: the first tile starts before it)
        return T.And(row >= 0, row < sq) if ALIGN else row < sq

    def kv_limit(q0):  # keys past this are masked for every row of the tile
        return T.min(skv, T.min(q0 + BM, sq) + offset) if causal else skv

    def kv_tiles(q0):  # key tiles the query tile computes
        return (kv_limit(q0) + BN - 1) // BN

    def group_tiles(q0, w):  # causal wgmma: key tiles warpgroup w computes (>= 1, up to its last row's diagonal)
        return T.min(kv_tiles(q0), T.max(1, (q0 + w * 64 + 63 + offset) // BN + 1))

    def groups_at(q0, j):  # warpgroups with at least j key tiles
        return sum(T.Cast("int32", group_tiles(q0, w) >= j) for w in range(NW))

    def plain_tiles(q0):  # leading key tiles inside the sequence that every row of the query tile sees whole
        return T.min(skv // BN, (q0 + offset + 1) // BN) if causal else skv // BN

    def exp_units(x, base):  # exp(logit - max) for a logit and max in the units the running max is kept in
        return exp2((x - base) * T.float32(LOG2E)) if has_bias else exp2(x - base)

    def prob(s, base):  # the softmax numerator of score accumulator s
        return exp2(s * T.float32(c2) - base) if fold else exp_units(s, base)

    def q_frag(mt, kk):  # offset of Q's A fragment (m-tile mt, k-step kk) in qf
        return (mt * KS + kk) * 8 if cfg.q_in_regs else mt * 8

    def ring(i, n):  # buffer and mbarrier phase parity of the i-th fill of a ring of n buffers
        return i % n, i // n % 2

    def work_item(w):
        """(query tile, head, batch) of work item ``w``, in launch order: LPT within sections of HG (batch, head)
        pairs, section after section (FA3's tile scheduler); else, causal, query tiles slowest (the whole grid runs the
        heaviest tiles first); else query tiles fastest (CTAs running together share their K/V in L2)."""
        if grouped:
            pairs = batch * H
            sec = w // (HG * nq)
            width = T.if_then_else(sec < pairs // HG, HG, pairs % HG)  # the last section may be narrower
            pair = sec * HG + w % (HG * nq) % width
            return w % (HG * nq) // width, pair % H, pair // H
        if lpt:
            return w // (H * batch), w % H, w // H % batch
        return w % nq, w // nq % H, w // (nq * H)

    def cta_items(cta):  # persistent: work items of CTA ``cta`` (items cta, cta + ctas, ...; ``snake``: see cta_item)
        if not cfg.snake:
            return (items - cta + ctas - 1) // ctas
        rounds, rest = divmod(items, ctas)  # the last round's ``rest`` items go to its first (or last) CTAs
        return rounds + T.Cast(idx, cta < rest if rounds % 2 == 0 else cta >= ctas - rest)

    def cta_item(cta, it):  # persistent: CTA ``cta``'s item ``it``
        if not cfg.snake:
            return cta + it * ctas
        return it * ctas + T.if_then_else(it % 2 == 0, cta, ctas - 1 - cta)

    def persistent_or(value, plain):  # (a conditional the macros evaluate in Python)
        return value if PS else plain

    load_rows = row_copier(CPR, at, WG and not SW)
    ldmatrix, mma = mma_ops(dtype)

    @T.macro
    def load_q(qf, smem, warp, lane, mt, kk):  # A fragment rows (lane % 16), cols kk*16 + (lane / 16) * 8
        ldmatrix(False, qf, q_frag(mt, kk), smem, Q_OFF + (warp * WM + mt * 16 + lane % 16) * DP + kk * 16 + lane // 16 * 8)

    def mbar(sbase, i):
        """Shared-window address of TMA mbarrier ``i`` (``SMEM_ALLOC``: full[stages], empty[stages], Q's)."""
        return sbase[0] + T.Cast("uint32", SMEM * 2 + i * 8)

    def desc(sbase, off, lbo, sbo):  # of the tile at element ``off`` (``at``'s layout)
        return wgmma_desc(sbase, off, lbo, sbo, SW)

    wab = {"float16": "f16", "bfloat16": "bf16"}[dtype]
    # descriptor strides (LBO, SBO) in bytes, see ``at`` (K-major swizzled: LBO unused)
    k_major, mn_major = ((16, 1024), (BN * 128, 1024)) if SW else ((128, 16 * D), (16 * D, 128))
    wgmma = f"wgmma.mma_async.sync.aligned.m64n{{}}k16.f32.{wab}.{wab}"

    @T.macro
    def attend(smem, q, k, v, bias, out, bx0, h0, b0, tx, maps):
        """One CTA: work item (bx0, h0, b0), or persistent, the items of CTA bx0 (``cta_item``)"""
        qf = T.alloc_buffer((QF,), dtype, scope="local")
        kf = T.alloc_buffer((8,), dtype, scope="local")
        vf = T.alloc_buffer((8,), dtype, scope="local")
        sacc = T.alloc_buffer((MT * NS * 4,), f32, scope="local")
        pf = T.alloc_buffer((MT * NS * 4,), dtype, scope="local")
        pw = T.decl_buffer((MT * NS * 2,), "uint32", data=pf.data, scope="local")  # P's fragments as wgmma's A registers
        sbase = T.alloc_buffer((1,), "uint32", scope="local")  # the shared buffer's shared-window address
        done = T.alloc_buffer((1,), "uint32", scope="local")  # TMA: an mbarrier phase completed
        oacc = T.alloc_buffer((MT * ND * 4,), f32, scope="local")
        # per row held by this thread (m-tile mt, row g + r*8 at index mt*2 + r): running max and sum; the
        # tile's max, sum, rescale factor and exponent base
        m = T.alloc_buffer((MT * 2,), f32, scope="local")
        lsum = T.alloc_buffer((MT * 2,), f32, scope="local")
        mx = T.alloc_buffer((MT * 2,), f32, scope="local")
        rs = T.alloc_buffer((MT * 2,), f32, scope="local")
        al = T.alloc_buffer((MT * 2,), f32, scope="local")
        bs = T.alloc_buffer((MT * 2,), f32, scope="local")
        # persistent: the work item (query tile, head, batch, this CTA's count of items before it), and the K/V
        # tiles the ring took before it
        work = T.alloc_buffer((4,), idx, scope="local")
        fills = T.alloc_buffer((1,), idx, scope="local")
        bx = T.meta_var(persistent_or(work[0], bx0))
        h = T.meta_var(persistent_or(work[1], h0))
        b = T.meta_var(persistent_or(work[2], b0))
        qi = T.meta_var(persistent_or(work[3], 0))  # Q's fill of its ring of QB buffers
        kv0 = T.meta_var(persistent_or(fills[0], 0))  # K/V tile j is the ring's fill kv0 + j
        q_off = T.meta_var(Q_OFF + ring(qi, QB)[0] * (BM * RS))
        warp = T.meta_var(tx // 32)
        lane = T.meta_var(tx % 32)
        g = T.meta_var(lane // 4)
        t4 = T.meta_var(lane % 4)
        q0 = T.meta_var(tile_start(bx))
        hk = T.meta_var(h // G)
        n_kv = T.meta_var(kv_tiles(q0))
        if WG:
            sbase[0] = T.cuda.cvta_generic_to_shared(smem.access_ptr("r"))
        if not WS:
            load_rows(smem, Q_OFF, q, b, q0, sq, h, BM, tx, NT)
            for p in T.unroll(stages - 1):  # prologue: tiles 0 .. stages-2 in flight, one commit group each
                if p < n_kv:
                    load_rows(smem, K_OFF + p * (BN * RS), k, b, p * BN, skv, hk, BN, tx, NT)
                    load_rows(smem, V_OFF + p * (BN * RS), v, b, p * BN, skv, hk, BN, tx, NT)
                T.ptx.cp.async_.commit_group()

        @T.inline
        def init_acc():
            for i in T.unroll(MT * ND * 4):
                oacc[i] = T.float32(0)
            for i in T.unroll(MT * 2):
                m[i] = neg_inf
                lsum[i] = T.float32(0)

        if PS:
            fills[0] = T.Cast(idx, 0)
        else:
            init_acc()

        @T.inline
        def my_turn():  # ping-pong: wait until the other warp group has issued its GEMM (named barrier 1 + group)
            if cfg.pingpong:
                T.ptx["bar.sync"](T.Cast("uint32", 1 + warp // (cfg.warps // 2)), T.uint32(NC))

        @T.inline
        def your_turn():  # ping-pong: this group's GEMM is issued, the other group's may start
            if cfg.pingpong:
                T.ptx["bar.arrive"](T.Cast("uint32", 2 - warp // (cfg.warps // 2)), T.uint32(NC))

        @T.inline
        def qk_wgmma(stage, qo):
            """Issue S = Q Kᵀ into sacc for Q at ``qo`` and the key tile in smem stage ``stage`` (asynchronous: one
            commit group): one wgmma.m64nBN per 16 columns of d, this warpgroup's 64 query rows against all BN keys,
            both from shared memory (K-major). The pins keep other uses of the registers out of the wgmma's span."""
            pin(sacc, NS * 4, "float")
            # Causal: Q's descriptors recomputed here. Hoisted out of the loop (8 registers), two were spilled and
            # reloaded every tile: causal d64 ran 16-18 % slower than a build that happened not to spill (H200;
            # long-scoreboard stalls 0.1 -> 2.1 per instruction).
            if causal:
                pin(sbase, 1, "uint")
            T.ptx["wgmma.fence.sync.aligned"]()
            for kk in T.unroll(KS):
                T.ptx[wgmma.format(BN)](
                    *[sacc[i] for i in range(NS * 4)],
                    desc(sbase[0], at(qo, warp // 4 * 64, kk * 16, BM), *k_major),
                    desc(sbase[0], at(K_OFF + stage, 0, kk * 16, BN), *k_major),
                    kk > 0, 1, 1, 0, 0)
            T.ptx["wgmma.commit_group.sync.aligned"]()
            pin(sacc, NS * 4, "float")

        @T.inline
        def pv_wgmma(stage):
            """Issue O += P V (one commit group): one wgmma.m64nD per 16 keys, P from registers (the S
            accumulators' layout is wgmma's A fragment layout too), V from shared memory read MN-major
            (transposed B: LBO steps keys, SBO steps d)."""
            pin(oacc, ND * 4, "float")
            pin(pw, NS * 2, "uint")
            T.ptx["wgmma.fence.sync.aligned"]()
            for kk in T.unroll(BN // 16):
                T.ptx[wgmma.format(D)](
                    *[oacc[i] for i in range(ND * 4)], pw[kk * 4], pw[kk * 4 + 1], pw[kk * 4 + 2], pw[kk * 4 + 3],
                    desc(sbase[0], at(V_OFF + stage, kk * 16, 0, BN), *mn_major), True, 1, 1, 1)
            T.ptx["wgmma.commit_group.sync.aligned"]()
            pin(oacc, ND * 4, "float")
            pin(pw, NS * 2, "uint")

        @T.inline
        def bar_wait(i, phase):
            """Wait until mbarrier i has completed the phase of parity ``phase``."""
            mbarrier_wait(done, mbar(sbase, i), phase)

        @T.inline
        def tma(tmap, off, rows, row0, head, i):
            """TMA: rows row0.. of ``head`` (zero past the end) -> the ``rows``-row tile at ``off`` (``at``'s swizzled
            layout: one box per 64 columns), completing on mbarrier i."""
            for cb in T.unroll(D // 64):
                T.ptx.cp(sbase[0] + T.Cast("uint32", (off + cb * (rows * 64)) * 2),  # at(off, 0, cb * 64, rows)
                         T.reinterpret(T.handle().ty, T.address_of(tmap)),
                         *[T.Cast("int32", c) for c in (cb * 64, head, row0, b)],  # (int64 for symbolic lengths)
                         mbar(sbase, i),
                         "async", "bulk", "tensor", "4d", "shared::cluster", "global", "",
                         "mbarrier::complete_tx::bytes", "", "", "", "")

        @T.inline
        def load_kv(j):
            """TMA: key tile j into its stage, once every computing warp has released it (its last P·V done)."""
            s, ph = T.meta_var(ring(kv0 + j, stages))
            if kv0 + j >= stages:
                bar_wait(EMPTY + s, 1 - ph)
            T.ptx["mbarrier.arrive.expect_tx.shared::cta.b64"](mbar(sbase, FULL + s), T.uint32(2 * BN * D * 2))
            tma(maps[1], K_OFF + s * (BN * RS), BN, j * BN, hk, FULL + s)
            tma(maps[2], V_OFF + s * (BN * RS), BN, j * BN, hk, FULL + s)

        @T.inline
        def produce():
            """One work item's loads, by the producer's first thread: key tile 0, Q once its buffer is released
            (persistent: the previous item's in it), the other key tiles."""
            load_kv(0)  # (every query tile has key tiles: every row sees key 0)
            s, ph = T.meta_var(ring(qi, QB))
            if qi >= QB:
                bar_wait(Q_EMPTY + s, 1 - ph)
            T.ptx["mbarrier.arrive.expect_tx.shared::cta.b64"](mbar(sbase, Q_FULL + s), T.uint32(BM * D * 2))
            tma(maps[0], q_off, BM, q0, h, Q_FULL + s)
            for j in T.serial(1, n_kv):
                load_kv(j)

        @T.inline
        def arrived(pending, j=None):
            """All but the newest ``pending`` copy groups are in shared memory, for wgmma too, for every thread (of
            the warpgroups at key tile ``j`` or past their last one before it, ``per_group``)."""
            T.ptx.cp.async_.wait_group(pending)
            T.ptx["fence.proxy.async.shared::cta"]()  # cp.async wrote through the generic proxy, wgmma reads async
            if per_group and j is not None:
                tile_barrier(j)
            else:
                T.tvm_storage_sync("shared")

        @T.inline
        def tile_barrier(j):
            """Named barrier 1 over the warpgroups with at least ``j`` key tiles: those about to compute tile j, and
            those that stopped at it (their last P·V has read its stage, which is refilled from now on)."""
            T.ptx["bar.sync"](T.uint32(1), T.Cast("uint32", 128 * groups_at(q0, j)))

        @T.inline
        def scores(j, n_plain):
            """Softmax of tile j's scores in sacc (masked from tile ``n_plain`` on). (A warpgroup whose rows all
            end before the tile gets P = 0 from the mask; a branch that set it directly instead cost registers,
            spills under 3-4 warpgroups, and 3-25 % on causal shapes.)"""
            if j < n_plain:
                softmax(j * BN, False)
            else:
                softmax(j * BN, True)

        @T.inline
        def tile_wgmma(j, n_plain):
            """Key tile j on wgmma, FlashAttention-3's in-warpgroup pipeline over a ring of K/V stages. On entry P of
            tile j is in pf and O holds tiles < j. S of tile j+1 is issued, O rescaled under it, P·V of tile j
            issued; once S is in, tile j+1's softmax runs under P·V; tile j+2 streams in meanwhile (cp.async, 3
            stages; TMA: as the producer gets each stage back)."""
            nxt, cur = T.meta_var((ring(kv0 + j + 1, stages), ring(kv0 + j, stages)))
            if WS:  # tile j+1 is in (TMA); the producer refills stages as they are released
                if j + 1 < n_kv:
                    bar_wait(FULL + nxt[0], nxt[1])
            else:
                # tile j+1 (the newest copy group) is in for every thread; every warpgroup is done with tile j-1,
                # whose stage is refilled
                arrived(0, j)
                # copied by every thread, or per_group by the last warpgroup, the one that sees every tile
                copier = T.meta_var(warp // 4 == NW - 1 if per_group else True)
                ctx, cnt = T.meta_var((tx % 128, 128) if per_group else (tx, NT))
                if j + 2 < n_kv:  # (issued behind the GEMMs instead, the copies delayed the softmax: -5 %)
                    if copier:
                        load_rows(smem, K_OFF + (j + 2) % stages * (BN * RS), k, b, (j + 2) * BN, skv, hk, BN, ctx, cnt)
                        load_rows(smem, V_OFF + (j + 2) % stages * (BN * RS), v, b, (j + 2) * BN, skv, hk, BN, ctx, cnt)
                T.ptx.cp.async_.commit_group()
            # The wgmma are issued and waited on every path (without ``PEEL``, after the last tile, S of a stale stage
            # is computed and dropped; a warpgroup whose rows end before a tile takes P = 0): ptxas tracks the
            # in-flight groups per path and serialises every wgmma of the kernel if a branch leaves it unsure
            my_turn()  # ping-pong (FA3): both GEMMs issued in this warpgroup's turn, its softmax under the other's
            qk_wgmma(nxt[0] * (BN * RS), q_off)
            rescale_o()
            pv_wgmma(cur[0] * (BN * RS))
            your_turn()
            T.ptx["wgmma.wait_group.sync.aligned"](1)  # groups retire in order: S is in, P·V may run on
            pin(sacc, NS * 4, "float")
            if PEEL and PS:
                if j + 2 == n_kv:  # the item's last S is in: Q's buffer may take the next item's
                    release_q()
            if j + 1 < n_kv:
                scores(j + 1, n_plain)
            T.ptx["wgmma.wait_group.sync.aligned"](0)
            pin(oacc, ND * 4, "float")
            pin(pw, NS * 2, "uint")
            if WS:  # this warp's P·V of tile j is done: its stage may be refilled
                release_stage(cur[0])
            if j + 1 < n_kv:
                to_p()

        @T.inline
        def first_s(qi_, fill, real):
            """TMA: issue the first S of the item whose Q is the Q ring's fill ``qi_`` and whose first key tile is the
            K/V ring's fill ``fill``, once both are in. Not ``real`` (past the CTA's last item, ``CARRY``): waits for
            nothing and computes a dropped S of whatever the buffers hold, as every path issues the same wgmma."""
            qb, kb = T.meta_var((ring(qi_, QB), ring(fill, stages)))
            if real:
                bar_wait(Q_FULL + qb[0], qb[1])
                bar_wait(FULL + kb[0], kb[1])
            qk_wgmma(kb[0] * (BN * RS), Q_OFF + qb[0] * (BM * RS))

        @T.inline
        def last_tile(j):
            """Key tile j, the item's last (``PEEL``): O rescaled and P·V (``CARRY``: then the next item's first S, right
            behind it)."""
            cur = T.meta_var(ring(kv0 + j, stages))
            my_turn()
            rescale_o()
            pv_wgmma(cur[0] * (BN * RS))
            if CARRY:
                first_s(qi + 1, kv0 + n_kv, qi + 1 < cta_items(bx0))
            your_turn()
            T.ptx["wgmma.wait_group.sync.aligned"](1 if CARRY else 0)  # (groups retire in order: P·V is done)
            pin(oacc, ND * 4, "float")
            pin(pw, NS * 2, "uint")
            if not TS or OWN:  # (else once O, staged in it, is stored)
                release_stage(cur[0])

        @T.inline
        def tma_store_wait():  # ``TS``: this thread's TMA stores have read their shared memory
            T.evaluate(T.cuda.func_call("tvmpipe_tma_store_wait", source_code=STORE_SRC["tma_wait"]))

        @T.inline
        def release_stage(s):  # TMA: this warp is done with K/V stage s
            if lane == 0:
                T.ptx["mbarrier.arrive.shared::cta.b64"](mbar(sbase, EMPTY + s))

        @T.inline
        def release_q():  # persistent: this warp is done with the item's Q buffer
            if lane == 0:
                T.ptx["mbarrier.arrive.shared::cta.b64"](mbar(sbase, Q_EMPTY + ring(qi, QB)[0]))

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
                                                          + spec.bias_at(bias, b, h, T.max(row, 0) if ALIGN else row,
                                                                         key), neg_inf)
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
                        if not WG:  # wgmma: O may be in flight; rescale_o applies al later
                            rescale_row(mt, r)
                        lsum[i] = lsum[i] * al[i]
                    m[i] = mx[i]
                    rs[i] = T.float32(0)
                    for n in T.unroll(NS):
                        for e in T.unroll(2):
                            x = T.meta_var(sacc[(mt * NS + n) * 4 + r * 2 + e])
                            sacc[(mt * NS + n) * 4 + r * 2 + e] = prob(x, bs[i])
                            rs[i] = rs[i] + sacc[(mt * NS + n) * 4 + r * 2 + e]
                    lsum[i] = lsum[i] + rs[i]
            if not WG:  # wgmma: P·V of the previous tile may still read pf; to_p converts later
                to_p()

        @T.inline
        def to_p():
            for i in T.unroll(MT * NS * 4):
                pf[i] = T.Cast(dtype, sacc[i])

        @T.inline
        def rescale_row(mt, r):
            """O *= al for this thread's row r of m-tile mt."""
            for d in T.unroll(ND):
                for e in T.unroll(2):
                    oacc[(mt * ND + d) * 4 + r * 2 + e] = oacc[(mt * ND + d) * 4 + r * 2 + e] * al[mt * 2 + r]

        @T.inline
        def rescale_o():
            """O *= al per row (wgmma, one m-tile: deferred from the softmax until O's P·V is done)."""
            for r in T.unroll(2):
                if al[r] != T.float32(1):
                    rescale_row(0, r)

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
            stage = T.meta_var(j % stages * (BN * RS))
            if j + stages - 1 < n_kv:  # into the stage read in iteration j-1 (all warps past its end barrier)
                nxt = T.meta_var((j + stages - 1) % stages * (BN * RS))
                load_rows(smem, K_OFF + nxt, k, b, k0 + (stages - 1) * BN, skv, hk, BN, tx, NT)
                load_rows(smem, V_OFF + nxt, v, b, k0 + (stages - 1) * BN, skv, hk, BN, tx, NT)
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

        @T.inline
        def first_turn():  # ping-pong: group 0 has the first turn
            if cfg.pingpong:
                if warp >= cfg.warps // 2:
                    T.ptx["bar.arrive"](T.uint32(1), T.uint32(NC))

        @T.inline
        def last_turn():  # ping-pong: group 0 takes group 1's last hand-over, so every arrival is matched
            if cfg.pingpong:
                if warp < cfg.warps // 2:
                    T.ptx["bar.sync"](T.uint32(1), T.uint32(NC))

        @T.inline
        def compute():
            """One work item's key tiles (persistent: the turns of the ping-pong run on across items; taken per item,
            group 1 could hand over twice before group 0 took the first: a hang)."""
            if not PS:
                first_turn()
            if WG:  # P of the first tile, then the pipeline
                if WS:
                    if not CARRY:  # (carried: issued before the item, see last_tile)
                        first_s(qi, kv0, True)
                else:
                    arrived(1)
                    qk_wgmma(ring(kv0, stages)[0] * (BN * RS), q_off)
                T.ptx["wgmma.wait_group.sync.aligned"](0)
                pin(sacc, NS * 4, "float")
                if PEEL and PS:
                    if n_kv == 1:
                        release_q()
                softmax(0, True)
                to_p()
                n_plain = T.meta_var(0 if has_bias else T.min(n_kv, plain_tiles(q0)))
                mine = T.meta_var(group_tiles(q0, warp // 4) if per_group else n_kv)
                for j in T.serial(mine - PEEL):
                    tile_wgmma(j, n_plain)
                if PEEL:
                    last_tile(mine - 1)
                if per_group:
                    if mine < n_kv:  # its copies are in, and its last P·V has read its stage
                        arrived(0, mine)
            elif has_bias:  # every score takes its bias: one loop
                for j in T.serial(n_kv):
                    tile(j, True)
            else:  # first the tiles inside the sequence and wholly below the causal diagonal, unmasked; then the rest
                n_plain = T.meta_var(T.min(n_kv, plain_tiles(q0)))
                for j in T.serial(n_plain):
                    tile(j, False)
                for j in T.serial(n_plain, n_kv):
                    tile(j, True)
            if not PS:
                last_turn()

        @T.inline
        def row_sums():
            """lsum = 1 / the row sums (0/0 = NaN for a fully masked row, as the unfused softmax)."""
            for i in T.unroll(MT * 2):
                lsum[i] = lsum[i] + shfl(lsum[i], 1)
                lsum[i] = lsum[i] + shfl(lsum[i], 2)
                lsum[i] = T.float32(1) / lsum[i]

        @T.inline
        def store_o():
            """Persistent (wgmma): O / rowsum from the accumulators straight to memory, 2 elements a store (shared
            memory may already hold the next item's tiles), or ``TS`` through the item's last K/V stage."""
            row_sums()
            if TS:
                # (``ALIGN``: a warpgroup whose rows start before the sequence stores from registers: a TMA store at a
                # negative row is an illegal instruction, H100; loads take them, zero-filled)
                if not ALIGN or q0 + warp // 4 * 64 >= 0:
                    store_o_tma()
                else:
                    store_o_direct()
                    if not OWN:
                        release_stage(ring(kv0 + n_kv - 1, stages)[0])
            else:
                store_o_direct()

        @T.inline
        def store_o_tma():
            """O / rowsum staged in shared memory in the 128-byte swizzle (``at``, 64 rows: warpgroup w's rows), 4 8x8
            matrices a ``stmatrix``, then stored by one thread per warpgroup with TMA (rows past the sequence clipped by
            the tensor map). In a buffer of its own (``OWN``), once the warpgroup's previous store has read it; else in
            the K tile of the item's last K/V stage, once every computing warp's last S is in (their release of Q, whose
            phase has mostly completed by then: no warpgroup waits for another's P·V), the stage going back to the
            producer once TMA has read it."""
            wg = T.meta_var(warp // 4)
            s = T.meta_var(ring(kv0 + n_kv - 1, stages)[0])
            base = T.meta_var((O_OFF if OWN else K_OFF + s * (BN * RS)) + wg * (64 * D))
            if OWN:
                if tx % 128 == 0:
                    tma_store_wait()
                T.ptx["bar.sync"](T.Cast("uint32", 5 + wg), T.uint32(128))
            else:
                bar_wait(Q_EMPTY + ring(qi, QB)[0], ring(qi, QB)[1])
            for dd in T.unroll(ND // 2):  # matrix i = lane / 8: rows + i % 2 * 8, columns of n-tile 2 dd + i / 2
                row = T.meta_var(warp % 4 * 16 + lane % 8 + lane // 8 % 2 * 8)
                col = T.meta_var((dd * 2 + lane // 16) * 8)
                T.evaluate(T.cuda.func_call(
                    f"tvmpipe_stmatrix_{wab}", sbase[0] + T.Cast("uint32", at(base, row, col, 64) * 2),
                    *[oacc[(dd * 2 + i // 2) * 4 + i % 2 * 2 + e] * lsum[i % 2] for i in range(4) for e in range(2)],
                    source_code=STORE_SRC[wab]))
            T.ptx["fence.proxy.async.shared::cta"]()  # (generic-proxy writes, read by TMA)
            T.ptx["bar.sync"](T.Cast("uint32", 5 + wg), T.uint32(128))
            if tx % 128 == 0:
                for cb in T.unroll(D // 64):
                    T.evaluate(T.cuda.func_call(
                        "tvmpipe_tma_store", T.reinterpret(T.handle().ty, T.address_of(maps[3])),
                        sbase[0] + T.Cast("uint32", (base + cb * (64 * 64)) * 2),
                        *[T.Cast("int32", c) for c in (cb * 64, h, q0 + wg * 64, b)], source_code=STORE_SRC["tma"]))
                T.evaluate(T.cuda.func_call("tvmpipe_tma_store_commit", source_code=STORE_SRC["tma_commit"]))
                if not OWN:
                    tma_store_wait()
            if not OWN:
                release_stage(s)

        @T.inline
        def store_o_direct():
            for d in T.unroll(ND):
                for r in T.unroll(2):
                    row = T.meta_var(q0 + warp * WM + g + r * 8)
                    if in_seq(row):
                        for e in T.vectorized(2):
                            out[b, row, h, d * 8 + t4 * 2 + e] = T.Cast(dtype, oacc[d * 4 + r * 2 + e] * lsum[r])

        @T.inline
        def set_work(it):
            """Persistent: this CTA's item ``it``."""
            w = T.meta_var(work_item(cta_item(bx0, it)))
            work[0] = T.Cast(idx, w[0])
            work[1] = T.Cast(idx, w[1])
            work[2] = T.Cast(idx, w[2])
            work[3] = T.Cast(idx, it)

        @T.inline
        def epilogue():
            T.ptx.cp.async_.wait_group(0)
            if WG:  # the staging below overwrites other warps' Q rows (the padded layout differs from wgmma's)
                T.tvm_storage_sync("shared")
            # epilogue: O / rowsum staged through this warp's own Q rows in shared memory, then 16-byte coalesced
            # stores
            row_sums()
            if not WS or warp < cfg.warps:  # (not the producer warps)
                for mt in T.unroll(MT):
                    for d in T.unroll(ND):
                        for c in T.unroll(4):
                            smem[Q_OFF + (warp * WM + mt * 16 + g + c // 2 * 8) * DP + d * 8 + t4 * 2 + c % 2] = T.Cast(
                                dtype, oacc[(mt * ND + d) * 4 + c] * lsum[mt * 2 + c // 2]
                            )
            T.tvm_storage_sync("shared")
            for it in T.unroll((BM * CPR + NT - 1) // NT):
                cid = T.meta_var(it * NT + tx)
                r = T.meta_var(cid // CPR)
                col = T.meta_var(cid % CPR * 8)
                if in_seq(q0 + r) and ((it + 1) * NT <= BM * CPR or cid < BM * CPR):
                    for e in T.vectorized(8):
                        out[b, q0 + r, h, col + e] = smem[Q_OFF + r * DP + col + e]

        if WS:  # warp-specialised: the last warpgroup loads, the others compute with its registers
            # mbarriers: full[s] waits for one arrival (the producer's) and the tile's bytes, empty[s] for every
            # computing warp; Q's full and empty likewise
            if tx == 0:
                for i in T.unroll(stages):
                    T.ptx["mbarrier.init.shared::cta.b64"](mbar(sbase, FULL + i), T.uint32(1))
                    T.ptx["mbarrier.init.shared::cta.b64"](mbar(sbase, EMPTY + i), T.uint32(cfg.warps))
                for i in T.unroll(QB):
                    T.ptx["mbarrier.init.shared::cta.b64"](mbar(sbase, Q_FULL + i), T.uint32(1))
                    T.ptx["mbarrier.init.shared::cta.b64"](mbar(sbase, Q_EMPTY + i), T.uint32(cfg.warps))
                T.ptx["fence.mbarrier_init.release.cluster"]()
            T.tvm_storage_sync("shared")
            if warp // 4 == NW:
                T.ptx["setmaxnreg.dec.sync.aligned.u32"](PRODUCER_REGS)
                if tx == NC:
                    if PS:
                        for it in T.serial(cta_items(bx0)):
                            set_work(it)
                            produce()
                            fills[0] = fills[0] + n_kv
                    else:
                        produce()
                T.ptx["bar.sync"](T.uint32(3), T.uint32(NT))  # (1 and 2 are the ping-pong's)
                if not PS:
                    T.ptx["setmaxnreg.inc.sync.aligned.u32"](EVEN_REGS)
            else:
                T.ptx["setmaxnreg.inc.sync.aligned.u32"](CONSUMER_REGS)
                if PS:  # each item ends in its own epilogue (``store_o``); the producer loads on meanwhile
                    first_turn()
                    if CARRY:  # the first item's first S (each next one's is issued by the item before)
                        first_s(0, 0, cta_items(bx0) > 0)
                    for it in T.serial(cta_items(bx0)):
                        set_work(it)
                        init_acc()
                        compute()
                        if not PEEL:
                            release_q()
                        store_o()
                        fills[0] = fills[0] + n_kv
                    if CARRY:  # the dropped S after the last item
                        T.ptx["wgmma.wait_group.sync.aligned"](0)
                        pin(sacc, NS * 4, "float")
                    if OWN:  # (the shared memory the last stores read stays until they have)
                        if tx % 128 == 0:
                            tma_store_wait()
                    last_turn()
                else:
                    compute()
                    T.ptx["setmaxnreg.dec.sync.aligned.u32"](EVEN_REGS)
                T.ptx["bar.arrive"](T.uint32(3), T.uint32(NT))
            # (persistent: the producer warps wait there too, not exiting while tiles they loaded are still read)
            # registers shared evenly again: the producer takes its share back once every computing warp has
            # returned it (named barrier 3; taken before, by the producer warps that load nothing, the computing
            # warps could not get theirs and the CTA hung), inside the branch (after it, ptxas would keep the epilogue
            # to the producer's 24 registers: spills, serialised wgmma). Then all threads stage O over the tiles, the
            # producer's loads all consumed (the epilogue's shared accesses outside the branches, for TVM's sync
            # planner).
            if not PS:
                epilogue()
        else:
            compute()
            epilogue()

    @T.macro
    def block(q, k, v, bias, out, bx, h, b, tx, maps):
        with T.sblock("flash_attention"):
            T.reads()
            T.writes()
            # Q | K stages | V stages; > 48 KB is opted in at launch. Named per dtype: kernels
            # of both types can share one CUDA module (same-named extern __shared__ arrays must agree)
            if dtype == "float16":
                smem_f16 = T.alloc_buffer((SMEM_ALLOC,), dtype, scope="shared.dyn")
                attend(smem_f16, q, k, v, bias, out, bx, h, b, tx, maps)
            else:
                smem_bf16 = T.alloc_buffer((SMEM_ALLOC,), dtype, scope="shared.dyn")
                attend(smem_bf16, q, k, v, bias, out, bx, h, b, tx, maps)

    @T.macro
    def cta(q, k, v, bias, out, bx, h, b, maps):
        for tx in T.thread_binding(NT, thread="threadIdx.x"):
            # __launch_bounds__(NT, min_blocks): ptxas caps the registers so that many CTAs fit an SM (TMA: one, which
            # lets ptxas honour setmaxnreg)
            if min_blocks > 0:
                with T.attr(0, "tirx.launch_bounds_min_blocks_per_sm", min_blocks):
                    block(q, k, v, bias, out, bx, h, b, tx, maps)
            else:
                block(q, k, v, bias, out, bx, h, b, tx, maps)

    @T.macro
    def grid(q, k, v, bias, out, maps):
        if PS:  # CTA c runs its items (``cta_item``) in ``attend``
            for c in T.thread_binding(ctas, thread="blockIdx.x"):
                cta(q, k, v, bias, out, c, 0, 0, maps)
        else:  # one CTA per item, started in item order
            for blk in T.thread_binding(items, thread="blockIdx.x"):
                w = T.meta_var(work_item(blk))
                cta(q, k, v, bias, out, w[0], w[1], w[2], maps)

    def tensor_map(x, heads, rows):
        """TMA descriptor of ``x`` [batch, seq, heads, D]: boxes of 64 columns x ``rows`` rows of one head, written
        in the 128-byte swizzle (``at``), zero past the sequence."""
        nb, ns = x.shape[0], x.shape[1]
        return (D, heads, ns, nb, D * 2, heads * D * 2, ns * heads * D * 2, 64, 1, rows, 1, 1, 1, 1, 1)

    @T.macro
    def body_tma(q, k, v, bias, out):
        tq: T.let[T.TensorMap()] = T.tvm_stack_alloca("tensormap", 1)
        tk: T.let[T.TensorMap()] = T.tvm_stack_alloca("tensormap", 1)
        tv: T.let[T.TensorMap()] = T.tvm_stack_alloca("tensormap", 1)
        T.tensormap_encode_tiled(tq, q.data, *tensor_map(q, H, BM), descriptor_dtype=dtype, rank=4, swizzle=3)
        T.tensormap_encode_tiled(tk, k.data, *tensor_map(k, H // G, BN), descriptor_dtype=dtype, rank=4, swizzle=3)
        T.tensormap_encode_tiled(tv, v.data, *tensor_map(v, H // G, BN), descriptor_dtype=dtype, rank=4, swizzle=3)
        if TS:  # (O's stores: boxes of one warpgroup's 64 rows)
            to: T.let[T.TensorMap()] = T.tvm_stack_alloca("tensormap", 1)
            T.tensormap_encode_tiled(to, out.data, *tensor_map(out, H, 64), descriptor_dtype=dtype, rank=4, swizzle=3)
            grid(q, k, v, bias, out, (tq, tk, tv, to))
        else:
            grid(q, k, v, bias, out, (tq, tk, tv))

    @T.macro
    def body(q, k, v, bias, out):
        grid(q, k, v, bias, out, None)

    return body_tma if WS else body


# The TMA epilogue's helpers (``TileConfig.tma_store``): four 8x8 matrices of an mma accumulator's float pairs, rounded
# to f16 / bf16, into shared memory (stmatrix: lanes 8i..8i+7 give matrix i's row addresses); a tensor box from shared
# memory to global (the map's swizzle), and the wait until TMA has read it.
_STMATRIX = (
    "__forceinline__ __device__ void tvmpipe_stmatrix_{t}(unsigned a, float x0, float x1, float x2, float x3, float x4, "
    "float x5, float x6, float x7) {{ {v} r[4] = {{{f}(x0, x1), {f}(x2, x3), {f}(x4, x5), {f}(x6, x7)}}; "
    'asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {{%1, %2, %3, %4}};" :: "r"(a), '
    '"r"(*(unsigned*)&r[0]), "r"(*(unsigned*)&r[1]), "r"(*(unsigned*)&r[2]), "r"(*(unsigned*)&r[3]) : "memory"); }}')
STORE_SRC = {
    "f16": _STMATRIX.format(t="f16", v="__half2", f="__floats2half2_rn"),
    "bf16": _STMATRIX.format(t="bf16", v="__nv_bfloat162", f="__floats2bfloat162_rn"),
    "tma": "__forceinline__ __device__ void tvmpipe_tma_store(const void* map, unsigned src, int c0, int c1, int c2, "
           'int c3) { asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], '
           '[%1];" :: "l"(map), "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3) : "memory"); }',
    "tma_commit": "__forceinline__ __device__ void tvmpipe_tma_store_commit() "
                  '{ asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }',
    "tma_wait": "__forceinline__ __device__ void tvmpipe_tma_store_wait() "
                '{ asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }',
}

SIMT_THREADS = 128
SIMT_CTAS_PER_SM = 2  # (the H200)


def simt_split(spec) -> int:
    """Lanes that share one query row in the SIMT kernel: 2 when one lane per row gives fewer than
    ``SIMT_CTAS_PER_SM`` CTAs per SM, else 1.

    One lane per row leaves short-sequence models with a handful of CTAs whose every lane walks all keys
    (BERT-base, batch 1: 12 CTAs). Splitting a row's keys over 2 lanes halves that chain and doubles the CTAs
    (H200, fp32, batch 1: BERT / GPT-2 / ViT 1.8-2.8 TFLOP/s, one lane 1.3-1.8); more lanes lose (0.7-1.7):
    each CTA then streams all of K and V through shared memory for fewer rows.
    A symbolic batch or sequence keeps one lane per row (its size is unknown; large is the safe guess).
    """
    if not (isinstance(spec.batch, int) and isinstance(spec.seq_q, int)):
        return 1
    return 2 if spec.batch * spec.heads * -(-spec.seq_q // SIMT_THREADS) < SIMT_CTAS_PER_SM * sm_count() else 1


def flash_simt(spec, split: int = 1) -> tvm.tirx.PrimFunc:
    """The SIMT kernel (``simt_body``) as a PrimFunc."""
    return kernel_signature(spec, simt_body(spec, split))


def simt_body(spec, split: int):
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
                                        ks[e // D, e % D] = spec.kv_at(k, b, k0 + e // D, hk, e % D)
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

    return body
