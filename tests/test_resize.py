"""Resize and Upsample (``compiler/frontend/resize.py``) against onnxruntime on fresh random inputs with odd
shapes: every coordinate transformation, fractional scales, antialias, exclude_outside, tf_crop_and_resize's
extrapolation, ``axes`` and ``keep_aspect_ratio_policy``, float and uint8 data."""

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper

from helpers import make_model, ort_run, save

X_SHAPE = (2, 3, 5, 7)


def _check(tmp_path, node, x: np.ndarray, consts: dict[str, np.ndarray], opset: int = 19) -> None:
    from compiler import compile_model, load

    elem = TP.UINT8 if x.dtype == np.uint8 else TP.FLOAT
    model = make_model([node], [("x", elem, list(x.shape))], [("y", elem, None)], consts, opset=opset)
    src = save(model, tmp_path / "m.onnx")
    want = ort_run(src, {"x": x})["y"]
    compile_model(src, "cpu", tmp_path / "m.tvmpkg")
    got = load(tmp_path / "m.tvmpkg")(x=x)["y"]
    assert got.shape == want.shape and got.dtype == want.dtype
    if x.dtype == np.uint8:  # rounding of a sum at exactly .5 may go either way
        assert np.abs(got.astype(int) - want.astype(int)).max() <= 1
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode,ctm", [
    ("nearest", "half_pixel"), ("nearest", "asymmetric"), ("linear", "half_pixel"), ("linear", "pytorch_half_pixel"),
    ("linear", "half_pixel_symmetric"), ("cubic", "half_pixel"), ("cubic", "asymmetric"),
])
@pytest.mark.parametrize("scales", [[1, 1, 0.6, 1.7], [1, 1, 2.3, 0.45]])
def test_resize_scales(tmp_path, rng, mode, ctm, scales):
    """Fractional scales: ONNX maps coordinates by the scale, not by the rounded output size."""
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode=mode, coordinate_transformation_mode=ctm,
                            nearest_mode="round_prefer_ceil" if ctm == "asymmetric" else "round_prefer_floor")
    _check(tmp_path, node, rng.standard_normal(X_SHAPE).astype(np.float32), {"scales": np.array(scales, np.float32)})


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_sizes_align_corners(tmp_path, rng, mode):
    """By sizes: align_corners with a fractional scale is ambiguous (the reference divides by scale x input
    length, onnxruntime by the output length), so it is checked where both agree."""
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode=mode,
                            coordinate_transformation_mode="align_corners")
    sizes = np.array([2, 3, 4, 11], np.int64)
    _check(tmp_path, node, rng.standard_normal(X_SHAPE).astype(np.float32), {"sizes": sizes})


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("exclude_outside", [0, 1])
def test_resize_antialias_sizes(tmp_path, rng, mode, exclude_outside):
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode=mode, antialias=1,
                            exclude_outside=exclude_outside, cubic_coeff_a=-0.5)
    _check(tmp_path, node, rng.standard_normal(X_SHAPE).astype(np.float32), {"sizes": np.array([2, 3, 3, 4], np.int64)})


@pytest.mark.parametrize("policy", ["not_larger", "not_smaller"])
@pytest.mark.parametrize("axes", [[2, 3], [3, 2]])
def test_resize_axes_keep_aspect_ratio(tmp_path, rng, policy, axes):
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="nearest", axes=axes,
                            keep_aspect_ratio_policy=policy)
    _check(tmp_path, node, rng.standard_normal(X_SHAPE).astype(np.float32), {"sizes": np.array([9, 4], np.int64)})


def test_resize_tf_crop_and_resize_uint8(tmp_path, rng):
    """An roi reaching outside the input: extrapolation_value there; uint8 rounds the interpolated values."""
    node = helper.make_node("Resize", ["x", "roi", "", "sizes"], ["y"], mode="linear", axes=[2, 3],
                            coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=7.0)
    consts = {"roi": np.array([-0.2, 0.3, 0.9, 1.25], np.float32), "sizes": np.array([4, 6], np.int64)}
    _check(tmp_path, node, rng.integers(0, 256, X_SHAPE).astype(np.uint8), consts)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample(tmp_path, rng, mode):
    node = helper.make_node("Upsample", ["x", "scales"], ["y"], mode=mode)
    consts = {"scales": np.array([1, 1, 2, 3], np.float32)}
    _check(tmp_path, node, rng.standard_normal(X_SHAPE).astype(np.float32), consts, opset=9)
