"""Clip (ReLU6 and friends) through our converter: every bound form against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.helpers import compile_and_compare, make_model


@pytest.mark.parametrize(
    "opset, bounds",
    [(6, {"min": -0.5, "max": 0.7}), (6, {}), (13, (0.0, 6.0)), (13, (None, 0.3)), (13, (-0.2, None)), (13, (np.nan, 0.5))],
)
def test_clip_bounds(capsys, tmp_path, rng, opset, bounds):
    inits, names = {}, ["x"]
    if opset >= 11:
        for key, value in zip(("lo", "hi"), bounds):
            names.append("" if value is None else key)
            if value is not None:
                inits[key] = np.array(value, np.float32)
        node = helper.make_node("Clip", names, ["y"])
    else:
        node = helper.make_node("Clip", names, ["y"], **bounds)
    model = make_model([node], [("x", TensorProto.FLOAT, [3, 17])], [("y", TensorProto.FLOAT, [3, 17])], inits, opset=opset)
    x = rng.standard_normal((3, 17)).astype(np.float32) * 3
    ours, ref = compile_and_compare(capsys, tmp_path, model, {"x": x})
    np.testing.assert_array_equal(ours["y"], ref["y"])
