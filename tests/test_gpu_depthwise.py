"""The CUDA depthwise rule: its generated kernel run on the CPU emulator against numpy float64, and the CLI
reporting it for the fused conv + bias + ReLU6 that DLight would give to GeneralReduction."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from tests import cuda_emu
from tests.helpers import make_model, run_cli, save

F = TensorProto.FLOAT


def depthwise_model(c: int, hw: int, stride: int, pad: int, w: np.ndarray, b: np.ndarray):
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["d"], group=c, strides=[stride] * 2, pads=[pad] * 4),
             helper.make_node("Clip", ["d", "lo", "hi"], ["y"])]
    inits = {"w": w, "b": b, "lo": np.array(0, np.float32), "hi": np.array(6, np.float32)}
    return make_model(nodes, [("x", F, [2, c, hw, hw])], [("y", F, None)], inits)


def reference(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int, pad: int) -> np.ndarray:
    """Depthwise conv + bias + ReLU6 in float64, straight from the definition."""
    n, c, hw, _ = x.shape
    k = w.shape[-1]
    xp = np.pad(x.astype(np.float64), [(0, 0), (0, 0), (pad, pad), (pad, pad)])
    out = (hw + 2 * pad - k) // stride + 1
    y = np.zeros((n, c, out, out)) + b[None, :, None, None]
    for ky in range(k):
        for kx in range(k):
            win = xp[:, :, ky:ky + stride * out:stride, kx:kx + stride * out:stride]
            y += win * w[None, :, 0, ky, kx, None, None]
    return np.clip(y, 0, 6)


@pytest.mark.parametrize("c, hw, k, stride, pad", [(5, 9, 3, 2, 1), (3, 7, 5, 1, 2)])
def test_cuda_depthwise_kernel_emulated(tmp_path, rng, c, hw, k, stride, pad):
    pytest.importorskip("cuda.bindings")
    from compiler import pipeline

    w = rng.standard_normal((c, 1, k, k)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    prep = pipeline.prepare(save(depthwise_model(c, hw, stride, pad, w, b), tmp_path / "m.onnx"), "cuda-sm90")
    (name,) = [n for n, rule in prep.hand.items() if rule == "GpuDepthwise"]
    func = prep.mod[name]
    x = (rng.standard_normal((2, c, hw, hw)) * 3).astype(np.float32)  # some outputs clip at 0 and at 6
    ref = reference(x, w, b, stride, pad)
    # the kernel's parameters in the Relax call's order: input, conv weight, bias, output
    names = [p.name for p in func.params]
    out = np.zeros(ref.shape, np.float32)
    arrays = dict(zip(names, [x, w, b.reshape(1, c, 1, 1), out]))
    cuda_emu.run(func, prep.target.target, arrays)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_fused_depthwise_is_hand_scheduled(capsys, tmp_path, rng):
    w = rng.standard_normal((8, 1, 3, 3)).astype(np.float32)
    src = save(depthwise_model(8, 14, 1, 1, w, rng.standard_normal(8).astype(np.float32)), tmp_path / "m.onnx")
    r = run_cli(capsys, "inspect", src, "--target", "cuda-sm90")
    assert r.code == 0, r.err
    line = next(ln for ln in r.out.splitlines() if "conv2d" in ln and "maximum" in ln)
    assert "hand:GpuDepthwise" in line, r.out
