"""The CUDA tensor-core GEMM rule (``schedules/gpu_matmul.py``): its generated kernels run on the CPU emulator
against numpy float64 (odd sizes: ragged M / N / K tiles, batch axes, both B layouts, fused epilogues), what it
refuses, and the CLI reporting it for an fp16 model."""

from __future__ import annotations

import dataclasses
import math
import shutil
import subprocess

import numpy as np
import pytest
from onnx import TensorProto, helper

from tests import cuda_emu
from tests.helpers import make_model, run_cli, save

pytest.importorskip("cuda.bindings")

from tvm import te, topi  # noqa: E402

from compiler import targets  # noqa: E402
from schedules import gpu_matmul  # noqa: E402
from schedules.common import planning_for  # noqa: E402
from schedules.gpu_matmul import GemmConfig  # noqa: E402

TARGET = targets.resolve("cuda-sm90").target
SMALL = GemmConfig(warps_m=1, warps_n=2, m_tiles=2, n_tiles=2, stages=3)  # 32 x 32 tiles: several CTAs on tiny inputs
# wgmma (sm_90a): one warpgroup of 64 x 64, a ring of 3 stages of 64-deep k-tiles; two warpgroups of 64 x 128 in 4
WG_SMALL = GemmConfig(warps_m=4, warps_n=1, m_tiles=1, n_tiles=8, bk=64, stages=3, wgmma=True)
WG_TWO = GemmConfig(warps_m=8, warps_n=1, m_tiles=1, n_tiles=16, bk=64, stages=4, wgmma=True)
# warp-specialised: a TMA producer warpgroup beside them (two computing warpgroups move registers with setmaxnreg)
WG_SMALL_TMA, WG_TWO_TMA = (dataclasses.replace(c, tma=True) for c in (WG_SMALL, WG_TWO))


def gemm_func(batch: tuple, m: int, n: int, k: int, k_major: bool, dtype: str, epilogue: str, acc: str = "float32"):
    """A fused PrimFunc as FuseOps leaves them: the matmul block, then elementwise blocks; and the numpy reference."""
    a = te.placeholder((*batch, m, k), dtype, "a")
    b = te.placeholder((*batch, n, k) if k_major else (k, n), dtype, "b")  # nn: B shared by the batch (a weight)
    r = te.reduce_axis((0, k), "r")

    def b_at(i):
        return b[(*i[:-2], i[-1], r)] if k_major else b[r, i[-1]]

    c = te.compute((*batch, m, n), lambda *i: te.sum(a[(*i[:-1], r)].astype(acc) * b_at(i).astype(acc), axis=r),
                   name="matmul")
    y = topi.cast(c, dtype)
    params = [a, b]
    if epilogue == "bias_gelu":  # bias, then tanh-GELU in fp32 (as ToMixedPrecision leaves it)
        bias = te.placeholder((n,), dtype, "bias")
        params.append(bias)
        x = topi.cast(topi.add(y, bias), "float32")
        y = topi.cast(0.5 * x * (1 + topi.tanh(0.7978845608 * (x + 0.044715 * x * x * x))), dtype)
    elif epilogue == "residual":
        res = te.placeholder((*batch, m, n), "float32", "res")
        params.append(res)
        y = topi.add(topi.cast(y, "float32"), res)
    return te.create_prim_func([*params, y]).without_attr("global_symbol"), [p.name for p in params]


def reference(arrays: dict, k_major: bool, epilogue: str) -> np.ndarray:
    a, b = arrays["a"].astype(np.float64), arrays["b"].astype(np.float64)
    y = a @ (np.swapaxes(b, -1, -2) if k_major else b)
    if epilogue == "bias_gelu":
        x = y + arrays["bias"]
        y = 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x ** 3)))
    elif epilogue == "residual":
        y = y + arrays["res"]
    return y


CASES = [  # batch, m, n, k, k_major, dtype, epilogue, config
    ((), 45, 40, 72, False, "float16", "none", SMALL),
    ((2, 3), 33, 24, 40, True, "float16", "residual", SMALL),
    ((2,), 17, 56, 24, False, "bfloat16", "bias_gelu", SMALL),
    ((7, 1), 1, 40, 32, False, "float16", "bias_gelu", SMALL),  # ViT's [tokens, 1, C] layout: 7 rows of 1
    ((), 1, 8, 200, True, "float16", "bias_gelu", SMALL),
    ((), 70, 136, 48, False, "float16", "residual", None),  # the chosen configuration (64 x 64 tiles, 4 warps)
    ((), 45, 44, 76, False, "float32", "bias_gelu", SMALL),  # fp32: 3xTF32, 4-element rows
    ((2,), 37, 20, 36, True, "float32", "none", None),
    ((), 70, 136, 328, False, "float16", "bias_gelu", WG_SMALL),  # wgmma: B [k, n] read MN-major, 6 k-tiles
    ((2,), 130, 72, 200, True, "float16", "residual", WG_SMALL),  # B [n, k] K-major, ragged M / N / K
    ((3,), 20, 200, 136, False, "bfloat16", "none", WG_TWO),
    ((), 1, 8, 24, True, "float16", "none", WG_TWO),  # fewer k-tiles than the ring holds
    # persistent: the ring runs on across each CTA's tiles (9 tiles on 2 CTAs: 5 and 4; 8 batched tiles on 3)
    ((), 150, 136, 200, False, "float16", "bias_gelu", dataclasses.replace(WG_SMALL, persistent=2)),
    ((2,), 70, 72, 136, True, "float16", "residual", dataclasses.replace(WG_SMALL, persistent=3)),
    # ... over tiles of one (ragged) k-tile each, the ring 4 steps ahead: into the next tiles' (the rule's K <= 64)
    ((2,), 70, 136, 56, False, "float16", "bias_gelu", dataclasses.replace(WG_SMALL, stages=6, persistent=3)),
    ((), 70, 72, 136, False, "float16", "bias_gelu", dataclasses.replace(WG_SMALL, staged=False)),  # straight stores
    # tiles down M in bands of 2 row tiles (3 x 3 tiles: the last band one row); persistent over 2 batches' bands
    ((), 150, 136, 200, False, "float16", "bias_gelu", dataclasses.replace(WG_SMALL, group_m=2)),
    ((2,), 150, 72, 136, True, "float16", "residual", dataclasses.replace(WG_SMALL, persistent=5, group_m=2)),
    # TMA: the ring wraps 5 times (16 k-tiles, 3 stages), ragged M / N; B K-major per batch, ragged K; a folded batch
    # in bf16 and a K-major batch of 2 x 3 on two computing warpgroups; tiles in bands down M
    ((), 150, 136, 1000, False, "float16", "bias_gelu", WG_SMALL_TMA),
    ((2,), 130, 72, 200, True, "float16", "residual", WG_SMALL_TMA),
    ((3,), 20, 200, 136, False, "bfloat16", "none", WG_TWO_TMA),
    ((2, 3), 33, 24, 40, True, "float16", "residual", WG_TWO_TMA),
    ((), 150, 136, 200, False, "float16", "bias_gelu", dataclasses.replace(WG_SMALL_TMA, group_m=2)),
    # mma.sync storing straight from the accumulators (the rule stages its output, fp32's in a ring of 4-byte elements)
    ((2, 3), 33, 24, 40, True, "float16", "residual", dataclasses.replace(SMALL, staged=False)),
    ((), 45, 44, 76, False, "float32", "bias_gelu", dataclasses.replace(SMALL, staged=False)),
]


@pytest.mark.parametrize("batch, m, n, k, k_major, dtype, epilogue, cfg", CASES)
def test_gemm_kernel_emulated(rng, batch, m, n, k, k_major, dtype, epilogue, cfg):
    func, names = gemm_func(batch, m, n, k, k_major, dtype, epilogue)
    spec = gpu_matmul.match(func)
    # "nn" cases share B (a weight) over the batch: matched as one GEMM of batch x M rows
    folded = bool(batch) and not k_major
    expect = ((), math.prod(batch) * m) if folded else (batch, m)
    assert spec is not None and (spec.batch, spec.m, spec.n, spec.k, spec.b_k_major) == (*expect, n, k, k_major)
    kernel = gpu_matmul.kernel(spec, cfg or gpu_matmul.choose(spec))
    np_dtype = "float32" if dtype == "bfloat16" else dtype  # bfloat16 buffers are fed as their fp32 upper halves
    arrays = {}
    for p in func.params[:-1]:
        x = rng.standard_normal([int(s) for s in p.shape]).astype("float32")
        arrays[p.name] = x if str(p.dtype) == "float32" else x.astype(np_dtype)
    if dtype == "bfloat16":  # round to bfloat16 (truncate) and pass the 16-bit patterns
        arrays = {n: (x.view(np.uint32) >> 16).astype(np.uint16) if n in ("a", "b", "bias") else x
                  for n, x in arrays.items()}
        as_float = {n: (x.astype(np.uint32) << 16).view(np.float32) if x.dtype == np.uint16 else x
                    for n, x in arrays.items()}
    else:
        as_float = arrays
    ref = reference(as_float, k_major, epilogue)
    out_name = func.params[-1].name
    out_dtype = str(func.params[-1].dtype)
    arrays[out_name] = np.full(ref.shape, 0 if out_dtype == "bfloat16" else np.nan, np.float32 if out_dtype == "float32" else np.float16
                               if out_dtype == "float16" else np.uint16)
    if out_dtype == "bfloat16":
        arrays[out_name][...] = 0x7FC0  # bfloat16 NaN: an element never written shows
    cuda_emu.run(kernel, TARGET, arrays)
    got = arrays[out_name]
    if out_dtype == "bfloat16":
        got = (got.astype(np.uint32) << 16).view(np.float32)
    # fp16 / bf16: the product is rounded to the operand type first; fp32 (3xTF32): within fp32 rounding
    tol = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 1e-5}[dtype]
    err = np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max()
    assert err <= tol, f"normwise error {err:.2e}"


CONV_CASES = [  # batch, oc, rows (K), (oh, ow), B, dtype, config: a conv's GEMM over its NCHW output (gpu_conv2d)
    (2, 70, 72, (6, 12), "input", "float16", WG_SMALL),  # B[n, k, y, x]: 72 pixels, a ragged column tile; ragged M
    (3, 40, 136, (5, 5), "patches", "float16", dataclasses.replace(WG_SMALL, persistent=2)),  # B[n, k, y*5+x], rows of 32
    (2, 33, 40, (4, 6), "input", "float16", SMALL),  # mma.sync
    (2, 24, 48, (7, 7), "patches", "float16", None),  # the rule's choice; rows of 56
    (2, 96, 136, (7, 7), "patches", "float16", "wgmma"),  # sm_90a's rule for 2 SMs: 128 x 64 (56 of 256 / 128 padding)
    (2, 20, 24, (3, 5), "patches", "float32", None),  # fp32 (3xTF32), the rule's choice; rows of 16
    (2, 70, 72, (6, 12), "input", "float16", WG_SMALL_TMA),  # TMA: the input as [n, k, 72 pixels]
    (3, 40, 136, (5, 5), "patches", "float16", WG_TWO_TMA),  # TMA: the patches' padded rows (32 of 25 pixels)
]


@pytest.mark.parametrize("batch, oc, rows, hw, form, dtype, cfg", CONV_CASES)
def test_conv_gemm_kernel_emulated(rng, batch, oc, rows, hw, form, dtype, cfg):
    """The output's pixels (y, x) are the GEMM's columns, B's rows the input's or its patches' (pixels padded to a
    multiple of 8, the padding never stored); bias, residual add and Relu fused after it."""
    from schedules import gpu_conv2d

    (oh, ow), pixels = hw, hw[0] * hw[1]
    padded = -(-pixels // 8) * 8
    w = te.placeholder((oc, rows), dtype, "a")
    b = te.placeholder((batch, rows, oh, ow) if form == "input" else (batch, rows, padded), dtype, "b")
    bias, res = te.placeholder((1, oc, 1, 1), dtype, "bias"), te.placeholder((batch, oc, oh, ow), dtype, "res")
    y = topi.nn.relu(topi.add(topi.add(topi.cast(gpu_conv2d._gemm(w, b, oh, ow, "float32"), dtype), bias), res))
    func = te.create_prim_func([w, b, bias, res, y]).without_attr("global_symbol")
    spec = gpu_matmul.match(func)
    assert spec is not None and (spec.batch, spec.m, spec.n, spec.n_out, spec.k, spec.b_k_major) == (
        (batch,), oc, pixels if form == "input" else padded, pixels, rows, False)
    arrays = {p.name: rng.standard_normal([int(d) for d in p.shape]).astype(dtype) for p in func.params[:-1]}
    arrays[func.params[-1].name] = out = np.full((batch, oc, oh, ow), np.nan, dtype)
    if cfg == "wgmma":
        with planning_for(2):
            cfg = gpu_matmul.choose(spec, wgmma=True)
        assert cfg == gpu_matmul.WGMMA_CONFIGS[2]
    cuda_emu.run(gpu_matmul.kernel(spec, cfg or gpu_matmul.choose(spec)), TARGET, arrays)
    cols = arrays["b"].reshape(batch, rows, -1)[..., :pixels]
    acc = (arrays["a"].astype(np.float64) @ cols.astype(np.float64)).reshape(out.shape)
    ref = np.maximum(acc.astype(dtype).astype(np.float64) + arrays["bias"] + arrays["res"], 0)
    tol = 2e-3 if dtype == "float16" else 1e-5
    assert np.abs(out.astype(np.float64) - ref).max() / np.abs(ref).max() <= tol


def test_gemm_accumulating_in_fp16_is_matched(rng):
    """matmul with out_dtype fp16 (an fp16 ONNX model compiled as it is): the kernel still accumulates in fp32."""
    func, _ = gemm_func((), 40, 48, 64, False, "float16", "none", acc="float16")
    spec = gpu_matmul.match(func)
    assert spec is not None
    arrays = {"a": rng.standard_normal((40, 64)).astype(np.float16), "b": rng.standard_normal((64, 48)).astype(np.float16)}
    ref = arrays["a"].astype(np.float64) @ arrays["b"].astype(np.float64)
    arrays[func.params[-1].name] = np.zeros((40, 48), np.float16)
    cuda_emu.run(gpu_matmul.kernel(spec, SMALL), TARGET, arrays)
    assert np.abs(arrays[func.params[-1].name] - ref).max() / np.abs(ref).max() <= 2e-3


@pytest.mark.parametrize("why, args", [
    ("float64 operands: no tensor-core path", ((), 32, 32, 32, False, "float64", "none", "float64")),
    ("K not a multiple of 8: rows are not 16-byte aligned", ((), 32, 32, 36, True, "float16", "none")),
    ("fp32 K not a multiple of 4", ((), 32, 32, 30, True, "float32", "none")),
    ("B [k, n] with N not a multiple of 8", ((), 32, 36, 32, False, "float16", "none")),
])
def test_match_refuses(why, args):
    func, _ = gemm_func(*args)
    assert gpu_matmul.match(func) is None, why


def test_match_refuses_an_epilogue_that_reads_the_product_elsewhere():
    a, b = te.placeholder((32, 32), "float16", "a"), te.placeholder((32, 32), "float16", "b")
    r = te.reduce_axis((0, 32), "r")
    c = te.compute((32, 32), lambda i, j: te.sum(a[i, r].astype("float32") * b[r, j].astype("float32"), axis=r))
    t = te.compute((32, 32), lambda i, j: c[j, i].astype("float16"))  # a transpose: not this element's product
    assert gpu_matmul.match(te.create_prim_func([a, b, t])) is None


def test_fp16_linear_is_hand_scheduled(capsys, tmp_path, rng):
    F16 = TensorProto.FLOAT16
    w = rng.standard_normal((64, 48)).astype(np.float16)
    bias = rng.standard_normal(48).astype(np.float16)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    src = save(make_model(nodes, [("x", F16, [3, 40, 64])], [("y", F16, [3, 40, 48])], {"w": w, "b": bias}), tmp_path / "m.onnx")
    r = run_cli(capsys, "inspect", src, "--target", "cuda-sm90")
    assert r.code == 0, r.err
    line = next(ln for ln in r.out.splitlines() if "matmul" in ln)
    assert "hand:GpuMatmul" in line, r.out


def test_constant_weight_of_odd_width_is_padded_for_the_kernel(tmp_path, rng):
    """GPT-2's LM head (N = 50257): the fp16 weight is padded to a multiple of 8 columns at compile time and the
    kernel stores only the first N (the slice fused as its epilogue)."""
    from compiler import pipeline

    w = rng.standard_normal((64, 50)).astype(np.float32)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", TensorProto.FLOAT, [2, 16, 64])],
                       [("y", TensorProto.FLOAT, [2, 16, 50])], {"w": w})
    prep = pipeline.prepare(save(model, tmp_path / "m.onnx"), "cuda-sm90", options=pipeline.Options(precision="fp16"))
    (name,) = [n for n, rule in prep.hand.items() if rule == "GpuMatmul"]
    func = prep.mod[name]
    assert [int(d) for d in func.params[1].shape] == [64, 56]
    x = rng.standard_normal((2, 16, 64)).astype(np.float16)
    w16 = w.astype(np.float16)
    out = np.full((2, 16, 50), np.nan, np.float32)
    cuda_emu.run(func, TARGET, dict(zip([p.name for p in func.params], [x, np.pad(w16, [(0, 0), (0, 6)]), out])))
    ref = x.astype(np.float64) @ w16.astype(np.float64)
    assert np.abs(out - ref).max() / np.abs(ref).max() <= 1e-5  # fp32 output: only the summation order differs


def test_fp16_conv_runs_on_the_gemm_kernel(capsys, tmp_path, rng):
    """An fp16 conv becomes im2col (pixel-major patches) + the tensor-core GEMM, 7x7 output (N = 49, not a
    multiple of 8) included; the global average pool after it (two reduction axes) is left to DLight."""
    F16 = TensorProto.FLOAT16
    w = (rng.standard_normal((16, 8, 3, 3)) * 0.1).astype(np.float16)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["y"])]
    src = save(make_model(nodes, [("x", F16, [2, 8, 7, 7])], [("y", F16, [2, 16, 1, 1])], {"w": w}), tmp_path / "m.onnx")
    r = run_cli(capsys, "inspect", src, "--target", "cuda-sm90")
    assert r.code == 0, r.err
    assert "hand:GpuMatmul" in next(ln for ln in r.out.splitlines() if "conv2d_gemm" in ln), r.out
    assert "hand:GpuMatmul" not in next(ln for ln in r.out.splitlines() if "mean" in ln or "pool" in ln), r.out


@pytest.mark.parametrize("k_major", [False, True])
def test_rule_takes_wgmma_on_sm90a_where_the_tiles_fill_the_gpu(k_major):
    """sm_90a: two warpgroups of 64 x 256 wgmma (64 x 128 or 64 x 64 where 256 columns leave SMs idle or would be
    mostly padding, then one warpgroup's 64 x 64; persistent over 64 x 128 tiles, a CTA an SM, where the 64 x 256
    tiles' last wave would be under 90 % full or K is one k-tile; down M in bands where B does not fit L2); tiles of
    128 x 128 and wider warp-specialised with TMA, the persistent ones too (as 128 x 128 tiles in 6 stages) unless K is
    one k-tile; GEMMs too small to fill the SMs with them, fp32 (3xTF32) and sm_80 keep mma.sync."""
    from schedules.gpu_matmul import WGMMA_CONFIGS, GpuMatmul

    def config(m, n, k, dtype="float16"):
        return gpu_matmul.choose(gpu_matmul.match(gemm_func((), m, n, k, k_major, dtype, "none")[0]), wgmma=True)

    def tma(cfg):
        return dataclasses.replace(cfg, tma=True)

    assert config(8192, 3072, 768) == tma(WGMMA_CONFIGS[0])  # 768 tiles: the 6th wave 97 % full
    # 192 tiles: 73 %; 576: 87 %: with TMA, 128 x 128 tiles in 6 stages (without, persistent CTAs over them)
    assert config(8192, 768, 768) == tma(dataclasses.replace(WGMMA_CONFIGS[1], stages=6)) == config(8192, 2304, 768)
    persistent = dataclasses.replace(WGMMA_CONFIGS[1], stages=6, persistent=132)
    assert config(98304, 256, 64) == persistent  # 768 tiles (97 %) of one k-tile each: GPT-2's unfused q.k^T
    fp32_out = gpu_matmul.match(gemm_func((), 8192, 768, 768, k_major, "float16", "residual")[0])
    # (a 4-byte staged output would not fit beside the persistent ring)
    assert gpu_matmul.choose(fp32_out, wgmma=True) == tma(WGMMA_CONFIGS[0])
    gpu_matmul.kernel(fp32_out, gpu_matmul.choose(fp32_out, wgmma=True))
    assert config(2304, 1024, 768) == tma(WGMMA_CONFIGS[1])  # 18 x 4 tiles of 256 columns (< 132 SMs), 18 x 8 of 128
    # GPT-2's LM head: B (77 MB) would not stay in L2, A's 8192 rows (12.6 MB) do: column by column (64 row tiles)
    assert config(8192, 50264, 768) == tma(dataclasses.replace(WGMMA_CONFIGS[0], group_m=64))
    assert config(65536, 50264, 768).group_m == 85  # bands of 85 row tiles' A (16 MB)
    assert config(256, 4224, 576) == WGMMA_CONFIGS[2]  # 34 / 66 tiles of 256 / 128 columns, 132 of 64
    # one warpgroup's 64 x 64 tiles where two warpgroups' leave SMs idle (M = 192: 80 tiles of 128 rows, 120 of 64;
    # M = 8448, N = 56: 66 / 132)
    assert config(192, 2560, 576) == gpu_matmul.WGMMA_ONE == config(8448, 56, 512)
    # not a tile over half padding where a narrower one pads less (ResNet's convs over 56 / 784 padded pixels): a wave
    # of 128 tiles of 128 x 64 (97 % of the SMs, not made persistent), 128 x 256 over 784 (1024: 31 % padding)
    assert config(16384, 56, 512) == WGMMA_CONFIGS[2] and config(4096, 784, 512) == tma(WGMMA_CONFIGS[0])
    assert not config(128, 768, 768).wgmma and not config(8192, 2304, 768, "float32").wgmma
    func = gemm_func((), 8192, 2304, 768, k_major, "float16", "none")[0]
    sm80 = GpuMatmul().apply(func, targets.resolve("cuda-sm80").target, False)
    sm90 = GpuMatmul().apply(func, TARGET, False)
    assert "wgmma" not in sm80.mod.script() and "T.ptx.wgmma(acc[0]" in sm90.mod.script()


@pytest.mark.parametrize("n", [2304, 2392])
@pytest.mark.parametrize("k_major", [False, True])
@pytest.mark.parametrize("cfg", [*gpu_matmul.WGMMA_CONFIGS, gpu_matmul.WGMMA_ONE, dataclasses.replace(gpu_matmul.WGMMA_CONFIGS[1], stages=6, persistent=132),
                                 *(dataclasses.replace(gpu_matmul.WGMMA_CONFIGS[i], tma=True) for i in (0, 1)),
                                 dataclasses.replace(gpu_matmul.WGMMA_CONFIGS[0], group_m=64),
                                 dataclasses.replace(gpu_matmul.WGMMA_CONFIGS[1], stages=6, persistent=132, group_m=16)],
                         ids=lambda c: c.name)
def test_wgmma_gemm_keeps_its_pipeline(tmp_path, k_major, cfg, n):
    """ptxas serialises every wgmma of a kernel where a branch or a register access falls inside the pipeline (one
    wgmma group in flight across the k-loop), saying so only in an info line (C7514); the emulator runs such a kernel
    right. The rule's wgmma tiles, persistent too, in bands down M, both B layouts, compile with nvcc without it, also
    where the last column tile is ragged (N = 2392: its epilogue's branches, inside a loop over one tile, did it)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc on PATH")
    spec = gpu_matmul.match(gemm_func((), 8192, n, 768, k_major, "float16", "bias_gelu")[0])
    cu = tmp_path / "gemm.cu"
    cu.write_text(cuda_emu.cuda_source(gpu_matmul.kernel(spec, cfg), TARGET))
    done = subprocess.run([nvcc, "-cubin", "-arch=sm_90a", "-o", str(tmp_path / "gemm.cubin"), str(cu)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "wgmma.mma_async instructions are serialized" not in done.stdout + done.stderr


def test_tma_reads_only_operands_laid_out_as_blocks():
    """TMA copies boxes of a dense [batch, rows, cols] block: an A whose batch axes are stored the other way round
    (matched: its leading indices are batch variables) is no such block, and the TMA kernel is refused for it."""
    a = te.placeholder((3, 2, 40, 24), "float16", "a")  # stored [b1, b0, m, k], read as a[b1, b0] for batch (b0, b1)
    b = te.placeholder((2, 3, 24, 32), "float16", "b")
    r = te.reduce_axis((0, 24), "r")
    c = te.compute((2, 3, 40, 32), lambda i0, i1, i, j: te.sum(
        a[i1, i0, i, r].astype("float32") * b[i0, i1, r, j].astype("float32"), axis=r))
    spec = gpu_matmul.match(te.create_prim_func([a, b, topi.cast(c, "float16")]))
    assert spec is not None and gpu_matmul.tma_views(spec) is None
    with pytest.raises(AssertionError, match="TMA"):
        gpu_matmul.kernel(spec, WG_SMALL_TMA)
    views = gpu_matmul.tma_views(gpu_matmul.match(gemm_func((2, 3), 33, 24, 40, True, "float16", "none")[0]))
    assert views == (gpu_matmul.TmaView(33, 40, True), gpu_matmul.TmaView(24, 40, True))


def test_wgmma_tile_over_shared_memory_is_refused():
    """A persistent 128 x 256 tile keeps its ring (192 KB) and stages its output beside it (66 KB): more than a CTA
    may take (the GPU refused to launch it); refused when the kernel is written."""
    spec = gpu_matmul.match(gemm_func((), 8192, 2304, 768, False, "float16", "none")[0])
    with pytest.raises(AssertionError, match="more than an SM has"):
        gpu_matmul.kernel(spec, dataclasses.replace(gpu_matmul.WGMMA_CONFIGS[0], persistent=132))
    gpu_matmul.kernel(spec, dataclasses.replace(gpu_matmul.WGMMA_CONFIGS[0], persistent=132, staged=False))
