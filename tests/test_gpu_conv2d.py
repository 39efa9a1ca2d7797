"""The CUDA conv2d legalisation (a GEMM over the conv's NCHW output, B the input itself or its patches): its
numerics built for the CPU against onnxruntime, each B form on the emulated tensor-core GEMM with its fused epilogue,
the patches on the emulated elementwise kernel, and the kernels a compiled model gets."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper
from tvm import relax, te, topi

from compiler import targets
from schedules import gpu_conv2d
from tests.helpers import make_model, ort_run, rel_err, run_cli, save

F = TensorProto.FLOAT
TARGET = targets.resolve("cuda-sm90").target

# ic, oc, hw, k, stride, pad, dilation, B: the input itself (a 1x1 conv of 8k channels over 8k pixels), else patches
# (window rows and pixels each padded to a multiple of 8: 3 * 9 = 27 -> 32 rows, 25 -> 32 pixels)
GEOMETRIES = [
    (16, 24, 8, 1, 1, 0, 1, "input"),
    (8, 16, 8, 3, 1, 1, 1, "patches"),
    (3, 8, 16, 3, 2, 1, 1, "patches"),
    (4, 6, 9, 3, 1, 2, 2, "patches"),
    (3, 8, 11, 3, 2, 1, 1, "patches"),
    (16, 8, 16, 1, 2, 0, 1, "patches"),  # 1x1 stride 2: a strided gather
    (16, 8, 7, 1, 1, 0, 1, "patches"),  # 1x1 over 49 pixels: rows padded to 56
]


def conv_onnx(tmp_path, w: np.ndarray, x_shape, stride, pad, dilation):
    node = helper.make_node("Conv", ["x", "w"], ["y"], strides=[stride] * 2, pads=[pad] * 4, dilations=[dilation] * 2)
    return save(make_model([node], [("x", F, list(x_shape))], [("y", F, None)], {"w": w}), tmp_path / "c.onnx")


@pytest.mark.parametrize("ic, oc, hw, k, stride, pad, dilation, form", GEOMETRIES)
def test_legalised_conv_matches_onnxruntime(tmp_path, rng, ic, oc, hw, k, stride, pad, dilation, form):
    """The legalised conv (its weight matrix padded, its patches, its GEMM) built for the CPU, against onnxruntime."""
    x = rng.standard_normal((2, ic, hw, hw)).astype(np.float32)
    w = rng.standard_normal((oc, ic, k, k)).astype(np.float32)
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType(x.shape, "float32"))
    with bb.function("main", [xv]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.nn.conv2d(xv, relax.const(w), strides=[stride] * 2, padding=[pad] * 4,
                                                  dilation=[dilation] * 2))
        bb.emit_func_output(y)
    with TARGET:
        mod = relax.transform.LegalizeOps({"relax.nn.conv2d": gpu_conv2d.legalize_conv2d})(bb.get())
    (gemm,) = [f for gv, f in mod.functions.items() if gv.name_hint.startswith("conv2d_gemm")]
    b_shape = [int(d) for d in gemm.params[1].ty.shape]
    oh = (hw + 2 * pad - dilation * (k - 1) - 1) // stride + 1
    assert b_shape == (list(x.shape) if form == "input" else [2, -(-ic * k * k // 8) * 8, -(-oh * oh // 8) * 8])
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    ref = ort_run(conv_onnx(tmp_path, w, x.shape, stride, pad, dilation), {"x": x})["y"]
    assert rel_err(got, ref) < 1e-5


def test_cuda_conv_kernels_are_gemms(capsys, tmp_path, rng):
    """Conv -> bias -> Relu -> Add (a residual) -> Relu: one GEMM kernel with all of it as its epilogue."""
    pytest.importorskip("cuda.bindings")
    w = rng.standard_normal((16, 16, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1] * 4), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Add", ["r", "x"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    src = save(make_model(nodes, [("x", F, [2, 16, 14, 14])], [("y", F, [2, 16, 14, 14])],
                          {"w": w, "b": rng.standard_normal(16).astype(np.float32)}), tmp_path / "m.onnx")
    r = run_cli(capsys, "compile", src, "-t", "cuda-sm90", "-o", tmp_path / "m.tvmpkg", "--precision", "fp16")
    assert r.code == 0, r.err
    with zipfile.ZipFile(tmp_path / "m.tvmpkg") as zf:
        kernels = json.loads(zf.read("manifest.json"))["kernels"]
    (gemm,) = [name for name in kernels if "conv2d_gemm" in name]
    assert kernels[gemm] == "hand:GpuMatmul" and "add" in gemm and "relu" in gemm, kernels
    # the patches (196 pixels: pixel-major) are the one other kernel: the bias, activations and the add went in
    assert sorted(kernels.values()) == ["hand:GpuElementwise", "hand:GpuMatmul"], kernels


@pytest.mark.parametrize("hw, k, stride, pad, dtype", [((9, 8), 3, 1, 1, "float16"), ((7, 5), 3, 1, 0, "float16"),
                                                      ((13, 11), 7, 2, 3, "float32")])
def test_patches_kernel_emulated(rng, hw, k, stride, pad, dtype):
    """The patches of an RGB conv (3 x 3 x 3 = 27 window rows padded to 32 with zeros, or 147 to 152; 72 pixels, 15
    padded to 16, 42 to 48) on the elementwise rule's kernel (a vector's elements one by one where a select flips
    inside it; a float32 input cast in the kernel, as ResNet's first conv), against numpy."""
    from schedules.gpu_elementwise import GpuElementwise
    from tests import cuda_emu

    pytest.importorskip("cuda.bindings")
    (h, w), window = hw, 3 * k * k
    oh, ow = ((d + 2 * pad - k) // stride + 1 for d in hw)
    x = te.placeholder((2, 3, h, w), dtype, name="x")
    col = gpu_conv2d._patches(topi.cast(x, "float16"), k, k, [stride] * 2, [pad] * 4, [1, 1])
    with TARGET:
        sch = GpuElementwise().apply(te.create_prim_func([x, col]), TARGET, False)
    xs = rng.standard_normal((2, 3, h, w)).astype(dtype)
    out = np.full([int(d) for d in col.shape], np.nan, np.float16)
    cuda_emu.run(sch.mod["main"], TARGET, {"x": xs, "im2col": out})
    padded = np.pad(xs.astype(np.float16), [(0, 0), (0, 0), (pad, pad), (pad, pad)])
    ref = np.zeros((2, -(-window // 8) * 8, -(-oh * ow // 8) * 8), np.float16)
    for r in range(window):
        c, ky, kx = r // (k * k), r // k % k, r % k
        ref[:, r, :oh * ow] = padded[:, c, ky:ky + stride * oh:stride, kx:kx + stride * ow:stride].reshape(2, -1)
    np.testing.assert_array_equal(out, ref)
