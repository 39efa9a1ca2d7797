"""The CUDA conv2d legalisation (im2col + GEMM): its TE numerics, checked on the CPU, and its kernels."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper
from tvm import te

from schedules import gpu_conv2d
from tests.helpers import make_model, ort_run, rel_err, run_cli, save

F = TensorProto.FLOAT


@pytest.mark.parametrize("ic, oc, hw, k, stride, pad, dilation", [(3, 8, 11, 3, 2, 1, 1), (4, 6, 9, 3, 1, 2, 2), (5, 7, 6, 1, 1, 0, 1)])
def test_im2col_gemm_matches_onnxruntime(tmp_path, rng, ic, oc, hw, k, stride, pad, dilation):
    x = rng.standard_normal((2, ic, hw, hw)).astype(np.float32)
    w = rng.standard_normal((oc, ic, k, k)).astype(np.float32)
    data, weight = te.placeholder(x.shape, name="x"), te.placeholder((oc, ic * k * k), name="w")
    col = gpu_conv2d._im2col(data, k, k, [stride] * 2, [pad] * 4, [dilation] * 2)
    out = gpu_conv2d._gemm(weight, col, "float32")
    lib = tvm.tirx.build(te.create_prim_func([data, weight, out]), target="llvm")
    got = tvm.runtime.tensor(np.zeros([int(d) for d in out.shape], np.float32))
    lib(tvm.runtime.tensor(x), tvm.runtime.tensor(w.reshape(oc, -1)), got)
    node = helper.make_node("Conv", ["x", "w"], ["y"], strides=[stride] * 2, pads=[pad] * 4, dilations=[dilation] * 2)
    ref = ort_run(save(make_model([node], [("x", F, list(x.shape))], [("y", F, None)], {"w": w}), tmp_path / "c.onnx"), {"x": x})["y"]
    assert rel_err(got.numpy().reshape(ref.shape), ref) < 1e-5


def test_cuda_conv_kernels_are_gemms(capsys, tmp_path, rng):
    pytest.importorskip("cuda.bindings")
    w = rng.standard_normal((32, 16, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1] * 4), helper.make_node("Relu", ["c"], ["y"])]
    src = save(make_model(nodes, [("x", F, [2, 16, 14, 14])], [("y", F, [2, 32, 14, 14])], {"w": w}), tmp_path / "m.onnx")
    r = run_cli(capsys, "compile", src, "-t", "cuda-sm90", "-o", tmp_path / "m.tvmpkg", "--precision", "fp16")
    assert r.code == 0, r.err
    with zipfile.ZipFile(tmp_path / "m.tvmpkg") as zf:
        kernels = json.loads(zf.read("manifest.json"))["kernels"]
    gemm = [how for name, how in kernels.items() if "conv2d_gemm" in name]
    assert gemm == ["hand:GpuMatmul"], kernels  # fp16: the tensor-core GEMM
