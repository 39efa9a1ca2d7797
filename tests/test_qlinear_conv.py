"""QLinearConv (``compiler/frontend/converters_ops.py``) against onnx's ReferenceEvaluator, exactly: random
uint8/int8 data, zero points, a per-output-channel weight scale, an int32 bias, strides and pads."""

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper
from onnx.reference import ReferenceEvaluator

from helpers import make_model, save


@pytest.mark.parametrize("dtype,per_channel", [(np.uint8, True), (np.int8, False)])
def test_qlinear_conv(tmp_path, rng, dtype, per_channel):
    from compiler import compile_model, load

    info = np.iinfo(dtype)
    elem = TP.UINT8 if dtype == np.uint8 else TP.INT8
    x = rng.integers(info.min, info.max + 1, (2, 3, 7, 6)).astype(dtype)
    consts = {
        "xs": np.array(0.02, np.float32), "xz": np.array(rng.integers(info.min, info.max + 1), dtype),
        "w": rng.integers(info.min, info.max + 1, (4, 3, 3, 2)).astype(dtype),
        "ws": (rng.uniform(0.005, 0.02, 4) if per_channel else np.array(0.01)).astype(np.float32),
        "wz": np.array(0 if per_channel else 3, dtype),
        "ys": np.array(0.3, np.float32), "yz": np.array(info.min + 100, dtype),
        "b": rng.integers(-500, 500, 4).astype(np.int32),
    }
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"],
                            strides=[2, 1], pads=[1, 0, 1, 1])
    model = make_model([node], [("x", elem, list(x.shape))], [("y", elem, [2, 4, 4, 6])], consts, opset=10)
    compile_model(save(model, tmp_path / "m.onnx"), "cpu", tmp_path / "m.tvmpkg")
    got = load(tmp_path / "m.tvmpkg")(x=x)["y"]
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    np.testing.assert_array_equal(got, want)
