"""CumProd (against numpy in float64) and the Hann / Hamming / Blackman windows (against onnxruntime), odd
shapes and every attribute combination: converters in ``compiler/frontend/converters_ops.py``."""

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper

from helpers import make_model, ort_run, run_cli, save


def _cumprod_ref(x: np.ndarray, axis: int, exclusive: bool, reverse: bool) -> np.ndarray:
    """ONNX's CumProd in float64 (integers: in their own type, wrapping as ONNX does)."""
    acc = x.astype(np.float64) if x.dtype.kind == "f" else x
    acc = np.flip(acc, axis) if reverse else acc
    out = np.cumprod(acc, axis=axis, dtype=acc.dtype)
    if exclusive:
        out = np.concatenate([np.ones_like(np.take(out, [0], axis)), np.take(out, range(out.shape[axis] - 1), axis)], axis)
    return np.flip(out, axis) if reverse else out


@pytest.mark.parametrize("dtype,axis", [(np.float32, -2), (np.float32, 0), (np.int32, 2), (np.float64, 1)])
@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumprod(tmp_path, rng, dtype, axis, exclusive, reverse):
    from compiler import compile_model, load

    shape = (3, 5, 7)
    x = (rng.uniform(0.5, 1.5, shape) if np.dtype(dtype).kind == "f" else rng.integers(-3, 4, shape)).astype(dtype)
    elem = {np.float32: TP.FLOAT, np.float64: TP.DOUBLE, np.int32: TP.INT32}[dtype]
    node = helper.make_node("CumProd", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)
    model = make_model([node], [("x", elem, list(shape))], [("y", elem, list(shape))],
                       {"axis": np.array(axis, np.int64)}, opset=26)
    compile_model(save(model, tmp_path / "m.onnx"), "cpu", tmp_path / "m.tvmpkg")
    y = load(tmp_path / "m.tvmpkg")(x=x)["y"]
    want = _cumprod_ref(x, axis, bool(exclusive), bool(reverse))
    assert y.dtype == x.dtype
    np.testing.assert_allclose(y.astype(np.float64), want.astype(np.float64), rtol=1e-6 if dtype == np.float32 else 0)


def test_cumprod_runtime_axis_suggests_binding(capsys, tmp_path):
    node = helper.make_node("CumProd", ["x", "axis"], ["y"])
    model = make_model([node], [("x", TP.FLOAT, [4]), ("axis", TP.INT64, [])], [("y", TP.FLOAT, [4])], opset=26)
    r = run_cli(capsys, "compile", save(model, tmp_path / "m.onnx"), "-t", "cpu")
    assert r.code == 2 and "CumProd" in r.err and "--bind-input axis=FILE.npy" in r.err, r.err


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("size,periodic,dtype", [(7, 1, TP.FLOAT), (10, 0, TP.FLOAT), (13, 0, TP.DOUBLE),
                                                 (2, 1, TP.DOUBLE)])
def test_windows(capsys, tmp_path, op, size, periodic, dtype):
    """The size is a graph input here, bound at compile time (the node tests' form); onnxruntime gets it fed."""
    node = helper.make_node(op, ["size"], ["y"], periodic=periodic, output_datatype=dtype)
    model = make_model([node], [("size", TP.INT64, [])], [("y", dtype, [size])], opset=17)
    from compiler import load

    np.save(tmp_path / "size.npy", np.array(size, np.int64))
    src = save(model, tmp_path / "m.onnx")
    r = run_cli(capsys, "compile", src, "-t", "cpu", "-o", tmp_path / "m.tvmpkg", "--bind-input", f"size={tmp_path / 'size.npy'}")
    assert r.code == 0, r.err
    y = load(tmp_path / "m.tvmpkg")()["y"]
    want = ort_run(src, {"size": np.array(size, np.int64)})["y"]
    assert y.dtype == want.dtype and y.shape == (size,)
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-7)
