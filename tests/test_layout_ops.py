"""Pad, CenterCropPad, Split, OneHot, AffineGrid, Col2Im, MaxUnpool, bool ReduceMax/ReduceMin and uint64
TopK (``compiler/frontend/converters_layout.py``, ``converters_nn.py``, ``converters_ops.py``) against onnx's
ReferenceEvaluator: odd shapes, fresh random inputs, the shape-deciding inputs as initializers."""

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper
from onnx.reference import ReferenceEvaluator

from helpers import make_model, ort_run, save

ELEM = {np.dtype(np.float32): TP.FLOAT, np.dtype(np.int32): TP.INT32, np.dtype(np.bool_): TP.BOOL,
        np.dtype(np.int64): TP.INT64, np.dtype(np.uint64): TP.UINT64}


def _check(tmp_path, node, feeds: dict[str, np.ndarray], consts: dict[str, np.ndarray], opset: int,
           ort: bool = False) -> None:
    """Compile ``node`` with ``consts`` as initializers, run on ``feeds``, compare every output exactly (floats
    to 1e-6) with the reference (``ort``: with onnxruntime, where the reference lacks a feature)."""
    from compiler import compile_model, load

    outs = [o for o in node.output if o]
    model = make_model([node], [(n, ELEM[a.dtype], list(a.shape)) for n, a in feeds.items()],
                       [(o, TP.FLOAT if ort else TP.UNDEFINED, None) for o in outs], consts, opset=opset)
    if ort:  # float outputs only
        want = list(ort_run(save(model, tmp_path / "m.onnx"), feeds).values())
    else:
        want = ReferenceEvaluator(model).run(None, feeds)
        for o, w in zip(model.graph.output, want):  # the reference tells the output types and shapes
            o.CopyFrom(helper.make_tensor_value_info(o.name, ELEM.get(w.dtype, TP.FLOAT), w.shape))
    compile_model(save(model, tmp_path / "m.onnx"), "cpu", tmp_path / "m.tvmpkg")
    got = load(tmp_path / "m.tvmpkg")(**feeds)
    for name, w in zip(outs, want):
        assert got[name].shape == w.shape and got[name].dtype == w.dtype, name
        np.testing.assert_allclose(got[name], w, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads,axes", [([2, -1, 2, 2], [1, -1]), ([1, 0, 0, 0, 2, 1], None)])
def test_pad(tmp_path, rng, mode, pads, axes):
    """Negative pads (crops), pads as wide as onnxruntime allows, a run-time constant value."""
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    consts = {"pads": np.array(pads, np.int64)}
    if axes is not None:
        consts["axes"] = np.array(axes, np.int64)
    feeds = {"x": x, "value": np.array(rng.standard_normal(), np.float32)}
    node = helper.make_node("Pad", ["x", "pads", "value", "axes" if axes else ""], ["y"], mode=mode)
    _check(tmp_path, node, feeds, consts, opset=19, ort=True)  # the reference refuses negative pads


@pytest.mark.parametrize("target,axes", [([3, 6], [0, 2]), ([7, 2, 5], None)])
def test_center_crop_pad(tmp_path, rng, target, axes):
    node = helper.make_node("CenterCropPad", ["x", "shape"], ["y"], **({"axes": axes} if axes else {}))
    _check(tmp_path, node, {"x": rng.integers(-9, 9, (4, 5, 3)).astype(np.int32)},
           {"shape": np.array(target, np.int64)}, opset=18)


@pytest.mark.parametrize("split,n", [([0, 3, 0, 4], 4), (None, 3)])
def test_split(tmp_path, rng, split, n):
    """Zero-size parts; without sizes, num_outputs parts of ceil(7 / 3) with a smaller last one."""
    outs = [f"y{k}" for k in range(n)]
    node = (helper.make_node("Split", ["x", "split"], outs, axis=1) if split else
            helper.make_node("Split", ["x"], outs, axis=1, num_outputs=n))
    consts = {"split": np.array(split, np.int64)} if split else {}
    _check(tmp_path, node, {"x": rng.standard_normal((2, 7)).astype(np.float32)}, consts, opset=18)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot(tmp_path, rng, axis):
    """Negative and out-of-range indices, a float depth (a whole one: reference and spec differ on 6.7)."""
    node = helper.make_node("OneHot", ["i", "depth", "values"], ["y"], axis=axis)
    feeds = {"i": rng.integers(-7, 9, (3, 4)).astype(np.int64), "values": np.array([3, -5], np.int32)}
    _check(tmp_path, node, feeds, {"depth": np.array(6.0, np.float32)}, opset=11)


@pytest.mark.parametrize("size", [[2, 3, 5, 7], [2, 1, 3, 4, 5]])
@pytest.mark.parametrize("align", [0, 1])
def test_affine_grid(tmp_path, rng, size, align):
    dims = len(size) - 2
    node = helper.make_node("AffineGrid", ["theta", "size"], ["grid"], align_corners=align)
    feeds = {"theta": rng.standard_normal((2, dims, dims + 1)).astype(np.float32)}
    _check(tmp_path, node, feeds, {"size": np.array(size, np.int64)}, opset=20)


@pytest.mark.parametrize("op_type", ["ReduceMax", "ReduceMin"])
def test_reduce_bool(tmp_path, rng, op_type):
    node = helper.make_node(op_type, ["x", "axes"], ["y"], keepdims=0)
    _check(tmp_path, node, {"x": rng.random((3, 5, 2)) < 0.5}, {"axes": np.array([1], np.int64)}, opset=20)


@pytest.mark.parametrize("image,kernel,dil,pads,strides", [
    ([5, 7], [2, 3], [1, 2], [1, 0, 2, 1], [2, 1]),
    ([4, 3, 5], [2, 2, 3], [1, 1, 1], [0, 1, 1, 1, 0, 0], [1, 2, 2]),
])
def test_col2im(tmp_path, rng, image, kernel, dil, pads, strides):
    """Overlapping blocks (several contributions per pixel), dilation, uneven pads."""
    nd = len(image)
    blocks = [(image[d] + pads[d] + pads[d + nd] - dil[d] * (kernel[d] - 1) - 1) // strides[d] + 1 for d in range(nd)]
    x = rng.standard_normal((2, 3 * int(np.prod(kernel)), int(np.prod(blocks)))).astype(np.float32)
    node = helper.make_node("Col2Im", ["x", "image", "block"], ["y"], dilations=dil, pads=pads, strides=strides)
    _check(tmp_path, node, {"x": x}, {"image": np.array(image, np.int64), "block": np.array(kernel, np.int64)},
           opset=18)


@pytest.mark.parametrize("output_shape", [None, [2, 3, 7, 8]])
def test_max_unpool(tmp_path, rng, output_shape):
    """Distinct random flat indices into the inferred [2, 3, 6, 6]; ``output_shape`` pads it at the ends."""
    x = rng.standard_normal((2, 3, 3, 3)).astype(np.float32)
    idx = rng.permutation(2 * 3 * 6 * 6)[:x.size].reshape(x.shape).astype(np.int64)
    node = helper.make_node("MaxUnpool", ["x", "i", "shape" if output_shape else ""], ["y"], kernel_shape=[2, 3],
                            strides=[2, 2], pads=[0, 1, 0, 0])
    consts = {"shape": np.array(output_shape, np.int64)} if output_shape else {}
    _check(tmp_path, node, {"x": x, "i": idx}, consts, opset=11)


@pytest.mark.parametrize("largest", [0, 1])
def test_top_k_uint64(tmp_path, rng, largest):
    """Values on both sides of 2**63 (an int64 cast alone would misorder them)."""
    x = rng.integers(0, 2**64 - 1, size=(3, 9), dtype=np.uint64, endpoint=True)
    x[0, :3] = [5, 2**63, 2**63 - 1]
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1, largest=largest)
    _check(tmp_path, node, {"x": x}, {"k": np.array([4], np.int64)}, opset=11)


@pytest.mark.parametrize("onesided,parts,window", [(1, 1, True), (0, 1, False), (0, 2, True)])
def test_stft(tmp_path, rng, onesided, parts, window):
    """Frames of 12 every 5 samples of 71 (the tail dropped), a random window or none, real or complex."""
    x = rng.standard_normal((2, 71, parts)).astype(np.float32)
    feeds = {"x": x, **({"w": rng.random(12).astype(np.float32)} if window else {})}
    node = helper.make_node("STFT", ["x", "step", "w" if window else "", "length"], ["y"], onesided=onesided)
    consts = {"step": np.array(5, np.int64), "length": np.array(12, np.int64)}
    _check(tmp_path, node, feeds, consts, opset=17)
