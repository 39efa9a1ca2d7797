"""The CUDA elementwise rule: its generated kernels run on the CPU emulator against numpy float64 (odd sizes,
vectors with and without a partial last block, transposes, a three-way split, a KV cache's append, a rotary
embedding, a NaN select), and the CLI reporting it for a model's GELU chain."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest
from onnx import TensorProto, helper
from tvm import te, tirx, topi

from compiler import cuda_binary, targets
from schedules.gpu_elementwise import GpuElementwise
from tests import cuda_emu
from tests.helpers import make_model, run_cli, save

TARGET = targets.resolve("cuda-sm90").target


def scheduled(*tensors: te.Tensor) -> tirx.PrimFunc:
    """The rule's kernel for ``tensors``, checked to compile with NVRTC (TVM's CUDA codegen has vector types
    that g++ would take and NVRTC would not)."""
    pytest.importorskip("cuda.bindings")
    with TARGET:
        sch = GpuElementwise().apply(te.create_prim_func(list(tensors)), TARGET, False)
    assert sch is not None
    cuda_binary.compile_source(cuda_emu.cuda_source(sch.mod["main"], TARGET), "sm_90")
    return sch.mod["main"]


def gelu_tanh(x: te.Tensor) -> te.Tensor:
    """GPT-2's GELU as its ONNX export computes it, in float32 between casts."""
    xf = topi.cast(x, "float32")
    inner = topi.multiply(topi.add(xf, topi.multiply(topi.power(xf, 3.0), 0.044715)), 0.7978845608)
    return topi.cast(topi.multiply(topi.multiply(xf, 0.5), topi.add(topi.tanh(inner), 1.0)), x.dtype)


# (rows, cols): 8-lane vectors over several blocks with a partial last one; 4 lanes; no lanes (odd count)
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("shape", [(3, 1000), (5, 12), (7, 13)])
def test_gelu_chain_emulated(rng, dtype, shape):
    x = te.placeholder(shape, dtype, name="x")
    func = scheduled(x, gelu_tanh(x))
    xs = (rng.standard_normal(shape) * 3).astype(dtype)
    out = np.zeros(shape, dtype)
    cuda_emu.run(func, TARGET, {"x": xs, "compute": out})
    x64 = xs.astype(np.float64)
    ref = 0.5 * x64 * (1 + np.tanh(0.7978845608 * (x64 + 0.044715 * x64**3)))
    tol = 2e-3 if dtype == "float16" else 1e-5
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=tol, atol=tol)


def test_loads_and_stores_are_vectors_with_int32_indices():
    """One 4-lane vector per thread, and index math in int (Relax's shapes are int64)."""
    x = te.placeholder((32, 256, 12, 64), "float16", name="x")
    src = cuda_emu.cuda_source(scheduled(x, topi.transpose(x, [0, 2, 1, 3])), TARGET)
    body = src[src.index('extern "C"'):]
    assert "= *(half4*)(x_ptr + " in body and "*(half4*)(T_transpose_ptr + " in body, body  # 64-bit load, store
    assert "x_ptr[" not in body and "T_transpose_ptr[" not in body, body  # and no element-wise global access
    assert "int64_t" not in body, body


# attention's head split [b, s, h, d] -> [b, h, s, d] (odd sequence length: contiguous vectors); NCHW -> NHWC
# (each lane from another channel plane: a gathered vector)
@pytest.mark.parametrize("shape, axes", [((2, 5, 3, 16), (0, 2, 1, 3)), ((2, 12, 3, 5), (0, 2, 3, 1))])
def test_transpose_emulated(rng, shape, axes):
    x = te.placeholder(shape, "float16", name="x")
    func = scheduled(x, topi.transpose(x, list(axes)))
    xs = rng.standard_normal(shape).astype(np.float16)
    out = np.zeros(xs.transpose(axes).shape, np.float16)
    cuda_emu.run(func, TARGET, {"x": xs, "T_transpose": out})
    np.testing.assert_array_equal(out, xs.transpose(axes))


def test_three_way_split_emulated(rng):
    """GPT-2's QKV split (one kernel per output), rows of an odd count."""
    x = te.placeholder((37, 3 * 24), "float16", name="x")
    section = lambda s: lambda i, j: x[i, j + 24 * s]  # noqa: E731
    q, k, v = (te.compute((37, 24), section(s), name=n) for s, n in enumerate("qkv"))
    func = scheduled(x, q, k, v)
    xs = rng.standard_normal((37, 72)).astype(np.float16)
    outs = {n: np.zeros((37, 24), np.float16) for n in "qkv"}
    cuda_emu.run(func, TARGET, {"x": xs, **outs})
    for s, n in enumerate("qkv"):
        np.testing.assert_array_equal(outs[n], xs[:, 24 * s: 24 * (s + 1)])


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_kv_cache_append_emulated(rng, dtype):
    """A decoding step's new keys (one row per head, [b, s, h * d] -> [b, h, s, d]) appended to the cache along its
    sequence axis: each vector from one side of the select, whole (an if / else of vector loads)."""
    past, new = te.placeholder((2, 3, 37, 16), dtype, name="past"), te.placeholder((2, 1, 48), dtype, name="new")
    func = scheduled(past, new, topi.concatenate([past, topi.transpose(topi.reshape(new, (2, 1, 3, 16)), (0, 2, 1, 3))], 2))
    src = cuda_emu.cuda_source(func, TARGET)
    assert ("half4" if dtype == "float16" else "float4") + "*)(past_ptr + " in src, src
    arrays = {"past": rng.standard_normal((2, 3, 37, 16)).astype(dtype), "new": rng.standard_normal((2, 1, 48)).astype(dtype),
              "T_concat": np.zeros((2, 3, 38, 16), dtype)}
    cuda_emu.run(func, TARGET, arrays)
    ref = np.concatenate([arrays["past"], arrays["new"].reshape(2, 1, 3, 16).transpose(0, 2, 1, 3)], 2)
    np.testing.assert_array_equal(arrays["T_concat"], ref)


def rotate_half(x: te.Tensor, half: int) -> te.Tensor:
    """cat(-x2, x1) along the last axis, x1 its first ``half`` elements (rotary embeddings)."""
    *lead, d = (int(n) for n in x.shape)
    return topi.concatenate([topi.negative(topi.strided_slice(x, [0] * len(lead) + [half], lead + [d])),
                             topi.strided_slice(x, [0] * (len(lead) + 1), lead + [half])], len(lead))


@pytest.mark.parametrize("dtype, d", [("float16", 16), ("float32", 12)])
def test_rotary_embedding_emulated(rng, dtype, d):
    """A rotary embedding, x * cos + rotate_half(x) * sin over [batch, heads, seq, d] with an odd sequence: its select
    tests the innermost axis, flipping at d / 2, a multiple of the lanes, so each vector still takes one side whole
    (its test rewritten to the vector's first element: vector loads, not the scalar kernel TVM makes of it)."""
    shape = (2, 3, 7, d)
    x, cos, sin = (te.placeholder(s, dtype, name=n) for s, n in ((shape, "x"), ((1, 1, 7, d), "cos"), ((1, 1, 7, d), "sin")))
    func = scheduled(x, cos, sin, topi.add(topi.multiply(x, cos), topi.multiply(rotate_half(x, d // 2), sin)))
    src = cuda_emu.cuda_source(func, TARGET)
    vector = "half4" if dtype == "float16" else "float2"  # (float32: 12 // 2 = 6 is a multiple of 2 lanes, not 4)
    assert f"*({vector}*)(x_ptr + " in src and f"*({vector}*)(T_add_ptr + " in src, src
    arrays = {"x": rng.standard_normal(shape).astype(dtype), "cos": rng.standard_normal((1, 1, 7, d)).astype(dtype),
              "sin": rng.standard_normal((1, 1, 7, d)).astype(dtype), "T_add": np.full(shape, np.nan, dtype)}
    cuda_emu.run(func, TARGET, arrays)
    x64, half = arrays["x"].astype(np.float64), d // 2
    ref = x64 * arrays["cos"] + np.concatenate([-x64[..., half:], x64[..., :half]], -1) * arrays["sin"]
    tol = 2e-2 if dtype == "float16" else 1e-5
    np.testing.assert_allclose(arrays["T_add"].astype(np.float64), ref, rtol=tol, atol=tol)


def test_innermost_select_within_a_vector_is_computed_lane_by_lane(rng):
    """A concatenation of the innermost axis whose seam is not a multiple of 2 (5 + 11) would select within a
    vector's lanes: each thread computes its vector's 8 elements one by one into registers (scalar loads, the test
    per element) and stores them as one 16-byte vector; the vectors of a row on threadIdx.x, rows on threadIdx.y and
    blockIdx.y, the outermost axis on blockIdx.z."""
    x = te.placeholder((3, 8, 16), "float16", name="x")
    func = scheduled(x, rotate_half(x, 5))
    src = cuda_emu.cuda_source(func, TARGET)
    body = src[src.index('extern "C"'):]
    assert "*(uint4*)(T_concat_ptr + " in body and "*(uint4*)(x_ptr" not in body and "int64_t" not in body, body
    assert all(f"{axis}Idx.{d}" in body for axis, d in (("thread", "y"), ("block", "z"))), body
    arrays = {"x": rng.standard_normal((3, 8, 16)).astype("float16"), "T_concat": np.full((3, 8, 16), np.nan, "float16")}
    cuda_emu.run(func, TARGET, arrays)
    np.testing.assert_array_equal(arrays["T_concat"], np.concatenate([-arrays["x"][..., 5:], arrays["x"][..., :5]], -1))


def test_lane_by_lane_rows_past_the_grid_are_flat():
    """Rows whose blocks would pass CUDA's 65535 along y (2^23 rows of 8 elements, 64 rows a block) go back to one
    flat index over blocks of 256 threads, as the other kernels."""
    x = te.placeholder((1 << 23, 16), "float16", name="x")
    src = cuda_emu.cuda_source(scheduled(x, rotate_half(x, 5)), TARGET)
    body = src[src.index('extern "C"'):]
    assert "__launch_bounds__(256)" in body and "threadIdx.y" not in body and "blockIdx.y" not in body, body


@pytest.mark.parametrize("dtype", ["int64", "bool"])
def test_integer_and_boolean_kernels_are_left_to_dlight(dtype):
    """TVM's int32 narrowing would narrow integer data too, and its codegen loads boolean pairs as ushort2."""
    x = te.placeholder((3, 8), dtype, name="x")
    with TARGET:
        assert GpuElementwise().apply(te.create_prim_func([x, topi.cast(x, "float32")]), TARGET, False) is None


def test_reductions_are_left_to_dlight():
    x = te.placeholder((4, 9), "float32", name="x")
    with TARGET:
        assert GpuElementwise().apply(te.create_prim_func([x, topi.sum(x, axis=1)]), TARGET, False) is None


def test_model_gelu_is_hand_scheduled(capsys, tmp_path):
    """Through the CLI: a model's tanh-GELU (Pow, Mul, Add, Tanh), compiled under mixed precision to a cubin
    (NVRTC builds the kernel), is one kernel of this rule."""
    F = TensorProto.FLOAT
    consts = {"three": np.array(3, np.float32), "c": np.array(0.044715, np.float32),
              "s": np.array(0.7978846, np.float32), "one": np.array(1, np.float32), "half": np.array(0.5, np.float32)}
    nodes = [helper.make_node("Pow", ["x", "three"], ["p"]), helper.make_node("Mul", ["p", "c"], ["pc"]),
             helper.make_node("Add", ["x", "pc"], ["a"]), helper.make_node("Mul", ["a", "s"], ["as"]),
             helper.make_node("Tanh", ["as"], ["t"]), helper.make_node("Add", ["t", "one"], ["t1"]),
             helper.make_node("Mul", ["x", "half"], ["xh"]), helper.make_node("Mul", ["xh", "t1"], ["y"])]
    src = save(make_model(nodes, [("x", F, [3, 80])], [("y", F, [3, 80])], consts), tmp_path / "gelu.onnx")
    pytest.importorskip("cuda.bindings")
    r = run_cli(capsys, "compile", src, "--target", "cuda-sm90", "--precision", "fp16", "-o", tmp_path / "m.tvmpkg")
    assert r.code == 0, r.err
    with zipfile.ZipFile(tmp_path / "m.tvmpkg") as zf:
        kernels = json.loads(zf.read("manifest.json"))["kernels"]
    assert [rule for name, rule in kernels.items() if "tanh" in name] == ["hand:GpuElementwise"], kernels


def test_nan_select_emulated(rng):
    """The attention mask's NaN guard (isnan, where): boolean vectors between float16 ones."""
    x = te.placeholder((4, 40), "float16", name="x")
    func = scheduled(x, topi.where(topi.isnan(x), topi.full_like(x, 0.0), x))
    xs = rng.standard_normal((4, 40)).astype(np.float16)
    xs[rng.random((4, 40)) < 0.3] = np.nan
    out = np.full((4, 40), 7, np.float16)
    cuda_emu.run(func, TARGET, {"x": xs, "T_where": out})
    np.testing.assert_array_equal(out, np.where(np.isnan(xs), 0, xs))
