"""Fused attention (``schedules/attention*.py``) against a float64 reference.

CPU kernels run through the pipeline's own stages (custom legalisation, schedules, build); the CUDA
kernels (wgmma on sm_90a, mma.sync on sm_80, SIMT fallback) are generated and executed on this CPU by
``cuda_emu`` (one OS thread per CUDA thread, PTX warp(group) collectives emulated), which checks their
fragment and shared-memory layouts, masks and barriers without a GPU. Shapes are odd on purpose: sequence lengths
that are not multiples of any tile, grouped-query heads, broadcast biases.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess

import ml_dtypes
import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import relax as R

import cuda_emu
from compiler import passes, schedules, targets
from compiler.build import build
from compiler.errors import TvmpipeError
from helpers import rel_err

NP = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
TOL = {"float32": 1e-5, "float16": 4e-3, "bfloat16": 3e-2}


def attention_module(b, sq, skv, h, hkv, d, dtype, bias_shape=None, causal=None, scale=None, dv=None,
                     bias_dtype=None) -> tvm.IRModule:
    """``main(q, k, v[, bias]) = R.nn.attention(...)``, BSNH; the bias in ``dtype`` unless ``bias_dtype``."""
    bb = relax.BlockBuilder()
    q = relax.Var("q", R.Tensor((b, sq, h, d), dtype))
    k = relax.Var("k", R.Tensor((b, skv, hkv, d), dtype))
    v = relax.Var("v", R.Tensor((b, skv, hkv, dv or d), dtype))
    params = [q, k, v] + ([relax.Var("bias", R.Tensor(bias_shape, bias_dtype or dtype))] if bias_shape else [])
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.nn.attention(*params[:3], params[3] if bias_shape else None,
                                                                scale=scale, causal_mask=causal)))
        bb.emit_func_output(out)
    return bb.get()


def reference(q, k, v, bias=None, causal=None, scale=None) -> np.ndarray:
    """float64 attention with TVM's semantics; a row with no finite score is NaN (as the unfused softmax)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    sq, h, d, skv, hkv = q.shape[1], q.shape[2], q.shape[3], k.shape[1], k.shape[2]
    k, v = np.repeat(k, h // hkv, axis=2), np.repeat(v, h // hkv, axis=2)
    s = np.einsum("bihd,bjhd->bhij", q, k) * (scale if scale is not None else 1 / math.sqrt(d))
    if bias is not None:
        s = s + np.asarray(bias, np.float64)
    if causal:
        offset = 0 if causal == "TopLeft" else abs(sq - skv)
        s = np.where(np.arange(skv)[None, :] <= np.arange(sq)[:, None] + offset, s, -np.inf)
    with np.errstate(invalid="ignore"):
        p = np.exp(s - s.max(-1, keepdims=True))
        return np.einsum("bhij,bjhd->bihd", p / p.sum(-1, keepdims=True), v)


def inputs(rng, b, sq, skv, h, hkv, d, dtype, bias_shape=None, dv=None) -> dict[str, np.ndarray]:
    arrays = {"q": rng.standard_normal((b, sq, h, d)), "k": rng.standard_normal((b, skv, hkv, d)),
              "v": rng.standard_normal((b, skv, hkv, dv or d))}
    if bias_shape:
        arrays["bias"] = rng.standard_normal(bias_shape) * 2
    return {n: a.astype(NP[dtype]) for n, a in arrays.items()}


def assert_close(ours: np.ndarray, ref: np.ndarray, dtype: str) -> None:
    ours = np.asarray(ours, np.float64)
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(ref), "NaN rows differ from the unfused semantics")
    finite = ~np.isnan(ref)
    assert rel_err(ours[finite], ref[finite]) < TOL[dtype]


def compile_cpu(mod: tvm.IRModule, custom: bool = True, fused: bool = True) -> relax.VirtualMachine:
    """``custom``: our legalisation; ``fused``: and our kernel (else the canonical definition runs as is)."""
    info = targets.resolve("cpu")
    mod, _ = passes.optimize(mod, info, legalize=schedules.legalizations() if custom else {})
    mod, chosen = schedules.apply(mod, info, enabled=custom and fused)
    assert ("Attention" in chosen.values()) == (custom and fused)
    return relax.VirtualMachine(build(mod, info).exe, tvm.cpu())


def run_vm(vm, arrays: dict[str, np.ndarray]) -> np.ndarray:
    names = ["q", "k", "v", "bias"]
    return vm["main"](*[tvm.runtime.tensor(arrays[n]) for n in names if n in arrays]).numpy()


# (batch, seq_q, seq_kv, heads, kv_heads, head_dim, dtype, bias shape, causal)
CPU_CASES = {
    "plain-odd": (2, 37, 37, 3, 3, 16, "float32", None, None),
    "causal-gqa": (1, 70, 70, 4, 2, 32, "float32", None, "TopLeft"),
    "bottom-right-cross": (2, 19, 83, 2, 1, 24, "float16", None, "BottomRight"),
    "key-padding": (2, 33, 65, 2, 2, 16, "float32", (2, 1, 1, 65), None),
    "additive-mask-causal": (1, 45, 45, 2, 2, 8, "float16", (1, 2, 45, 45), "TopLeft"),
    "bfloat16-gqa-tail": (2, 70, 70, 4, 2, 32, "bfloat16", None, None),
    # bias rows 1 KB apart: each key tile's bias transposed in registers first
    "row-bias-1k-stride": (2, 70, 256, 2, 2, 16, "float32", (2, 1, 70, 256), None),
    "row-bias-fp16-causal": (1, 45, 512, 2, 1, 8, "float16", (1, 2, 45, 512), "BottomRight"),
    # ... shared by 8 (batch, head)s: transposed once per call, keys past the end (100 of 128) element by element
    "row-bias-shared": (2, 45, 100, 4, 2, 16, "float32", (1, 1, 45, 100), "BottomRight"),
    "row-bias-shared-fp16": (1, 70, 150, 8, 8, 16, "float16", (1, 1, 70, 150), None),
    # few query rows per head: the decode kernel (chunks of 256 keys merged; a ragged last step; rows in pairs, an odd
    # one alone)
    "decode-gqa": (2, 1, 300, 8, 2, 32, "float32", None, None),
    "decode-causal-padding": (2, 3, 70, 4, 4, 16, "float16", (2, 1, 1, 70), "BottomRight"),
    "decode-7-rows-row-bias": (1, 7, 300, 2, 1, 16, "float32", (1, 2, 7, 300), "BottomRight"),
    "decode-mqa-bfloat16": (1, 2, 600, 4, 1, 64, "bfloat16", (1, 4, 2, 600), None),
}


@pytest.mark.parametrize("case", CPU_CASES.values(), ids=CPU_CASES.keys())
def test_cpu_kernel_matches_float64(rng, case):
    b, sq, skv, h, hkv, d, dtype, bias_shape, causal = case
    arrays = inputs(rng, b, sq, skv, h, hkv, d, dtype, bias_shape)
    if bias_shape and bias_shape[2] == 1:  # key padding: the last keys of each sequence masked out
        arrays["bias"][...] = 0
        arrays["bias"][0, ..., skv - 9 :] = -np.inf
        arrays["bias"][1, ..., skv - 30 :] = np.finfo(np.float16 if dtype == "float16" else np.float32).min
    vm = compile_cpu(attention_module(b, sq, skv, h, hkv, d, dtype, bias_shape, causal))
    assert_close(run_vm(vm, arrays), reference(**arrays, causal=causal), dtype)


def test_canonical_definition_matches_float64(rng):
    """The unscheduled canonical function (what a target without a fused kernel runs) is the reference too."""
    b, sq, skv, h, hkv, d = 2, 13, 21, 4, 2, 8
    arrays = inputs(rng, b, sq, skv, h, hkv, d, "float32", (b, 1, sq, skv))
    vm = compile_cpu(attention_module(b, sq, skv, h, hkv, d, "float32", (b, 1, sq, skv), "BottomRight"), fused=False)
    assert_close(run_vm(vm, arrays), reference(**arrays, causal="BottomRight"), "float32")


def test_cpu_scale_and_distinct_value_dim(rng):
    arrays = inputs(rng, 1, 21, 50, 2, 2, 16, "float32", dv=40)
    vm = compile_cpu(attention_module(1, 21, 50, 2, 2, 16, "float32", scale=0.3, dv=40))
    assert_close(run_vm(vm, arrays), reference(**arrays, scale=0.3), "float32")


def masked_rows_bias(rng, b, h, sq, skv, full: int = 3, part: int = 5, upto: int = 130) -> np.ndarray:
    """Row ``full`` fully -inf (NaN out); row ``part`` -inf over its first ``upto`` keys, whole key tiles (must stay
    finite)."""
    bias = rng.standard_normal((b, h, sq, skv)).astype(np.float32)
    bias[:, :, full, :] = -np.inf
    bias[:, :, part, :upto] = -np.inf
    return bias


# 4 rows: the decode kernel's, row 2 masked over its whole first chunk of keys (merged with the second)
@pytest.mark.parametrize("sq, full, part, upto", [(9, 3, 5, 130), (4, 1, 2, 256)])
def test_cpu_fully_masked_rows_as_unfused_graph(rng, sq, full, part, upto):
    b, skv, h, d = 1, 300, 2, 16
    arrays = inputs(rng, b, sq, skv, h, h, d, "float32")
    arrays["bias"] = masked_rows_bias(rng, b, h, sq, skv, full, part, upto)
    mod = attention_module(b, sq, skv, h, h, d, "float32", (b, h, sq, skv))
    ours, unfused = run_vm(compile_cpu(mod), arrays), run_vm(compile_cpu(mod, custom=False), arrays)
    assert np.isnan(unfused[:, full]).all() and not np.isnan(unfused[:, part]).any()
    assert_close(ours, np.asarray(unfused, np.float64), "float32")
    assert_close(ours, reference(**arrays), "float32")


def test_attention_stays_one_kernel():
    """Opaque to FuseOps: a following elementwise op is not fused into the attention kernel."""
    bb = relax.BlockBuilder()
    q = relax.Var("q", R.Tensor((1, 8, 2, 16), "float32"))
    with bb.function("main", [q]):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.attention(q, q, q))
            out = bb.emit_output(bb.emit(relax.op.nn.relu(a)))
        bb.emit_func_output(out)
    info = targets.resolve("cpu")
    mod, _ = passes.optimize(bb.get(), info, legalize=schedules.legalizations())
    kernels = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    assert len(kernels) == 2 and sum(f.attrs.get("tvmpipe.kernel") == "attention" for f in kernels) == 1


def test_sliding_window_is_refused():
    q = relax.Var("q", R.Tensor((1, 8, 2, 16), "float16"))
    bb = relax.BlockBuilder()
    with bb.function("main", [q]):
        bb.emit_func_output(bb.emit(relax.op.nn.attention(q, q, q, window_size=4)))
    with pytest.raises(TvmpipeError, match="sliding window"):
        passes.optimize(bb.get(), targets.resolve("cpu"), legalize=schedules.legalizations())


def cuda_kernel(mod: tvm.IRModule, scheduled: bool = True, target: str = "cuda-sm90") -> tuple[tvm.tirx.PrimFunc, tvm.target.Target]:
    """The scheduled attention kernel of ``mod`` for ``target`` (the canonical function if not ``scheduled``)."""
    info = targets.resolve(target)
    mod, _ = passes.optimize(mod, info, legalize=schedules.legalizations())
    mod, chosen = schedules.apply(mod, info, enabled=scheduled)
    if not scheduled:
        (func,) = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc) and f.attrs.get("tvmpipe.kernel")]
        return func, info.target
    (name,) = [n for n, rule in chosen.items() if rule == "Attention"]
    return mod[name], info.target


# tensor cores: fp16 / bf16, head dim 32..128; anything else: the SIMT fallback
CUDA_CASES = {
    "tc-fp16-d128-gqa-padding-bottom-right": (2, 37, 150, 2, 1, 128, "float16", (2, 1, 1, 150), "BottomRight"),
    "tc-bf16-d64-causal": (1, 150, 150, 2, 2, 64, "bfloat16", None, "TopLeft"),
    "tc-fp16-d96-mask": (1, 70, 33, 2, 1, 96, "float16", (1, 2, 70, 33), None),
    # 64-key tiles: unmasked tiles, then diagonal tiles some warps skip (their rows end before the tile)
    "tc-fp16-d128-causal-gqa": (1, 150, 150, 2, 1, 128, "float16", None, "TopLeft"),
    "tc-fp16-d128-mask-causal": (1, 150, 150, 2, 2, 128, "float16", (1, 2, 150, 150), "TopLeft"),
    "simt-fp32-d40-causal-mask": (1, 45, 70, 2, 1, 40, "float32", (1, 1, 45, 70), "BottomRight"),
}


def wgmma_kernel(canonical: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """The wgmma kernel the rule picks for long sequences (TMA for head dims 64 and 128, persistent: here with a CTA
    per item, as these few items fill no H200; causal: in L2 sections, the query tiles aligned to the sequence's end),
    for a canonical attention function."""
    from schedules.attention import AttentionSpec
    from schedules.attention_cuda import flash_mma, wgmma_rule

    spec = AttentionSpec.of(canonical)
    return flash_mma(spec, wgmma_rule(spec))


# "rule": the scheduled kernel (mma.sync for these short sequences, or SIMT); "wgmma": the Hopper kernel on the
# same case (tensor-core cases only)
KERNEL_CASES = [pytest.param(case, kernel, id=f"{name}-{kernel}") for name, case in CUDA_CASES.items()
                for kernel in ("rule", "wgmma") if kernel == "rule" or name.startswith("tc-")]


@pytest.mark.parametrize("case, kernel", KERNEL_CASES)
def test_cuda_kernel_emulated_matches_float64(rng, case, kernel):
    b, sq, skv, h, hkv, d, dtype, bias_shape, causal = case
    func, target = cuda_kernel(attention_module(b, sq, skv, h, hkv, d, dtype, bias_shape, causal), scheduled=kernel == "rule")
    if kernel == "wgmma":
        func = wgmma_kernel(func)
    arrays = inputs(rng, b, sq, skv, h, hkv, d, dtype, bias_shape)
    arrays["out"] = np.zeros_like(arrays["q"])
    cuda_emu.run(func, target, arrays)
    assert_close(arrays["out"], reference(**{n: a for n, a in arrays.items() if n != "out"}, causal=causal), dtype)


def test_benchmark_tile_variants_store_o_only_where_they_can():
    """The tile configurations ``benchmarks/attention.py`` builds beside the rule's keep O's TMA store only where the
    kernel has it (persistent, the last key tile peeled, the rule's tile height): variants that kept the rule's
    ``tma_store`` while turning persistence or the peel off failed the kernel's assertion and stopped the build."""
    from benchmarks.attention import CASES
    from schedules.attention import AttentionSpec
    from schedules.attention_cuda import flash_mma

    built = 0
    for case in (c for c in CASES if c.bench):
        spec = AttentionSpec.of(case.canonical())
        for cfg in case.variants(spec):
            if cfg.tma_store:
                flash_mma(spec, cfg)
                built += 1
    assert built > 12  # (the rule stores O through TMA at 512 rows, and at 2048 with d128)


# the kernel's other tile configurations (benchmarks/attention.py times them on the GPU), each on a shape that exercises it
TILE_CONFIGS = {
    "8-warps-pingpong-lpt-off": (dict(warps=8, pingpong=True, lpt=False), (1, 200, 200, 2, 1, 128, "float16", (1, 1, 200, 200), "TopLeft")),
    "16-row-warps-2-ctas-q-regs": (dict(warps=8, m_tiles=1, min_blocks=2, q_in_regs=True, bn=128, stages=3),
                                   (2, 77, 150, 2, 2, 64, "bfloat16", None, "BottomRight")),
    # wgmma: 2 warpgroups, a warpgroup dead on the diagonal tiles; 3 warpgroups whose tile copies leave a partial round
    "wgmma-2-groups-causal": (dict(warps=8, m_tiles=1, bn=64, stages=3, wgmma=True),
                              (1, 300, 300, 2, 1, 128, "bfloat16", None, "TopLeft")),
    "wgmma-3-groups-partial-copies": (dict(warps=12, m_tiles=1, bn=64, stages=3, wgmma=True),
                                      (2, 250, 190, 2, 2, 64, "float16", (2, 1, 1, 190), "BottomRight")),
    # CUDA's exp2f instead of ex2.approx.ftz (the benchmark's comparison)
    "exp2f": (dict(ftz_exp=False), (1, 70, 90, 2, 1, 64, "float16", (1, 2, 70, 90), "BottomRight")),
    # each warpgroup up to its own diagonal: 4 key-tile counts in the first query tile, a bottom-right offset, padding
    "wgmma-per-group-diagonals": (dict(warps=16, m_tiles=1, bn=64, stages=3, wgmma=True, group_diag=True),
                                  (2, 300, 340, 2, 1, 64, "bfloat16", (2, 1, 1, 340), "BottomRight")),
    "wgmma-per-group-diagonals-d128": (dict(warps=16, m_tiles=1, bn=32, stages=3, wgmma=True, group_diag=True),
                                       (1, 260, 260, 2, 2, 128, "float16", None, "TopLeft")),
    # tiles in wgmma's no-swizzle core-matrix layout (the option the benchmark times; head dims not a multiple of 64)
    "wgmma-unswizzled": (dict(warps=12, m_tiles=1, bn=64, stages=3, wgmma=True, swizzle=False),
                         (2, 200, 230, 2, 1, 128, "float16", (2, 1, 1, 230), None)),
    # warp-specialised, TMA: 2 computing warpgroups of 128-key tiles in a 2-stage ring (key tiles wrap the ring, a
    # ragged last tile and query tile zero-filled past the end), grouped heads, key padding; d64 with 3 warpgroups,
    # causal
    "wgmma-tma-2-groups": (dict(warps=8, m_tiles=1, bn=128, stages=2, wgmma=True, tma=True),
                           (2, 150, 600, 4, 2, 128, "float16", (2, 1, 1, 600), None)),
    "wgmma-tma-3-groups-causal": (dict(warps=12, m_tiles=1, bn=64, stages=3, wgmma=True, tma=True),
                                  (1, 300, 330, 2, 1, 64, "bfloat16", None, "BottomRight")),
    # ... 3 computing warpgroups of 128-key tiles for d64 (the rule's without a mask), a ragged query tile of 192 rows
    "wgmma-tma-3-groups-d64": (dict(warps=12, m_tiles=1, bn=128, stages=3, wgmma=True, tma=True),
                               (1, 250, 390, 2, 1, 64, "float16", None, None)),
    # ... the rule's causal d64 from 2048 rows: 3 computing warpgroups, the query tiles aligned to the sequence's end
    # (the first starts 134 rows before it: rows that see keys through the bottom-right offset, their bias clamped,
    # never stored), in L2 sections, key padding
    "wgmma-tma-3-groups-causal-end-aligned": (dict(warps=12, m_tiles=1, bn=128, stages=3, wgmma=True, tma=True,
                                                   lpt_heads=2, end_aligned=True),
                                              (2, 250, 390, 3, 1, 64, "float16", (2, 3, 250, 390), "BottomRight")),
    # ... the 2 computing warpgroups taking turns to issue their GEMMs (ping-pong), causal in L2 sections
    "wgmma-tma-pingpong-causal": (dict(warps=8, m_tiles=1, bn=128, stages=3, wgmma=True, tma=True, pingpong=True,
                                       lpt_heads=2),
                                  (1, 390, 390, 3, 3, 128, "float16", None, "TopLeft")),
    # ... persistent: 3 CTAs over 16 items (5-6 each), a 2-stage ring wrapping across items, key padding, grouped heads
    "wgmma-tma-persistent": (dict(warps=8, m_tiles=1, bn=128, stages=2, wgmma=True, tma=True, persistent=3),
                             (2, 150, 600, 4, 2, 128, "float16", (2, 1, 1, 600), None)),
    # ... persistent, causal (items of 1-3 key tiles, heaviest first, in L2 sections), 2 Q buffers, ping-pong
    "wgmma-tma-persistent-causal-2q": (dict(warps=8, m_tiles=1, bn=64, stages=3, wgmma=True, tma=True, persistent=4,
                                            q_bufs=2, pingpong=True, lpt_heads=2),
                                       (2, 330, 330, 3, 1, 64, "bfloat16", None, "TopLeft")),
    # ... persistent, causal, 128-key tiles: items of 1-4 key tiles (the first query tile's one tile both the first
    # and the last, Q released right after its S; aligned to the end: rows -122..5), 1 Q buffer, O stored from
    # registers; and the loop without the peeled last tile
    "wgmma-tma-persistent-causal-1-tile-items": (dict(warps=8, m_tiles=1, bn=128, stages=3, wgmma=True, tma=True,
                                                      persistent=3, lpt_heads=2, end_aligned=True),
                                                 (1, 390, 390, 3, 3, 128, "float16", None, "TopLeft")),
    # ... the next item's first S issued behind each item's last P·V (``carry``): items of one key tile too, whose S is
    # then both carried and the last; 2 Q buffers in ping-pong; a CTA whose last item's carried S is dropped
    "wgmma-tma-persistent-carry": (dict(warps=8, m_tiles=1, bn=128, stages=3, wgmma=True, tma=True, persistent=3,
                                        lpt_heads=2, carry=True),
                                   (1, 390, 390, 3, 3, 128, "float16", None, "TopLeft")),
    "wgmma-tma-persistent-carry-2q-pingpong": (dict(warps=8, m_tiles=1, bn=64, stages=3, wgmma=True, tma=True,
                                                    persistent=4, q_bufs=2, pingpong=True, lpt_heads=2, carry=True),
                                               (2, 330, 330, 3, 1, 64, "bfloat16", None, "TopLeft")),
    "wgmma-tma-persistent-unpeeled": (dict(warps=8, m_tiles=1, bn=128, stages=2, wgmma=True, tma=True, persistent=3,
                                           peel=False),
                                      (2, 150, 600, 4, 2, 128, "float16", (2, 1, 1, 600), None)),
    # ... O stored with TMA (``tma_store``): d128 staged in the item's last K/V stage, ragged query tiles clipped,
    # grouped heads; d64 in a buffer of its own: 3 warpgroups in a ring of 4 stages (the rule's), and causal, carried,
    # 2 Q buffers in ping-pong
    "wgmma-tma-persistent-tma-store": (dict(warps=8, m_tiles=1, bn=128, stages=3, wgmma=True, tma=True, persistent=3,
                                            tma_store=True),
                                       (2, 150, 600, 4, 2, 128, "float16", (2, 1, 1, 600), None)),
    "wgmma-tma-persistent-tma-store-3-groups": (dict(warps=12, m_tiles=1, bn=128, stages=4, wgmma=True, tma=True,
                                                     persistent=2, q_bufs=2, tma_store=True),
                                                (1, 250, 390, 3, 1, 64, "bfloat16", None, None)),
    "wgmma-tma-persistent-tma-store-carry-pingpong": (dict(warps=8, m_tiles=1, bn=64, stages=3, wgmma=True, tma=True,
                                                           persistent=4, q_bufs=2, pingpong=True, lpt_heads=2,
                                                           carry=True, tma_store=True),
                                                      (2, 330, 330, 3, 1, 64, "bfloat16", None, "TopLeft")),
    # ... persistent, causal, the items dealt in snake rounds: 5 CTAs over 12 items of 2 or 4 key tiles (the last
    # round's 2 to the first CTAs), 3 warpgroups, 2 Q buffers, carried; and 5 CTAs over 18 items of 2-6 key tiles (the
    # last round's 3 to the last CTAs) in ping-pong
    "wgmma-tma-persistent-snake-3-groups": (dict(warps=12, m_tiles=1, bn=128, stages=4, wgmma=True, tma=True,
                                                 persistent=5, q_bufs=2, carry=True, lpt_heads=2, end_aligned=True,
                                                 snake=True),
                                            (2, 250, 390, 3, 1, 64, "float16", (2, 3, 250, 390), "BottomRight")),
    "wgmma-tma-persistent-snake-pingpong": (dict(warps=8, m_tiles=1, bn=64, stages=3, wgmma=True, tma=True,
                                                 persistent=5, q_bufs=2, pingpong=True, lpt_heads=2, carry=True,
                                                 tma_store=True, snake=True),
                                            (2, 330, 330, 3, 1, 64, "bfloat16", None, "TopLeft")),
    # causal launch order in sections of 3 (batch, head) pairs: 2 x 2 pairs leave a last section of 1
    "wgmma-lpt-sections-of-3": (dict(warps=16, m_tiles=1, bn=64, stages=3, wgmma=True, lpt_heads=3),
                                (2, 300, 300, 2, 1, 64, "float16", None, "TopLeft")),
}


# options only the benchmark's variants take (``choose`` never does): not in CI's `make test`, in `make test-all`
BENCHMARK_ONLY = {"8-warps-pingpong-lpt-off", "16-row-warps-2-ctas-q-regs", "wgmma-2-groups-causal", "exp2f",
                  "wgmma-per-group-diagonals-d128", "wgmma-unswizzled", "wgmma-tma-2-groups", "wgmma-tma-3-groups-causal",
                  "wgmma-tma-persistent-unpeeled"}


@pytest.mark.parametrize("cfg, case", [pytest.param(*c, id=n, marks=pytest.mark.slow if n in BENCHMARK_ONLY else ())
                                       for n, c in TILE_CONFIGS.items()])
def test_cuda_tile_configs_emulated(rng, cfg, case):
    from schedules.attention import AttentionSpec
    from schedules.attention_cuda import TileConfig, flash_mma

    b, sq, skv, h, hkv, d, dtype, bias_shape, causal = case
    canonical, target = cuda_kernel(attention_module(b, sq, skv, h, hkv, d, dtype, bias_shape, causal), scheduled=False)
    arrays = inputs(rng, b, sq, skv, h, hkv, d, dtype, bias_shape)
    arrays["out"] = np.zeros_like(arrays["q"])
    cuda_emu.run(flash_mma(AttentionSpec.of(canonical), TileConfig(**cfg)), target, arrays)
    assert_close(arrays["out"], reference(**{n: a for n, a in arrays.items() if n != "out"}, causal=causal), dtype)


# SIMT kernel: lanes per query row (the rule picks the split from the CTA count); masked rows merge across lanes
SIMT_SPLITS = {
    "1-lane-d40-dv40": (1, (2, 45, 70, 2, 1, 40, "float32", (1, 1, 45, 70), "BottomRight")),
    "4-lanes-masked-rows": (4, (1, 9, 150, 2, 2, 32, "float32", "masked-rows", None)),
    "16-lanes-padding-causal": (16, (2, 37, 37, 3, 3, 24, "float32", (2, 1, 1, 37), "TopLeft")),
}


@pytest.mark.parametrize("split, case", SIMT_SPLITS.values(), ids=SIMT_SPLITS.keys())
def test_cuda_simt_splits_emulated(rng, split, case):
    from schedules.attention import AttentionSpec
    from schedules.attention_cuda import flash_simt

    b, sq, skv, h, hkv, d, dtype, bias, causal = case
    bias_shape = (b, h, sq, skv) if bias == "masked-rows" else bias
    canonical, target = cuda_kernel(attention_module(b, sq, skv, h, hkv, d, dtype, bias_shape, causal), scheduled=False)
    arrays = inputs(rng, b, sq, skv, h, hkv, d, dtype, bias_shape)
    if bias == "masked-rows":
        arrays["bias"] = masked_rows_bias(rng, b, h, sq, skv)
    arrays["out"] = np.zeros_like(arrays["q"])
    cuda_emu.run(flash_simt(AttentionSpec.of(canonical), split), target, arrays)
    assert_close(arrays["out"], reference(**{n: a for n, a in arrays.items() if n != "out"}, causal=causal), dtype)


def test_cuda_simt_split_for_few_ctas():
    """Few (batch, head, row-tile) CTAs: two lanes per row; enough already, or a symbolic size: one lane."""
    from schedules.attention import AttentionSpec
    from schedules.attention_cuda import simt_split

    def spec(batch, seq):
        return AttentionSpec(batch, seq, seq, 12, 12, 64, 64, "float32", 0.125, "none", None, None)

    assert simt_split(spec(1, 128)) == 2  # BERT-base: 12 heads x 1 tile of 128 rows
    assert simt_split(spec(22, 128)) == 1  # 264 CTAs
    assert simt_split(spec(tvm.tirx.Var("b", "int64"), 128)) == 1


# decoding steps (few query rows per key/value head): the decode kernel, through the rule, in either form (CUDA cores;
# tensor cores, fp16 / bf16 with head dims in k-steps of 16)
DECODE_CASES = {
    # 12 rows per key/value head: row blocks of 8 and 4 (SIMT), one m16 tile (tensor cores); chunks of keys merged
    # by the second kernel
    "fp16-d128-gqa-3-rows-padding-bottom-right": (2, 3, 150, 8, 2, 128, "float16", (2, 1, 1, 150), "BottomRight"),
    # 16 heads sharing one key/value head (two row blocks), 33 keys: one chunk, written without the merge kernel
    "bf16-d64-one-kv-head-one-chunk": (1, 1, 33, 16, 1, 64, "bfloat16", None, None),
    # 8 lanes a key row, a bias per query row; causal from the top left: the rows see 1 and 2 of 300 keys
    "fp32-d32-row-bias-top-left": (2, 2, 300, 6, 2, 32, "float32", (2, 6, 2, 300), "TopLeft"),
    "fp16-d32-row-bias-top-left": (2, 2, 300, 6, 2, 32, "float16", (2, 6, 2, 300), "TopLeft"),
    # a key row in one lane's 16 bytes
    "fp16-d8-4-rows-bottom-right": (1, 4, 70, 2, 2, 8, "float16", None, "BottomRight"),
    # 32 rows of one key/value head: two m16 tiles' row blocks; 64-key warp steps
    "fp16-d16-32-rows-bottom-right": (1, 4, 200, 8, 1, 16, "float16", None, "BottomRight"),
    # 6 k-steps a row, no split into lanes (tensor cores only)
    "bf16-d96-key-bias": (1, 2, 1000, 4, 2, 96, "bfloat16", (1, 1, 2, 1000), None),
    # more query rows than the SIMT form takes (draft tokens of speculative decoding; tensor cores only): 11 rows x 2
    # heads, a bias per row, causal from the bottom right: row blocks of 16 and 6
    "fp16-d64-11-rows-row-bias-bottom-right": (2, 11, 260, 4, 2, 64, "float16", (2, 4, 11, 260), "BottomRight"),
}


def decode_forms(case) -> list[str]:
    """The forms of the decode kernel that take ``case`` on sm_90: the SIMT one where its key rows split over lanes
    and the query rows are few enough for it, the tensor-core one where ``tensor_cores`` allows."""
    from schedules import attention_cuda_decode
    from schedules.attention import AttentionSpec

    b, sq, skv, h, hkv, d, dtype = case[:7]
    spec = AttentionSpec(b, sq, skv, h, hkv, d, d, dtype, 1.0, "none", None, None)
    target = targets.resolve("cuda-sm90").target
    simt = attention_cuda_decode.simt_fits(spec) and sq <= attention_cuda_decode.MAX_SEQ_Q
    return ["simt"] * simt + ["tc"] * attention_cuda_decode.tensor_cores(spec, target)


@pytest.fixture
def decode_form(request, monkeypatch):
    """Builds in the decode kernel's form ``request.param``; returns the name of the CTA's block in that form."""
    from schedules import attention_cuda_decode

    monkeypatch.setattr(attention_cuda_decode, "on_tensor_cores", lambda *_: request.param == "tc")
    return "attention_decode_tc" if request.param == "tc" else "attention_decode"


def decode_kernel(block: str, *case, sms: int | None = None):
    """The rule's kernel for ``case`` (attention_module's arguments; planned for a GPU of ``sms`` SMs if given),
    checked to be the decode kernel's ``block``."""
    if sms is None:
        func, target = cuda_kernel(attention_module(*case))
    else:
        from schedules.attention import AttentionSpec
        from schedules.attention_cuda import kernel
        from schedules.common import planning_for

        canonical, target = cuda_kernel(attention_module(*case), scheduled=False)
        with planning_for(sms):
            func = kernel(AttentionSpec.of(canonical), target)
    blocks = set(re.findall(r'T\.sblock\("(attention_decode\w*)"\)', func.script()))
    assert blocks - {"attention_decode_combine"} == {block}, blocks
    return func, target


@pytest.mark.parametrize("case, decode_form", [(case, form) for case in DECODE_CASES.values() for form in decode_forms(case)],
                         ids=[f"{name}-{form}" for name, case in DECODE_CASES.items() for form in decode_forms(case)],
                         indirect=["decode_form"])
def test_cuda_decode_kernel_emulated(rng, case, decode_form):
    b, sq, skv, h, hkv, d, dtype, bias_shape, causal = case
    func, target = decode_kernel(decode_form, *case)
    arrays = inputs(rng, b, sq, skv, h, hkv, d, dtype, bias_shape)
    arrays["out"] = np.zeros_like(arrays["q"])
    cuda_emu.run(func, target, arrays)
    assert_close(arrays["out"], reference(**{n: a for n, a in arrays.items() if n != "out"}, causal=causal), dtype)


@pytest.mark.parametrize("decode_form", ["simt", "tc"], indirect=True)
def test_cuda_decode_kernel_fully_masked_rows(rng, decode_form):
    """Row 1 masked everywhere (NaN, as the unfused graph); row 2 over its first two chunks of 128 keys, whose
    -inf maxima the second kernel's merge must weigh as nothing."""
    b, sq, skv, h, d = 1, 4, 300, 2, 64
    func, target = decode_kernel(decode_form, b, sq, skv, h, h, d, "float16", (b, h, sq, skv))
    assert "attention_decode_combine" in func.script()
    arrays = inputs(rng, b, sq, skv, h, h, d, "float16")
    arrays["bias"] = masked_rows_bias(rng, b, h, sq, skv, full=1, part=2, upto=256).astype(np.float16)
    arrays["out"] = np.zeros_like(arrays["q"])
    cuda_emu.run(func, target, arrays)
    ref = reference(arrays["q"], arrays["k"], arrays["v"], arrays["bias"])
    assert np.isnan(ref[:, 1]).all() and not np.isnan(ref[:, 2]).any()
    assert_close(arrays["out"], ref, "float16")


@pytest.mark.parametrize("decode_form", ["simt", "tc"], indirect=True)
def test_cuda_decode_kernel_long_chunks_rising_scores(rng, decode_form):
    """Planned for a GPU of one SM, a CTA takes many steps of keys; scores that rise along the keys (a bias ramp) move
    every row's running max at every step, so the output so far must be rescaled each time."""
    b, sq, skv, h, hkv, d = 1, 1, 900, 4, 1, 64
    func, target = decode_kernel(decode_form, b, sq, skv, h, hkv, d, "float16", (1, 1, 1, skv), sms=1)
    assert "attention_decode_combine" in func.script()
    arrays = inputs(rng, b, sq, skv, h, hkv, d, "float16", (1, 1, 1, skv))
    arrays["bias"] = (np.linspace(0, 20, skv) + rng.standard_normal(skv)).reshape(1, 1, 1, skv).astype(np.float16)
    arrays["out"] = np.zeros_like(arrays["q"])
    cuda_emu.run(func, target, arrays)
    assert_close(arrays["out"], reference(**{n: a for n, a in arrays.items() if n != "out"}), "float16")


@pytest.mark.parametrize("decode_form", ["simt", "tc"], indirect=True)
def test_cuda_decode_kernel_reads_kv_cache_layout(rng, decode_form):
    """K and V in a KV cache's [batch, heads, seq, dim] (``kv_layout="BHSD"``, as the legalisation hands a decoding
    step's CUDA kernel a cache it would otherwise transpose): both forms read them in place, against float64 (3 rows
    of 4 query heads per K/V head, a padding bias, bottom-right causal, chunks merged)."""
    from schedules.attention import AttentionSpec
    from schedules.attention_cuda import kernel
    from schedules.common import planning_for

    b, sq, skv, h, hkv, d = 2, 3, 300, 8, 2, 64
    spec = AttentionSpec(b, sq, skv, h, hkv, d, d, "float16", 0.1, "BottomRight", (b, 1, 1, skv), "float16",
                         kv_layout="BHSD")
    target = targets.resolve("cuda-sm90").target
    with planning_for(132):
        func = kernel(spec, target)
    assert f'T.sblock("{decode_form}")' in func.script() and "attention_decode_combine" in func.script()
    arrays = inputs(rng, b, sq, skv, h, hkv, d, "float16", (b, 1, 1, skv))
    ref = reference(**arrays, causal="BottomRight", scale=0.1)
    arrays.update({n: np.ascontiguousarray(arrays[n].transpose(0, 2, 1, 3)) for n in "kv"}, out=np.zeros_like(arrays["q"]))
    cuda_emu.run(func, target, arrays)
    assert_close(arrays["out"], ref, "float16")


def test_cuda_decode_kernel_float32_min_mask(rng):
    """A float32 mask of -FLT_MAX, as exported: a head masked so over every key gets what the unfused graph gives (its
    scores vanish in the mask: the mean of V), not NaN; one masked over its first 200 keys sees the other 100."""
    b, sq, skv, h, hkv, d = 1, 1, 300, 4, 1, 32
    func, target = cuda_kernel(attention_module(b, sq, skv, h, hkv, d, "float32", (b, h, sq, skv)))
    assert "attention_decode" in func.script()
    arrays = inputs(rng, b, sq, skv, h, hkv, d, "float32", (b, h, sq, skv))
    arrays["bias"][:, 1] = np.finfo(np.float32).min
    arrays["bias"][:, 2, :, :200] = np.finfo(np.float32).min
    arrays["out"] = np.zeros_like(arrays["q"])
    cuda_emu.run(func, target, arrays)
    ref = reference(arrays["q"], arrays["k"], arrays["v"], arrays["bias"])
    ref[:, :, 1] = arrays["v"][:, :, 0].astype(np.float64).mean(axis=1)[:, None]
    assert_close(arrays["out"], ref, "float32")


@pytest.mark.parametrize("sq", [1, 70])
def test_cuda_float16_attention_float32_mask(rng, sq):
    """Mixed precision leaves a float32 mask beside float16 Q, K and V (T5's padding mask; ``FuseAttention`` keeps the
    bias in float32): the decode kernel (1 query row) and the tensor-core prefill kernel read it as it is, and a head
    masked everywhere by -FLT_MAX gets what the graph gives, the mean of V."""
    b, skv, h, d = 2, 150, 4, 64
    func, target = cuda_kernel(attention_module(b, sq, skv, h, h, d, "float16", (b, h, sq, skv), bias_dtype="float32"))
    assert ("attention_decode" if sq == 1 else "flash_attention") in func.script()
    arrays = inputs(rng, b, sq, skv, h, h, d, "float16")
    arrays["bias"] = rng.standard_normal((b, h, sq, skv)).astype(np.float32)
    arrays["bias"][:, 1] = np.finfo(np.float32).min
    arrays["bias"][1, 2, :, :100] = np.finfo(np.float32).min
    arrays["out"] = np.zeros_like(arrays["q"])
    cuda_emu.run(func, target, arrays)
    ref = reference(arrays["q"], arrays["k"], arrays["v"], arrays["bias"])
    ref[:, :, 1] = arrays["v"][:, :, 1].astype(np.float64).mean(axis=1)[:, None]
    assert_close(arrays["out"], ref, "float16")


def test_cuda_decode_kernel_where_few_rows_per_head():
    """The decode kernel takes up to 4 query rows per head, or on tensor cores (fp16 / bf16, head dims in k-steps of 16
    up to 128, sm_80 on) up to 16 at a query length known here; its tensor-core form where there are more than 4 rows
    per key/value head or the SIMT form cannot split a key row over lanes. More rows take the prefill kernels; a query
    length known only at run time, both (chosen per call)."""
    from schedules.attention import AttentionSpec
    from schedules.attention_cuda import kernel
    from schedules.attention_cuda_decode import fits

    def spec(sq, d=128, dtype="float16", skv=512, kv_heads=2):
        return AttentionSpec(1, sq, skv, 8, kv_heads, d, d, dtype, 0.1, "none", None, None)

    n = tvm.tirx.Var("n", "int64")
    target, sm80 = (targets.resolve(name).target for name in ("cuda-sm90", "cuda-sm80"))
    sm70 = tvm.target.Target({**sm80.export(), "arch": "sm_70"})

    def kernels(*args, on=target, **kwargs) -> set[str]:
        script = kernel(spec(*args, **kwargs), on).script()
        return {name for name, block in (("simt", 'sblock("attention_decode")'), ("tc", "attention_decode_tc"),
                                         ("prefill", "flash_attention"), ("prefill", "attention_simt"))
                if block in script}

    # 4 heads a key/value head: 4 rows at one query row, 8 at two
    assert kernels(1) == kernels(2, on=sm70) == {"simt"} and kernels(2) == kernels(16) == {"tc"}
    assert kernels(17) == kernels(5, on=sm70) == kernels(5, 128, "float32") == {"prefill"}
    assert kernels(4, kv_heads=8) == {"simt"} and kernels(5, kv_heads=8) == {"tc"}  # plain heads
    assert kernels(1, 96) == kernels(1, 96, "bfloat16", on=sm80) == {"tc"}  # 12 loads a row: no power of two of lanes
    assert kernels(1, 128, "float32") == kernels(1, 256) == {"simt"}  # no tensor cores
    assert not fits(spec(1, 96), sm70) and not fits(spec(1, 24), target)
    assert kernels(n) == {"tc", "prefill"} and kernels(n, kv_heads=8) == {"simt", "prefill"}
    # keys in chunks over the GPU, merged by a second kernel; keys for one step of a CTA: one chunk, no merge
    for sq in (1, 2):
        assert "attention_decode_combine" in kernel(spec(sq), target).script()
        assert "attention_decode_combine" not in kernel(spec(sq, skv=30), target).script()


def test_cuda_tensor_core_fully_masked_rows(rng):
    b, sq, skv, h, d = 1, 19, 150, 2, 64  # more query rows than the decode kernel takes: the prefill kernel
    func, target = cuda_kernel(attention_module(b, sq, skv, h, h, d, "float16", (b, h, sq, skv)))
    assert "flash_attention" in func.script()
    arrays = inputs(rng, b, sq, skv, h, h, d, "float16")
    arrays["bias"] = masked_rows_bias(rng, b, h, sq, skv).astype(np.float16)
    arrays["out"] = np.zeros_like(arrays["q"])
    cuda_emu.run(func, target, arrays)
    assert_close(arrays["out"], reference(arrays["q"], arrays["k"], arrays["v"], arrays["bias"]), "float16")


@pytest.mark.parametrize("target, insns", [
    ("cuda-sm90", ("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16", "wgmma.wait_group.sync.aligned 1",
                   "const __grid_constant__ CUtensorMap", "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier",
                   "mbarrier.try_wait.parity", "setmaxnreg.dec.sync.aligned.u32 24", "setmaxnreg.inc.sync.aligned.u32 240")),
    ("cuda-sm80", ("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
                   "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16", "cp.async.cg.shared.global", "cp.async.wait_group")),
])
def test_cuda_source_uses_tensor_cores(target, insns):
    """A long sequence: Hopper (sm_90a) gets the wgmma kernel (S: m64 x 128 keys, O: m64 x d128; tiles loaded by a
    TMA producer warpgroup that gives its registers to the others), Ampere mma.sync;
    both exponentiate with the bare ex2.approx.ftz (exp2f's subnormal fix-ups cost 3 instructions a score)."""
    func, target = cuda_kernel(attention_module(1, 1100, 1100, 2, 2, 128, "float16"), target=target)
    exe = tvm.compile(tvm.IRModule({"attention": func.with_attr("global_symbol", "attention")}), target=target)
    (cuda,) = exe.mod._collect_from_import_tree(lambda m: m.kind == "cuda")
    source = cuda.inspect_source("cuda")
    for insn in insns + ("ex2.approx.ftz.f32",):
        assert insn in source, insn
    assert "exp2f(" not in source


@pytest.mark.parametrize("seq, d, causal", [(512, 64, "none"), (512, 64, "TopLeft"), (512, 128, "none"),
                                             (512, 128, "TopLeft"), (2048, 128, "none"), (2048, 64, "TopLeft")])
def test_cuda_wgmma_kernels_keep_their_pipeline(tmp_path, seq, d, causal):
    """ptxas serialises every wgmma of a kernel where it cannot prove the asynchronous pipeline safe (a register of a
    wgmma in flight touched, or a branch leaving the groups in flight unknown) and says so only in an info line
    (C7510-C7515); the emulator runs such a kernel right. The rule's TMA kernels at the benchmark's shapes (persistent,
    ping-pong, the carried S, one CTA per item) compile with nvcc without it."""
    from schedules.attention import AttentionSpec
    from schedules.attention_cuda import choose, flash_mma

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc on PATH")
    spec = AttentionSpec(16384 // seq, seq, seq, 2048 // d, 2048 // d, d, d, "float16", d ** -0.5, causal, None, None)
    cu = tmp_path / "attention.cu"
    cu.write_text(cuda_emu.cuda_source(flash_mma(spec, choose(spec, wgmma=True)), targets.resolve("cuda-sm90").target))
    done = subprocess.run([nvcc, "-cubin", "-arch=sm_90a", "-o", str(tmp_path / "attention.cubin"), str(cu)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "wgmma.mma_async instructions are serialized" not in done.stdout + done.stderr


@pytest.mark.parametrize("causal", ["TopLeft", "none"])
def test_cuda_tma_kernel_symbolic_lengths(causal):
    """One TMA kernel for any batch / sequence length: tensor maps encoded from the runtime shapes, 32-bit coordinates;
    persistent too (its CTAs loop over a count of items known at run time: the rule's without a causal mask). The
    rule's kernel also holds the decode kernel, for calls of few query rows."""
    from dataclasses import replace

    from schedules.attention import AttentionSpec
    from schedules.attention_cuda import choose, flash_mma, kernel

    b, s = tvm.tirx.Var("b", "int64"), tvm.tirx.Var("s", "int64")
    spec = AttentionSpec(b, s, s, 16, 4, 64, 64, "float16", 0.125, causal, None, None)
    target = targets.resolve("cuda-sm90").target
    func = kernel(spec, target)
    persistent = flash_mma(spec, replace(choose(spec, wgmma=True), persistent=132, q_bufs=2))
    for f in (func, persistent):
        source = cuda_emu.cuda_source(f, target)
        assert "cp.async.bulk.tensor.4d" in source and "tensormap_encode_tiled" in f.script()
    assert "attention_decode" in func.script()


def test_cuda_rule_picks_wgmma_where_it_won():
    """wgmma (sm_90a only) for long sequences (from 512 rows; causal: from 2048, d64/d128 from 512, launched in L2
    sections): head dims 64 and 128 on the TMA kernel (128-key tiles, 3 stages; 3 computing warpgroups for d64, 2 for
    d128, in ping-pong when causal, the query tiles then aligned to the sequence's end; persistent, 132 CTAs, d64 in 4
    stages, causal below 2048 rows (d128: 4096): there 2 computing warpgroups in ping-pong, for d64 with 2 Q buffers
    and the next item's first S carried; without a mask d128 in ping-pong from 2048 to 4096 rows, d64 with 2 Q buffers
    below 2048; O stored with TMA below 4096 rows, d64 2048), others on the cp.async kernel (4 warpgroups for d32, 3
    for d96, 64-key tiles); else mma.sync."""
    from schedules.attention import AttentionSpec
    from schedules.attention_cuda import choose, kernel

    def spec(seq, d, causal="none", kv_heads=16):
        return AttentionSpec(8, seq, seq, 16, kv_heads, d, d, "float16", d ** -0.5, causal, None, None)

    assert choose(spec(2048, 64), wgmma=True).wgmma and choose(spec(tvm.tirx.Var("s", "int64"), 64), wgmma=True).wgmma
    assert choose(spec(1024, 64, "TopLeft"), wgmma=True).tma and not choose(spec(256, 64), wgmma=True).wgmma
    assert not choose(spec(1024, 96, "TopLeft"), wgmma=True).wgmma and choose(spec(512, 128, "TopLeft"), wgmma=True).tma
    # (seq, d, causal): computing warps, persistent CTAs, Q buffers, ping-pong, the next item's first S carried
    expected = {(512, 64, "none"): (12, 132, 2, False, False), (512, 128, "none"): (8, 132, 1, False, False),
                (2048, 64, "none"): (12, 132, 1, False, False), (2048, 128, "none"): (8, 132, 1, True, False),
                (4096, 128, "none"): (8, 132, 1, False, False), (8192, 128, "none"): (8, 132, 1, False, False),
                (8192, 64, "none"): (12, 132, 1, False, False), (512, 64, "TopLeft"): (8, 132, 2, True, True),
                (512, 128, "TopLeft"): (8, 132, 1, True, False), (2048, 128, "TopLeft"): (8, 132, 1, True, False),
                (4096, 128, "TopLeft"): (8, 0, 1, True, False),
                (2048, 64, "TopLeft"): (12, 0, 1, False, False), (8192, 64, "TopLeft"): (12, 0, 1, False, False)}
    for (seq, d, causal), want in expected.items():
        cfg = choose(spec(seq, d, causal), wgmma=True)
        stages = 4 if d == 64 and cfg.persistent else 3  # (d64 persistent: a ring of 4 K/V stages)
        assert (cfg.tma, cfg.bn, cfg.stages, cfg.group_diag, cfg.peel) == (True, 128, stages, False, True), \
            (seq, d, causal, cfg)
        assert (cfg.warps, cfg.persistent, cfg.q_bufs, cfg.pingpong, cfg.carry) == want, (seq, d, causal, cfg)
        assert cfg.tma_store == (cfg.persistent > 0 and seq < (2048 if d == 64 else 4096)), (seq, d, causal, cfg)
        assert cfg.end_aligned == (causal != "none"), (seq, d, causal, cfg)  # (causal TMA: the tiles end at the end)
        assert cfg.snake == (causal != "none" and cfg.persistent > 0), (seq, d, causal, cfg)  # (causal: snake rounds)
    from schedules.common import planning_for

    with planning_for(114):  # a target file's SM count (an H100 PCIe) sizes the persistent grid
        assert choose(spec(512, 128), wgmma=True).persistent == 114
    symbolic = tvm.tirx.Var("s", "int64")  # (an unknown length counts as long)
    assert choose(spec(symbolic, 128), wgmma=True).persistent and not choose(spec(symbolic, 128, "TopLeft"), wgmma=True).persistent
    for seq, d, causal in ((512, 32, "none"), (2048, 96, "TopLeft")):
        cfg = choose(spec(seq, d, causal), wgmma=True)
        assert (cfg.wgmma, cfg.tma, cfg.warps, cfg.bn) == (True, False, 16 if d <= 64 else 12, 64), (seq, d, causal, cfg)
    # sections: pairs whose K/V (seq x 2d x 2 bytes each) fit 8 MB, rounded down to a power of two, x query heads per K/V
    # head; the persistent kernel (causal below 2048 rows, d128 4096): at most a quarter of its 132 CTAs' items (128-row
    # tiles)
    sections = {(8192, 64, 16): 4, (2048, 64, 16): 16, (8192, 128, 16): 2, (6000, 128, 4): 4 * 2, (70000, 128, 16): 1,
                (512, 128, 16): 8, (1024, 64, 16): 4, (512, 128, 4): 4 * 8, (2048, 128, 16): 2}
    for (seq, d, kv_heads), pairs in sections.items():
        cfg = choose(spec(seq, d, "TopLeft", kv_heads), wgmma=True)
        assert cfg.wgmma and cfg.lpt_heads == pairs, (seq, d, kv_heads, cfg)
    with planning_for(114):  # 114 // 4 // 4 query tiles = 7 pairs: 4
        assert choose(spec(512, 128, "TopLeft"), wgmma=True).lpt_heads == 4
    assert choose(spec(tvm.tirx.Var("s", "int64"), 64, "TopLeft"), wgmma=True).lpt_heads == 0  # unknown K/V size
    # without TMA, per-warpgroup diagonals up to 4096 rows (causal only)
    assert choose(spec(2048, 96, "TopLeft"), wgmma=True).group_diag and choose(spec(4096, 32, "TopLeft"), wgmma=True).group_diag
    assert not choose(spec(8192, 96, "TopLeft"), wgmma=True).group_diag and not choose(spec(2048, 96), wgmma=True).group_diag
    assert not choose(spec(tvm.tirx.Var("s", "int64"), 96, "TopLeft"), wgmma=True).group_diag
    assert not choose(spec(2048, 96, "TopLeft"), wgmma=True).end_aligned  # (cp.async takes no rows before the sequence)
    sm80, sm90 = targets.resolve("cuda-sm80").target, targets.resolve("cuda-sm90").target
    assert "wgmma" not in kernel(spec(2048, 64), sm80).script() and "wgmma" in kernel(spec(2048, 64), sm90).script()


@pytest.mark.parametrize("row_bias", [None, "shared", "per-head"])
def test_cpu_symbolic_batch_and_sequence(rng, row_bias):
    """One compiled kernel for any batch / sequence length: the main kernel's tasks, or the decode kernel's up to 8 rows
    (chosen at run time); with a bias of [b, 1, s, s], one that transposes its tiles (a tile's ragged keys element by
    element)."""
    b, s = tvm.tirx.Var("b", "int64"), tvm.tirx.Var("s", "int64")
    heads = {None: 1, "shared": 1, "per-head": 4}[row_bias]  # (shared by 4 heads: transposed once per call)
    bias = (b, heads, s, s) if row_bias else None
    vm = compile_cpu(attention_module(b, s, s, 4, 2, 16, "float32", bias, causal="BottomRight"))
    for batch, seq in ((2, 37), (1, 130), (1, 90), (2, 3), (1, 1), (1, 8)):  # last tasks of 37, 2 and 26 rows; decode
        arrays = inputs(rng, batch, seq, seq, 4, 2, 16, "float32", bias and (batch, heads, seq, seq))
        assert_close(run_vm(vm, arrays), reference(**arrays, causal="BottomRight"), "float32")


@pytest.mark.parametrize("seq, d, dtype, causal, tma", [(100, 64, "bfloat16", "TopLeft", False), (600, 128, "float16", None, True)])
def test_cuda_package_holds_compiled_kernel(tmp_path, seq, d, dtype, causal, tma):
    """NVRTC accepts the generated CUDA (inline PTX included; the TMA kernel's tensor maps as kernel parameters, encoded
    by its host function): the package carries sm_90 cubin + PTX."""
    from compiler import cuda_binary, package, tuning

    try:
        cuda_binary.cuda_toolkit_root()
        from cuda.bindings import nvrtc  # noqa: F401
    except (TvmpipeError, ImportError) as err:
        pytest.skip(f"no CUDA headers / NVRTC here: {err}")
    info = targets.resolve("cuda-sm90")
    mod, _ = passes.optimize(attention_module(1, seq, seq, 2, 2, d, dtype, causal=causal), info,
                             legalize=schedules.legalizations())
    mod, _ = schedules.apply(mod, info)
    assert ("tensormap_encode_tiled" in mod.script()) == tma
    mod, _, _ = tuning.apply(mod, info)
    manifest = package.save(tmp_path / "attention.tvmpkg", build(mod, info), {})
    assert manifest["gpu_code"]["images"][0] == "sm_90a cubin"


@pytest.mark.parametrize("skv, bias", [(150, None), (256, (1, 4, 70, 256)), (150, (1, 1, 70, 150))],
                         ids=["plain", "row-bias", "row-bias-shared"])
@pytest.mark.parametrize("mcpu, register, isa", [("skylake-avx512", "zmm", "avx512f"), ("znver3", "ymm", "avx2")])
def test_cpu_kernel_either_vector_width(rng, mcpu, register, isa, skv, bias):
    """The kernel's AVX-512 form (register blocks of 64 queries x 4 keys, and 16 x 8 for the last 6 of the 70 rows)
    and its AVX2 form (16 x 6) both compile, to that width's registers, whichever this machine is; each runs against
    float64 where this CPU has its ISA (the tests above run only this machine's form). Odd lengths, grouped heads, an
    odd value dim (Oᵀ padded by a row); a bias transposed in blocks of 16 x 16 or 8 x 8."""
    from schedules.attention import AttentionSpec
    from schedules.attention_cpu import kernel

    b, sq, h, hkv, d, dv = 2, 70, 4, 2, 24, 7  # 150 keys: 3 tiles of 52 (AVX-512), 5 of 30 (AVX2)
    spec = AttentionSpec(b, sq, skv, h, hkv, d, dv, "float32", 0.2, "BottomRight", bias, bias and "float32")
    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})
    lib = tvm.compile(tvm.IRModule({"main": kernel(spec, target).with_attr("global_symbol", "main")}), target)
    asm = lib.mod.inspect_source("asm")
    assert ("zmm" in asm) == (register == "zmm") and "vfmadd" in asm
    if isa not in targets.host_cpu_flags():
        pytest.skip(f"this CPU has no {isa} to run it")
    arrays = inputs(rng, b, sq, skv, h, hkv, d, "float32", bias, dv=dv)
    out = tvm.runtime.empty((b, sq, h, dv), "float32")
    lib["main"](*[tvm.runtime.tensor(a) for a in arrays.values()], out)
    assert_close(out.numpy(), reference(**arrays, causal="BottomRight", scale=0.2), "float32")


def test_cpu_decode_kernel_symbolic_cache_length(rng):
    """One compiled decode kernel (one query row per head) for any batch and KV-cache length: 1 key, a chunk of keys
    and one more, several chunks."""
    b, s = tvm.tirx.Var("b", "int64"), tvm.tirx.Var("s", "int64")
    vm = compile_cpu(attention_module(b, 1, s, 8, 2, 32, "float32", (b, 1, 1, s), "BottomRight"))
    for batch, skv in ((1, 1), (2, 257), (1, 600)):
        arrays = inputs(rng, batch, 1, skv, 8, 2, 32, "float32", (batch, 1, 1, skv))
        assert_close(run_vm(vm, arrays), reference(**arrays, causal="BottomRight"), "float32")


@pytest.mark.parametrize("mcpu, isa", [("skylake-avx512", "avx512f"), ("znver3", "avx2")])
def test_cpu_decode_kernel_either_vector_width(rng, mcpu, isa):
    """The decode kernel's AVX-512 form (scores of 16 keys a vector) and its AVX2 form (8) against float64 where this
    CPU has the ISA: 3 query rows of 4 heads sharing a key/value head, a causal diagonal, 300 keys in 2 chunks."""
    from schedules import attention_cpu_decode
    from schedules.attention import AttentionSpec

    b, sq, skv, h, hkv, d, dv = 2, 3, 300, 8, 2, 32, 16
    spec = AttentionSpec(b, sq, skv, h, hkv, d, dv, "float32", 0.2, "BottomRight", None, None)
    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})
    assert attention_cpu_decode.fits(spec, target)
    lib = tvm.compile(tvm.IRModule({"main": attention_cpu_decode.kernel(spec, target).with_attr("global_symbol", "main")}),
                      target)
    if isa not in targets.host_cpu_flags():
        pytest.skip(f"this CPU has no {isa} to run it")
    arrays = inputs(rng, b, sq, skv, h, hkv, d, "float32", dv=dv)
    out = tvm.runtime.empty((b, sq, h, dv), "float32")
    lib["main"](*[tvm.runtime.tensor(a) for a in arrays.values()], out)
    assert_close(out.numpy(), reference(**arrays, causal="BottomRight", scale=0.2), "float32")


@pytest.mark.parametrize("sq, bias", [(3, False), (37, True)])
def test_cpu_kernels_read_kv_cache_layout(rng, sq, bias):
    """K and V in a KV cache's [batch, heads, seq, dim] (``kv_layout="BHSD"``): the decode kernel (3 rows) and the
    main one (37, with a per-row bias) read them in place, against float64."""
    from schedules.attention import AttentionSpec
    from schedules.attention_cpu_decode import cpu_kernel

    b, skv, h, hkv, d = 2, 300, 4, 2, 16
    bias_shape = (b, 1, sq, skv) if bias else None
    spec = AttentionSpec(b, sq, skv, h, hkv, d, d, "float32", 0.25, "BottomRight", bias_shape,
                         "float32" if bias else None, kv_layout="BHSD")
    target = targets.resolve("cpu").target
    lib = tvm.compile(tvm.IRModule({"main": cpu_kernel(spec, target).with_attr("global_symbol", "main")}), target)
    arrays = inputs(rng, b, sq, skv, h, hkv, d, "float32", bias_shape)
    cache = {n: np.ascontiguousarray(arrays[n].transpose(0, 2, 1, 3)) for n in "kv"}
    out = tvm.runtime.empty((b, sq, h, d), "float32")
    lib["main"](*[tvm.runtime.tensor(cache.get(n, a)) for n, a in arrays.items()], out)
    assert_close(out.numpy(), reference(**arrays, causal="BottomRight", scale=0.25), "float32")


def test_cpu_decode_kernel_where_few_rows_per_head():
    """Up to 8 query rows per head with head dims in whole vectors take the decode kernel (at 8 rows it measured
    1.1-1.4x the main kernel, at 12 0.7-1.1x); other shapes the main one; a query length known only at run time, both."""
    from schedules.attention import AttentionSpec
    from schedules.attention_cpu_decode import cpu_kernel, fits

    def spec(sq, d=64, dv=64):
        return AttentionSpec(1, sq, 512, 8, 2, d, dv, "float32", 0.1, "none", None, None)

    avx512 = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})
    avx2 = tvm.target.Target({"kind": "llvm", "mcpu": "znver3"})
    n = tvm.tirx.Var("n", "int64")
    assert all(fits(spec(sq), avx512) for sq in (1, 2, 4, 8, n)) and not fits(spec(9), avx512)
    assert not fits(spec(1, d=24), avx512) and not fits(spec(1, dv=40), avx512)
    assert fits(spec(1, 24, 40), avx2) and not fits(spec(1, d=12), avx2)

    def kernels(sq) -> set[str]:  # a buffer each kernel allocates: the decode kernel's chunk maxima, Qᵀ
        script = cpu_kernel(spec(sq), avx512).script()
        return {name for name, buffer in (("decode", "wm = T.alloc_buffer"), ("main", "qt = T.alloc_buffer"))
                if buffer in script}

    assert kernels(1) == kernels(8) == {"decode"} and kernels(9) == {"main"} and kernels(n) == {"decode", "main"}


def test_cpu_bias_transposed_where_its_rows_alias():
    """A bias varying along the query rows is transposed once per call where at least 4 (batch, head)s share it; else
    a key tile at a time where its rows lie a multiple of 1 KB apart (their cache lines would evict each other between
    gathers) or at a length not known; elsewhere it is gathered, and a bias of one row per key is broadcast."""
    from schedules.attention import AttentionSpec
    from schedules.attention_cpu import kernel

    def how(skv, bias, dtype="float32", heads=2, batch=1) -> str:
        spec = AttentionSpec(batch, 40, skv, heads, heads, 16, 16, "float32", 0.25, "none", bias, dtype)
        script = kernel(spec, targets.resolve("cpu").target).script()
        return "hoisted" if "bt = T.alloc_buffer" in script else "staged" if "T.Shuffle" in script else "read"

    s = tvm.tirx.Var("s", "int64")
    assert how(256, (1, 1, 40, 256)) == how(512, (1, 2, 40, 512), "float16") == how(s, (1, 1, 40, s)) == "staged"
    assert how(150, (1, 1, 40, 150)) == how(256, (1, 1, 40, 256), "float16") == "read"
    assert how(256, (1, 1, 1, 256)) == how(s, (1, 2, 1, s)) == "read"
    assert how(150, (1, 1, 40, 150), heads=4) == how(150, (1, 2, 40, 150), batch=4, heads=2) == "hoisted"
    assert how(256, (1, 4, 40, 256), heads=4) == "staged" and how(150, (2, 1, 40, 150), batch=2, heads=2) == "read"


def test_cpu_tiles_pad_least():
    """Padded query rows and keys are computed in full: static lengths get the tiles that pad least, in whole register
    blocks (query rows in multiples of the block's lanes, keys of its keys)."""
    from tvm import tirx

    from schedules.attention_cpu import BK, BQ, key_tile, query_rows

    def tiles(seq, qb, rj):
        return query_rows(seq, qb), key_tile(seq, rj)

    assert tiles(197, 64, 4) == (64, 40)  # ViT on AVX-512: 197 keys in 5 tiles of 40, not 4 of 64
    assert tiles(197, 16, 6) == (64, 66) and tiles(100, 16, 6) == (64, 54)
    assert tiles(128, 64, 4) == (64, 64) and tiles(256, 16, 6) == (64, 66)
    assert (query_rows(tirx.Var("n", "int64"), 64), key_tile(tirx.Var("m", "int64"), 4)) == (BQ, BK)
