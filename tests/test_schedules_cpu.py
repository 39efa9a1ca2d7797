"""CPU conv2d / matmul rules and fast-math legalisations: odd shapes against onnxruntime, through the CLI."""

from __future__ import annotations

import json
import math
import zipfile

import numpy as np
import pytest
import tvm
import tvm_ffi
from onnx import TensorProto, helper

from tests.helpers import compile_and_compare, make_model, rel_err, save

F = TensorProto.FLOAT


def _kernels(tmp_path) -> dict[str, str]:
    with zipfile.ZipFile(tmp_path / "model.tvmpkg") as zf:
        return json.loads(zf.read("manifest.json"))["kernels"]


def _hand_kernel(tmp_path, model, rule: str) -> tvm.tirx.PrimFunc:
    """The one kernel of ``model`` that ``rule`` scheduled for ``cpu``, as the pipeline prepares it (no build)."""
    from compiler import pipeline

    prep = pipeline.prepare(save(model, tmp_path / "m.onnx"), "cpu")
    (name,) = [n for n, r in prep.hand.items() if r == rule]
    return prep.mod[name]


@pytest.mark.parametrize(
    "ic, oc, hw, k, stride, pad, dilation",
    # OC of no vector width, HWIO weights; OC of whole weight panels (32 channels), 7x7 output and a strided 1x1; rows of
    # 28 columns (AVX-512: two 14-column tiles) and a strided 1x1 over 14 columns
    [(3, 16, 17, 3, 2, 1, 1), (8, 24, 9, 1, 1, 0, 1), (5, 40, 11, 3, 1, 2, 2), (4, 7, 6, 5, 1, 2, 1),
     (6, 64, 7, 3, 1, 1, 1), (16, 32, 10, 1, 2, 0, 1), (9, 64, 28, 3, 1, 1, 1), (12, 32, 27, 1, 2, 0, 1)],
)
def test_conv_bias_relu_residual(capsys, tmp_path, rng, ic, oc, hw, k, stride, pad, dilation):
    """Conv + bias + ReLU + residual add in one kernel; stride, padding, dilation, OC of no vector width."""
    w = rng.standard_normal((oc, ic, k, k)).astype(np.float32) * 0.3
    b = rng.standard_normal(oc).astype(np.float32)
    out = (hw + 2 * pad - dilation * (k - 1) - 1) // stride + 1
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[stride] * 2, pads=[pad] * 4, dilations=[dilation] * 2),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Add", ["r", "skip"], ["y"]),
    ]
    model = make_model(
        nodes, [("x", F, [2, ic, hw, hw]), ("skip", F, [2, oc, out, out])], [("y", F, [2, oc, out, out])], {"w": w, "b": b}
    )
    inputs = {"x": rng.standard_normal((2, ic, hw, hw)).astype(np.float32),
              "skip": rng.standard_normal((2, oc, out, out)).astype(np.float32)}
    ours, ref = compile_and_compare(capsys, tmp_path, model, inputs)
    assert rel_err(ours["y"], ref["y"]) < 1e-5
    assert list(_kernels(tmp_path).values()) == ["hand:CpuConv2d"]  # bias, ReLU and the residual fused into it


@pytest.mark.parametrize("h, w", [(56, 64), (28, 36)])
def test_pointwise_conv_over_many_pixels_is_a_gemm(capsys, tmp_path, rng, h, w):
    """A 1x1 stride-1 conv over >= 28x28 pixels runs as a GEMM with vectors along the pixels (CpuMatmul), with
    its bias, ReLU6 and residual add fused; odd channel counts (MobileNetV2's 24 -> 144)."""
    weight = rng.standard_normal((40, 24, 1, 1)).astype(np.float32) * 0.3
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Clip", ["c", "lo", "hi"], ["r"]),
             helper.make_node("Add", ["r", "skip"], ["y"])]
    inits = {"w": weight, "b": rng.standard_normal(40).astype(np.float32), "lo": np.array(0, np.float32),
             "hi": np.array(6, np.float32)}
    model = make_model(nodes, [("x", F, [2, 24, h, w]), ("skip", F, [2, 40, h, w])], [("y", F, [2, 40, h, w])],
                       inits)
    inputs = {"x": rng.standard_normal((2, 24, h, w)).astype(np.float32) * 2,
              "skip": rng.standard_normal((2, 40, h, w)).astype(np.float32)}
    ours, ref = compile_and_compare(capsys, tmp_path, model, inputs)
    assert rel_err(ours["y"], ref["y"]) < 1e-5
    assert list(_kernels(tmp_path).values()) == ["hand:CpuMatmul"]


@pytest.mark.parametrize("ic, blocked", [(64, True), (2048, False)])
def test_gemm_tile_streams_a_block_of_columns(tmp_path, rng, ic, blocked):
    """Each parallel GEMM tile runs over a block of consecutive column tiles, storing the accumulators after each
    (an output row written in long runs), as many as keep B's slice within ``B_BLOCK_BYTES``: several for a 1x1
    conv's K = 64, one for K = 2048 (the transformer GEMMs' case, unchanged)."""
    w = rng.standard_normal((48, ic, 1, 1)).astype(np.float32)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"])], [("x", F, [1, ic, 56, 56])],
                       [("y", F, [1, 48, 56, 56])], {"w": w})
    func = _hand_kernel(tmp_path, model, "CpuMatmul")
    out = func.params[-1].name
    loops: list = []
    tvm_ffi.structural_walk(func.body, [(tvm.tirx.For, loops.append)])
    (tile,) = [f for f in loops if f.kind == tvm.tirx.ForKind.PARALLEL]
    block = tile.body
    assert isinstance(block, tvm.tirx.For) and block.kind == tvm.tirx.ForKind.SERIAL, func.script()[-2000:]
    assert (int(block.extent) > 1) == blocked
    stores: list[str] = []
    tvm_ffi.structural_walk(block.body, [(tvm.tirx.BufferStore, lambda st: stores.append(st.buffer.name))])
    assert out in stores  # the accumulators are stored inside the block, once per column tile


@pytest.mark.parametrize("k, stride, pad, packed", [(3, 1, 1, True), (1, 2, 0, True), (3, 1, 0, True), (1, 1, 0, False)])
def test_conv_reads_its_input_channels_last(tmp_path, rng, k, stride, pad, packed):
    """A conv whose input is padded, strided or read by a window reads a channels-last copy of it ([N, H, W, C], made
    once per call: the padded copy itself where there is one), its reduction runs over (KH, KW, IC) with IC
    innermost, and on AVX-512 a row of 28 output columns takes two 14-column register tiles; a 1x1 stride-1 conv
    reads its NCHW input directly."""
    from compiler import targets
    from schedules.common import vector_shape

    ic, hw = 24, 30
    out = (hw + 2 * pad - k) // stride + 1
    w = rng.standard_normal((64, ic, k, k)).astype(np.float32)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], strides=[stride] * 2, pads=[pad] * 4)],
                       [("x", F, [1, ic, hw, hw])], [("y", F, [1, 64, out, out])], {"w": w})
    func = _hand_kernel(tmp_path, model, "CpuConv2d")
    blocks: list = []
    tvm_ffi.structural_walk(func.body, [(tvm.s_tir.SBlock, blocks.append)])
    (conv,) = [b for b in blocks if b.name_hint == "conv2d_nchw_hwio_update"]
    data = conv.reads[1].source  # (reads[0]: the accumulator)
    if packed:
        assert not any(data.same_as(p) for p in func.params)
        assert [int(d) for d in data.shape] == [1, hw + 2 * pad, hw + 2 * pad, ic], data.shape
    else:
        assert data.same_as(func.params[0])
    loops: list = []
    tvm_ffi.structural_walk(func.body, [(tvm.tirx.For, loops.append)])
    inside = {}  # reduction loop -> the loops nested in it
    for f in loops:
        if (name := str(f.loop_var)) in ("ry", "rx", "rc"):
            nested: list = []
            tvm_ffi.structural_walk(f.body, [(tvm.tirx.For, lambda g: nested.append(str(g.loop_var)))])
            inside[name] = set(nested)
    assert {"rx", "rc"} <= inside["ry"] and "rc" in inside["rx"] and not {"ry", "rx"} & inside["rc"]
    if out == 28 and vector_shape(targets.resolve("cpu").target, "float32")[0] == 16:
        columns = {int(f.extent) for f in loops if f.kind == tvm.tirx.ForKind.UNROLLED and str(f.loop_var).startswith("x")}
        assert columns == {14}  # (the tile's update and its initialisation)


def test_conv_epilogue_is_stored_in_vectors(tmp_path, rng):
    """The tile's epilogue (bias + residual) is written with vector stores along the output row: scalar
    stores of it made a fused 1x1 conv 3x slower than the same conv without epilogue (20 x 20 pixels: fewer than
    a pointwise GEMM takes)."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Add", ["c", "x"], ["y"])]
    w = rng.standard_normal((16, 16, 1, 1)).astype(np.float32)
    model = make_model(nodes, [("x", F, [1, 16, 20, 20])], [("y", F, [1, 16, 20, 20])],
                       {"w": w, "b": rng.standard_normal(16).astype(np.float32)})
    func = _hand_kernel(tmp_path, model, "CpuConv2d")
    out = func.params[-1].name
    vector_stores = []

    def stores_out(node) -> None:
        tvm_ffi.structural_walk(node.body, [(tvm.tirx.BufferStore, lambda st: vector_stores.append(st.buffer.name))])

    tvm_ffi.structural_walk(func.body, [(tvm.tirx.For, lambda f: stores_out(f) if f.kind == tvm.tirx.ForKind.VECTORIZED else None)])
    assert out in vector_stores, func.script()[-1500:]


@pytest.mark.parametrize("m, k, n", [(7, 33, 48), (13, 20, 37), (1, 64, 1000), (1, 9, 5)])
def test_matmul_bias_gelu(capsys, tmp_path, rng, m, k, n):
    """Dense + bias + GELU (fast erf); N not a multiple of the vector width (padded), batch-1 heads."""
    w = rng.standard_normal((k, n)).astype(np.float32) * 0.2
    b = rng.standard_normal(n).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["a"]),
             helper.make_node("Gelu", ["a"], ["y"])]
    model = make_model(nodes, [("x", F, [m, k])], [("y", F, [m, n])], {"w": w, "b": b}, opset=20)
    x = rng.standard_normal((m, k)).astype(np.float32)
    ours, ref = compile_and_compare(capsys, tmp_path, model, {"x": x})
    assert rel_err(ours["y"], ref["y"]) < 1e-5
    assert "hand:CpuMatmul" in _kernels(tmp_path).values()


def test_batched_attention_matmuls_and_tanh(capsys, tmp_path, rng):
    """q @ k^T and p @ v over (batch, heads) with an odd sequence length, then tanh (fast tanh)."""
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("MatMul", ["s", "v"], ["o"]),
        helper.make_node("Tanh", ["o"], ["y"]),
    ]
    shape = [2, 3, 19, 16]
    model = make_model(nodes, [(n, F, shape) for n in "qkv"], [("y", F, shape)])
    inputs = {n: rng.standard_normal(shape).astype(np.float32) * 0.3 for n in "qkv"}
    ours, ref = compile_and_compare(capsys, tmp_path, model, inputs)
    assert rel_err(ours["y"], ref["y"]) < 1e-5


def test_tanh_gelu_chain(capsys, tmp_path, rng):
    """GPT-2's GELU as exported: Pow(x, 3) and Tanh in an elementwise chain (one vectorised kernel)."""
    c = {"three": np.array(3.0, np.float32), "a": np.array(0.044715, np.float32),
         "s": np.array(np.sqrt(2 / np.pi), np.float32), "half": np.array(0.5, np.float32), "one": np.array(1.0, np.float32)}
    nodes = [helper.make_node("Pow", ["x", "three"], ["p"]), helper.make_node("Mul", ["p", "a"], ["pa"]),
             helper.make_node("Add", ["x", "pa"], ["u"]), helper.make_node("Mul", ["u", "s"], ["us"]),
             helper.make_node("Tanh", ["us"], ["t"]), helper.make_node("Add", ["t", "one"], ["t1"]),
             helper.make_node("Mul", ["x", "t1"], ["xt"]), helper.make_node("Mul", ["xt", "half"], ["y"])]
    model = make_model(nodes, [("x", F, [3, 1000, 7])], [("y", F, [3, 1000, 7])], c)
    x = rng.standard_normal((3, 1000, 7)).astype(np.float32) * 3
    ours, ref = compile_and_compare(capsys, tmp_path, model, {"x": x})
    assert rel_err(ours["y"], ref["y"]) < 1e-5
    assert list(_kernels(tmp_path).values()) == ["hand:CpuElementwise"]


def test_sigmoid_and_silu_are_vectorised(capsys, tmp_path, rng):
    """Sigmoid (alone, and as EfficientNet's SiLU after a 1x1 conv) is a polynomial exp, no scalar libm call: against
    float64 at the special values (-inf, +inf, NaN, huge and tiny magnitudes) and against onnxruntime."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Sigmoid", ["c"], ["s"]),
             helper.make_node("Mul", ["c", "s"], ["y"]), helper.make_node("Sigmoid", ["z"], ["g"])]
    special = np.array([-np.inf, np.inf, np.nan, 3e38, -3e38, 1e30, -1e30, 0.0, -0.0, 88.0, -87.0, 20.0, -20.0, 1e-30],
                       np.float32)
    model = make_model(nodes, [("x", F, [1, 13, 11, 11]), ("z", F, [5, 37])],
                       [("y", F, [1, 37, 11, 11]), ("g", F, [5, 37])],
                       {"w": rng.standard_normal((37, 13, 1, 1)).astype(np.float32)})
    z = (rng.standard_normal((5, 37)) * 10).astype(np.float32)
    z.flat[:special.size] = special
    ours, ref = compile_and_compare(capsys, tmp_path, model,
                                    {"x": rng.standard_normal((1, 13, 11, 11)).astype(np.float32), "z": z})
    assert rel_err(ours["y"], ref["y"]) < 1e-5
    with np.errstate(over="ignore"):
        exact = 1 / (1 + np.exp(-z.astype(np.float64)))
    np.testing.assert_allclose(ours["g"], exact, rtol=1e-6, atol=1e-37)  # (NaN where the input is NaN)
    kernels = _kernels(tmp_path)
    assert "hand:CpuConv2d" in kernels.values() and "default" not in kernels.values(), kernels
    from compiler import pipeline

    prep = pipeline.prepare(save(model, tmp_path / "m.onnx"), "cpu")
    for name in prep.hand:
        assert "T.exp(" not in prep.mod[name].script() and "T.sigmoid(" not in prep.mod[name].script()


# strided: an odd padded row (gathers), an even one (a row in one vector of a phase), a row wider than 32, no padding
# (no copy to deal); stride 1 with a row in one vector; a row wider than 32 (vectors of a divisor); no padding (no copy)
@pytest.mark.parametrize("c, hw, stride, pad", [(24, 15, 2, 1), (7, 16, 2, 1), (5, 70, 2, 1), (4, 17, 2, 0), (8, 14, 1, 1),
                                                (5, 9, 1, 1), (3, 40, 1, 1), (6, 12, 1, 0)])
def test_depthwise_relu6(capsys, tmp_path, rng, c, hw, stride, pad):
    """MobileNet's depthwise 3x3 + bias + ReLU6 (Clip)."""
    w = rng.standard_normal((c, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["d"], group=c, strides=[stride] * 2, pads=[pad] * 4),
             helper.make_node("Clip", ["d", "lo", "hi"], ["y"])]
    out = (hw + 2 * pad - 3) // stride + 1
    inits = {"w": w, "b": b, "lo": np.array(0, np.float32), "hi": np.array(6, np.float32)}
    model = make_model(nodes, [("x", F, [2, c, hw, hw])], [("y", F, [2, c, out, out])], inits)
    x = rng.standard_normal((2, c, hw, hw)).astype(np.float32) * 2
    ours, ref = compile_and_compare(capsys, tmp_path, model, {"x": x})
    assert rel_err(ours["y"], ref["y"]) < 1e-5
    assert "hand:CpuDepthwise" in _kernels(tmp_path).values()


# ResNet's 3x3 stride-2 max pool over an odd plane; GoogLeNet's stride-1 one and its stride-2 one rounding up (ceil_mode);
# DenseNet's 2x2 average over an odd plane; Inception's padded 3x3 average without and with the padding counted; a
# row wider than 32 (vectors of a divisor); a strided pool without padding (no copy to deal into phases)
@pytest.mark.parametrize("op, c, hw, k, stride, pad, attrs", [
    ("MaxPool", 6, 15, 3, 2, 1, {}), ("MaxPool", 5, 14, 3, 1, 1, {}), ("MaxPool", 3, 14, 3, 2, 0, {"ceil_mode": 1}),
    ("AveragePool", 7, 13, 2, 2, 0, {}), ("AveragePool", 4, 11, 3, 1, 1, {"count_include_pad": 0}),
    ("AveragePool", 4, 11, 3, 1, 1, {"count_include_pad": 1}), ("MaxPool", 2, 70, 2, 2, 0, {}), ("MaxPool", 3, 17, 3, 2, 0, {})])
def test_pooling(capsys, tmp_path, rng, op, c, hw, k, stride, pad, attrs):
    """Max and average pools against onnxruntime, on the pool rule."""
    nodes = [helper.make_node(op, ["x"], ["y"], kernel_shape=[k, k], strides=[stride] * 2, pads=[pad] * 4, **attrs)]
    out = -(-(hw + 2 * pad - k) // stride) + 1 if attrs.get("ceil_mode") else (hw + 2 * pad - k) // stride + 1
    model = make_model(nodes, [("x", F, [2, c, hw, hw])], [("y", F, [2, c, out, out])])
    ours, ref = compile_and_compare(capsys, tmp_path, model, {"x": rng.standard_normal((2, c, hw, hw)).astype(np.float32)})
    assert ours["y"].shape == ref["y"].shape and rel_err(ours["y"], ref["y"]) < 1e-6
    assert "hand:CpuPool" in _kernels(tmp_path).values()


def test_strided_pool_reads_phases_of_a_plane_copy(tmp_path):
    """DenseNet's 2x2 stride-2 average pool pads nothing, yet reads a copy of each plane dealt into two phases, as a
    padded strided window does: its taps gathering every other column ran 0.86x TVM's scalar default on one core."""
    model = make_model([helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2])],
                       [("x", F, [1, 8, 20, 20])], [("y", F, [1, 8, 10, 10])])
    shapes = []
    tvm_ffi.structural_walk(_hand_kernel(tmp_path, model, "CpuPool").body, [(tvm.s_tir.SBlock, lambda b: shapes.extend(
        [int(d) for d in buf.shape] for buf in b.alloc_buffers))])
    assert [1, 8, 20, 2, 10] in shapes


# RegNet's groups of 8 channels (stride 2, padded), ResNeXt's of 4, 3 channels a group over an odd plane, a group of
# 32 (the most the rule takes) and one of 33 (left to TVM's default)
@pytest.mark.parametrize("c, width, hw, stride, rule", [(24, 8, 15, 2, "hand:CpuDepthwise"), (16, 4, 9, 1, "hand:CpuDepthwise"),
                                                        (9, 3, 7, 1, "hand:CpuDepthwise"), (64, 32, 6, 1, "hand:CpuDepthwise"),
                                                        (66, 33, 5, 1, "default")])
def test_grouped_conv_bias_relu(capsys, tmp_path, rng, c, width, hw, stride, rule):
    """A grouped 3x3 conv + bias + ReLU with few channels a group takes the depthwise schedule, its reduction over the
    group's channels too (TVM's default group conv, one scalar thread, ran RegNetY-400MF's 3-14x slower)."""
    w = rng.standard_normal((c, width, 3, 3)).astype(np.float32) * 0.3
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["d"], group=c // width, strides=[stride] * 2, pads=[1] * 4),
             helper.make_node("Relu", ["d"], ["y"])]
    out = (hw - 1) // stride + 1
    model = make_model(nodes, [("x", F, [2, c, hw, hw])], [("y", F, [2, c, out, out])],
                       {"w": w, "b": rng.standard_normal(c).astype(np.float32)})
    ours, ref = compile_and_compare(capsys, tmp_path, model, {"x": rng.standard_normal((2, c, hw, hw)).astype(np.float32)})
    assert rel_err(ours["y"], ref["y"]) < 1e-5
    assert list(_kernels(tmp_path).values()) == [rule]


@pytest.mark.parametrize("hw, phased", [(16, True), (15, False)])
def test_strided_depthwise_reads_phases_of_its_padded_copy(tmp_path, rng, hw, phased):
    """A stride-2 depthwise conv's padded plane is copied with its columns dealt into two phases (even, odd), so
    that each tap reads a contiguous vector (gathering every other column ran MobileNetV2's stride-2 layers at
    0.57-0.69x onnxruntime); a padded row of odd length cannot be dealt evenly and keeps the plain copy."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], group=4, strides=[2, 2], pads=[1, 1, 1, 1])]
    out = (hw - 1) // 2 + 1
    model = make_model(nodes, [("x", F, [1, 4, hw, hw])], [("y", F, [1, 4, out, out])],
                       {"w": rng.standard_normal((4, 1, 3, 3)).astype(np.float32)})
    shapes = []
    tvm_ffi.structural_walk(_hand_kernel(tmp_path, model, "CpuDepthwise").body, [(tvm.s_tir.SBlock, lambda b: shapes.extend(
        [int(d) for d in buf.shape] for buf in b.alloc_buffers if buf.name == "pad_temp"))])
    assert shapes == ([[1, 4, hw + 2, 2, (hw + 2) // 2]] if phased else [[1, 4, hw + 2, hw + 2]])


@pytest.mark.parametrize("hw, stride, grouped", [(14, 1, True), (14, 2, True), (7, 1, False), (54, 1, False)])
def test_small_depthwise_planes_are_copied_in_groups(tmp_path, rng, hw, stride, grouped):
    """Planes whose padded copy is small are copied ``COPY_BYTES`` at a time before their windows read them (a 14 x 14
    plane's 1 KB copied and read one at a time ran MobileNetV2's 576-channel stride-2 layer 5x slower): the loop spread
    over the cores runs over groups of channels; a 56 x 56 plane (13 KB) stays one at a time, and so does a 7 x 7 one
    (grouped, MobileNetV2's ran 0.86-0.94x)."""
    c = 192
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], group=c, strides=[stride] * 2, pads=[1, 1, 1, 1])]
    out = (hw - 1) // stride + 1
    model = make_model(nodes, [("x", F, [1, c, hw, hw])], [("y", F, [1, c, out, out])],
                       {"w": rng.standard_normal((c, 1, 3, 3)).astype(np.float32)})
    loops: list = []
    tvm_ffi.structural_walk(_hand_kernel(tmp_path, model, "CpuDepthwise").body, [(tvm.tirx.For, loops.append)])
    (spread,) = [int(f.extent) for f in loops if f.kind == tvm.tirx.ForKind.PARALLEL]
    assert (spread < c) == grouped


# asymmetric zero padding of H and W in front of a conv with padding of its own; a non-zero value; channels padded
@pytest.mark.parametrize("pads, value, folded", [([0, 0, 1, 2, 0, 0, 2, 1], 0.0, True),
                                                 ([0, 0, 1, 1, 0, 0, 1, 1], 0.5, False),
                                                 ([0, 1, 1, 1, 0, 0, 1, 1], 0.0, False)])
def test_zero_pad_before_conv_folds_into_it(capsys, tmp_path, rng, pads, value, folded):
    """An explicit Pad of zeros on the spatial axes before a Conv (TF-converted models, nn.ZeroPad2d) becomes the
    Conv's own padding (onnxscript's fuse_pad_into_conv): one conv kernel, where the imported Pad is a gather and a
    select per axis. Any other Pad stays, and the result is the same."""
    w = rng.standard_normal((8, 3 + pads[1] + pads[5], 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Pad", ["x", "pads", "value"], ["p"]),
             helper.make_node("Conv", ["p", "w"], ["y"], pads=[1, 0, 0, 1])]
    out = [2, 8, 13 + pads[2] + pads[6] - 1, 11 + pads[3] + pads[7] - 1]  # (3x3 kernel, 1 more row, 1 more column)
    model = make_model(nodes, [("x", F, [2, 3, 13, 11])], [("y", F, out)],
                       {"pads": np.array(pads, np.int64), "value": np.array(value, np.float32), "w": w}, opset=18)
    ours, ref = compile_and_compare(capsys, tmp_path, model, {"x": rng.standard_normal((2, 3, 13, 11)).astype(np.float32)})
    assert rel_err(ours["y"], ref["y"]) < 1e-5
    assert (list(_kernels(tmp_path).values()) == ["hand:CpuConv2d"]) == folded, _kernels(tmp_path)


def _layer_norm64(x: np.ndarray, scale: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(np.float64)
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + eps) * scale + bias


@pytest.mark.parametrize("shape, rule", [((3, 5, 768), "hand:CpuRowReduction"), ((2, 7, 36), "hand:CpuRowReduction"),
                                         ((4, 33), "default")])
def test_residual_layer_norm(capsys, tmp_path, rng, shape, rule):
    """BERT's residual Add + LayerNormalization: the LayerNorm kernel has its rows over the cores and vectorised
    reductions (rows whose length no vector width divides keep the default schedule). Far-from-zero means test
    the two-pass variance."""
    cols = shape[-1]
    scale, bias = rng.standard_normal(cols).astype(np.float32), rng.standard_normal(cols).astype(np.float32)
    nodes = [helper.make_node("Add", ["x", "r"], ["s"]),
             helper.make_node("LayerNormalization", ["s", "scale", "bias"], ["y"], axis=-1, epsilon=1e-5)]
    model = make_model(nodes, [("x", F, list(shape)), ("r", F, list(shape))], [("y", F, list(shape))],
                       {"scale": scale, "bias": bias})
    x = (rng.standard_normal(shape) * 0.5 + 300).astype(np.float32)
    r = rng.standard_normal(shape).astype(np.float32)
    ours, _ = compile_and_compare(capsys, tmp_path, model, {"x": x, "r": r})
    ref = _layer_norm64(x.astype(np.float64) + r, scale, bias, 1e-5)
    assert np.abs(ours["y"] - ref).max() < 2e-3 * np.abs(ref).max()  # float32 rounding of x + r ~ 3e-5 of 300
    assert [v for k, v in _kernels(tmp_path).items() if "layer_norm" in k] == [rule]


@pytest.mark.parametrize("rows", [(5, 9), (1, 1)])
def test_rms_norm(capsys, tmp_path, rng, rows):
    """RMSNorm as exported from PyTorch: its mean of squares is a row reduction (the rest elementwise). One row (a
    decoding step) once made the matmul rule take the mean for a vector-matrix product and fail."""
    cols = 96
    nodes = [helper.make_node("Mul", ["x", "x"], ["sq"]), helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
             helper.make_node("Add", ["ms", "eps"], ["mse"]), helper.make_node("Sqrt", ["mse"], ["rms"]),
             helper.make_node("Reciprocal", ["rms"], ["inv"]), helper.make_node("Mul", ["x", "inv"], ["n"]),
             helper.make_node("Mul", ["n", "g"], ["y"])]
    g = rng.standard_normal(cols).astype(np.float32)
    model = make_model(nodes, [("x", F, [*rows, cols])], [("y", F, [*rows, cols])],
                       {"axes": np.array([-1], np.int64), "eps": np.array(1e-6, np.float32), "g": g}, opset=18)
    x = rng.standard_normal((*rows, cols)).astype(np.float32)
    ours, _ = compile_and_compare(capsys, tmp_path, model, {"x": x})
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-6) * g
    assert rel_err(ours["y"], ref) < 1e-5
    assert "hand:CpuRowReduction" in _kernels(tmp_path).values() and "default" not in _kernels(tmp_path).values()


# MobileNetV3's gate (HardSigmoid) over an odd channel count and a plane of 9 vectors; EfficientNet's (Sigmoid, after a
# SiLU) over 7 x 7 (49 pixels: no vector divides them, the pool keeps TVM's lowering, the gate's loop runs along rows of 7)
@pytest.mark.parametrize("c, hw, gate, pool", [(37, 12, "HardSigmoid", "hand:CpuRowReduction"), (20, 7, "Sigmoid", "default")])
def test_squeeze_and_excitation_block(capsys, tmp_path, rng, c, hw, gate, pool):
    """A squeeze-and-excitation block: global average pool, 1x1 conv + Relu, 1x1 conv + gate, the gate times the
    feature map. The pool is a vectorised row reduction over the plane; the second conv keeps its kernel, its gate
    multiplying the map after it as a parallel vector loop (the conv rule once gave up on the broadcast: default)."""
    r = 8
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"]), helper.make_node("Sigmoid", ["c0"], ["s0"]),
             helper.make_node("Mul", ["c0", "s0"], ["f"]),  # SiLU, as EfficientNet's
             helper.make_node("GlobalAveragePool", ["f"], ["p"]), helper.make_node("Conv", ["p", "w1", "b1"], ["c1"]),
             helper.make_node("Relu", ["c1"], ["h"]), helper.make_node("Conv", ["h", "w2", "b2"], ["c2"]),
             helper.make_node(gate, ["c2"], ["g"]), helper.make_node("Mul", ["f", "g"], ["y"])]
    inits = {"w0": rng.standard_normal((c, 5, 1, 1)).astype(np.float32), "w1": rng.standard_normal((r, c, 1, 1)).astype(np.float32),
             "b1": rng.standard_normal(r).astype(np.float32), "w2": rng.standard_normal((c, r, 1, 1)).astype(np.float32),
             "b2": rng.standard_normal(c).astype(np.float32)}
    model = make_model(nodes, [("x", F, [1, 5, hw, hw])], [("y", F, [1, c, hw, hw])], inits)
    ours, ref = compile_and_compare(capsys, tmp_path, model, {"x": rng.standard_normal((1, 5, hw, hw)).astype(np.float32)})
    assert rel_err(ours["y"], ref["y"]) < 1e-5
    kernels = _kernels(tmp_path)
    assert [v for k, v in kernels.items() if k.startswith("mean")] == [pool]
    assert [v for k, v in kernels.items() if "conv2d" in k] == ["hand:CpuConv2d"] * 3, kernels


@pytest.mark.parametrize("op, shape, axes, keepdims", [("ReduceMean", (2, 13, 6, 8), [2, 3], 0), ("ReduceSum", (3, 4, 5, 16), [-3, -2, -1], 1),
                                                        ("ReduceMean", (6, 7, 9), [1, 2], 1)])
def test_reduction_over_trailing_axes(capsys, tmp_path, rng, op, shape, axes, keepdims):
    """A mean or sum over several trailing axes is one row reduction over them (their elements are contiguous), against
    float64; 63 elements a row (no vector divides them) keep TVM's lowering of that form."""
    out = [d for i, d in enumerate(shape) if i not in [a % len(shape) for a in axes]] if not keepdims else \
        [1 if i in [a % len(shape) for a in axes] else d for i, d in enumerate(shape)]
    model = make_model([helper.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims)], [("x", F, list(shape))],
                       [("y", F, out)], {"axes": np.array(axes, np.int64)}, opset=18)
    x = (rng.standard_normal(shape) + 3).astype(np.float32)
    ours, _ = compile_and_compare(capsys, tmp_path, model, {"x": x})
    reduce = np.mean if op == "ReduceMean" else np.sum
    np.testing.assert_allclose(ours["y"], reduce(x.astype(np.float64), axis=tuple(axes), keepdims=bool(keepdims)), rtol=1e-5)
    rows = shape[-1] * shape[-2] * (shape[-3] if len(axes) == 3 else 1)
    assert list(_kernels(tmp_path).values()) == ["hand:CpuRowReduction" if rows % 4 == 0 else "default"]


@pytest.mark.parametrize("shape", [(1, 8, 6, 28), (2, 3, 5, 7), (3, 40), (2, 6, 32), (3, 28, 1), (4, 48, 1, 1)])
def test_elementwise_vectors_stay_within_rows(capsys, tmp_path, rng, shape):
    """(x + z) * g, g broadcast along rows (a gate): each row's vectors are the widest that divide it, loaded and stored
    whole (vectors across rows of 28 were read element by element: TVM does not simplify the flattened index it
    vectorises; 10x slower); rows of 7 one element at a time, in a loop per row; trailing unit axes do not count."""
    from compiler import targets
    from schedules.common import largest_divisor, vector_shape

    gate = [*shape[:-1], 1]
    nodes = [helper.make_node("Add", ["x", "z"], ["s"]), helper.make_node("Mul", ["s", "g"], ["y"])]
    model = make_model(nodes, [("x", F, list(shape)), ("z", F, list(shape)), ("g", F, gate)], [("y", F, list(shape))])
    inputs = {"x": rng.standard_normal(shape).astype(np.float32), "z": rng.standard_normal(shape).astype(np.float32),
              "g": rng.standard_normal(gate).astype(np.float32)}
    ours, ref = compile_and_compare(capsys, tmp_path, model, inputs)
    np.testing.assert_allclose(ours["y"], ref["y"], rtol=1e-6)
    assert list(_kernels(tmp_path).values()) == ["hand:CpuElementwise"]
    target = targets.resolve("cpu").target
    row = [d for d in shape if d != 1][-1]  # (trailing unit axes aside)
    lanes = largest_divisor(row, (vector_shape(target, "float32")[0], 8, 4, 2, 1))
    func = _hand_kernel(tmp_path, model, "CpuElementwise").with_attr("global_symbol", "main")
    ll = tvm.compile(tvm.IRModule({"main": func}), target).mod.inspect_source("ll")
    if lanes > 1:  # x and z in vectors; g one scalar a row (at most)
        assert f"load <{lanes} x float>" in ll and ll.count("load float, ptr") <= math.prod(shape[:-1]), ll[-3000:]


def test_split_outputs_each_get_a_vector_loop(capsys, tmp_path, rng):
    """GPT-2's qkv Split (after a Reshape): one kernel writing three outputs; each output its own parallel
    vector loop (the rule used to give up on kernels with several outputs: one scalar thread)."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]),
             helper.make_node("Split", ["r", "sizes"], ["a", "b", "c"], axis=-1)]
    model = make_model(nodes, [("x", F, [37, 3 * 80])], [(n, F, [1, 37, w]) for n, w in zip("abc", (80, 96, 64))],
                       {"shape": np.array([1, 37, 240], np.int64), "sizes": np.array([80, 96, 64], np.int64)}, opset=18)
    x = rng.standard_normal((37, 240)).astype(np.float32)
    ours, ref = compile_and_compare(capsys, tmp_path, model, {"x": x})
    for name in "abc":
        np.testing.assert_array_equal(ours[name], ref[name])
    assert list(_kernels(tmp_path).values()) == ["hand:CpuElementwise"]


def _concat_graph(case: str, rng) -> tuple[list, list, list, dict, dict]:
    """(nodes, inputs, outputs, initializers, feeds) of an ONNX graph around a Concat."""
    if case.startswith("kv-cache"):  # a decoding step's new key, reshaped to heads and appended to the cache
        h, past, d = (3, 701, 20) if case == "kv-cache-few-heads" else (8, 129, 24)
        nodes = [helper.make_node("Reshape", ["new", "heads"], ["r"]), helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3]),
                 helper.make_node("Concat", ["past", "t"], ["y"], axis=2)]
        inputs = [("new", F, [1, 1, h * d]), ("past", F, [1, h, past, d])]
        return nodes, inputs, [("y", F, [1, h, past + 1, d])], {"heads": np.array([1, 1, h, d], np.int64)}, \
            {"new": rng.standard_normal((1, 1, h * d)).astype(np.float32),
             "past": rng.standard_normal((1, h, past, d)).astype(np.float32)}
    if case.startswith("rope"):  # Llama's rotate_half: x * cos + cat(-x2, x1) * sin, back to [b, s, h, d]
        s_, h, d = (301, 5, 14) if case == "rope-odd" else (40, 4, 64)
        nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1, 3]),
                 helper.make_node("Split", ["xt"], ["x1", "x2"], axis=3, num_outputs=2),
                 helper.make_node("Neg", ["x2"], ["n2"]), helper.make_node("Concat", ["n2", "x1"], ["rot"], axis=3),
                 helper.make_node("Mul", ["xt", "cos"], ["a"]), helper.make_node("Mul", ["rot", "sin"], ["b"]),
                 helper.make_node("Add", ["a", "b"], ["sum"]), helper.make_node("Transpose", ["sum"], ["y"], perm=[0, 2, 1, 3])]
        angle = rng.uniform(0, 6.3, (1, 1, s_, d)).astype(np.float32)
        return nodes, [("x", F, [1, s_, h, d])], [("y", F, [1, s_, h, d])], {"cos": np.cos(angle), "sin": np.sin(angle)}, \
            {"x": rng.standard_normal((1, s_, h, d)).astype(np.float32)}
    if case == "rope-then-kv-cache":  # Llama's new key: rotary embedding, then appended (seams along d and seq)
        h, past, d = 3, 400, 16
        angle = rng.uniform(0, 6.3, (1, 1, 1, d)).astype(np.float32)
        nodes = [helper.make_node("Reshape", ["new", "heads"], ["r"]), helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3]),
                 helper.make_node("Split", ["t"], ["x1", "x2"], axis=3, num_outputs=2), helper.make_node("Neg", ["x2"], ["n2"]),
                 helper.make_node("Concat", ["n2", "x1"], ["rot"], axis=3), helper.make_node("Mul", ["t", "cos"], ["a"]),
                 helper.make_node("Mul", ["rot", "sin"], ["b"]), helper.make_node("Add", ["a", "b"], ["k"]),
                 helper.make_node("Concat", ["past", "k"], ["y"], axis=2)]
        return nodes, [("new", F, [1, 1, h * d]), ("past", F, [1, h, past, d])], [("y", F, [1, h, past + 1, d])], \
            {"heads": np.array([1, 1, h, d], np.int64), "cos": np.cos(angle), "sin": np.sin(angle)}, \
            {"new": rng.standard_normal((1, 1, h * d)).astype(np.float32),
             "past": rng.standard_normal((1, h, past, d)).astype(np.float32)}
    if case == "three-then-reshape":  # the concatenated axis merged into the next: selects on j // 7
        nodes = [helper.make_node("Concat", ["a", "b", "c"], ["cat"], axis=1), helper.make_node("Reshape", ["cat", "flat"], ["y"])]
        shapes = {"a": (3, 5, 7), "b": (3, 2, 7), "c": (3, 1, 7)}
        return nodes, [(n, F, list(v)) for n, v in shapes.items()], [("y", F, [3, 56])], {"flat": np.array([3, 56], np.int64)}, \
            {n: rng.standard_normal(v).astype(np.float32) for n, v in shapes.items()}
    assert case == "last-axis-then-reshape"  # the concatenated axis merged into the one before: selects on j % 8
    nodes = [helper.make_node("Concat", ["a", "b"], ["cat"], axis=2), helper.make_node("Reshape", ["cat", "flat"], ["y"])]
    return nodes, [("a", F, [2, 9, 4]), ("b", F, [2, 9, 4])], [("y", F, [2, 72])], {"flat": np.array([2, 72], np.int64)}, \
        {n: rng.standard_normal((2, 9, 4)).astype(np.float32) for n in "ab"}


CONCATS = ["kv-cache-few-heads", "kv-cache", "rope-odd", "rope", "rope-then-kv-cache", "three-then-reshape",
           "last-axis-then-reshape"]


@pytest.mark.parametrize("case", CONCATS)
def test_concatenations_are_parallel_copies(capsys, tmp_path, rng, case):
    """Concatenations (a KV cache's append, rotary embeddings' rotate_half, both in one kernel, one seen through a
    reshape) compile to one vectorised kernel: the loops their selects test split at the seams. Inlined into one
    select-per-element loop, LLVM miscompiled a rotary embedding on znver4/5."""
    nodes, inputs, outputs, inits, feeds = _concat_graph(case, rng)
    ours, ref = compile_and_compare(capsys, tmp_path, make_model(nodes, inputs, outputs, inits, opset=18), feeds)
    assert rel_err(ours["y"], ref["y"]) < 1e-6
    assert set(_kernels(tmp_path).values()) == {"hand:CpuElementwise"}


@pytest.mark.parametrize("value_shape", [(), (1,)])
def test_constant_pad_is_one_kernel_of_copies(capsys, tmp_path, rng, value_shape):
    """A Pad by a constant known at compile time (not before a Conv; a scalar, or one element as exporters also
    write it) is one kernel, its seams along three axes split into copies and fills; imported as gathers and
    selects it took two kernels per axis, the gathers on the default lowering. The same values as onnxruntime."""
    nodes = [helper.make_node("Pad", ["x", "pads", "value"], ["y"])]
    model = make_model(nodes, [("x", F, [2, 3, 13, 11])], [("y", F, [2, 4, 16, 13])],
                       {"pads": np.array([0, 0, 1, 2, 0, 1, 2, 0], np.int64),
                        "value": np.full(value_shape, 0.5, np.float32)}, opset=18)
    ours, ref = compile_and_compare(capsys, tmp_path, model, {"x": rng.standard_normal((2, 3, 13, 11)).astype(np.float32)})
    np.testing.assert_array_equal(ours["y"], ref["y"])
    assert list(_kernels(tmp_path).values()) == ["hand:CpuElementwise"], _kernels(tmp_path)


def _copies_between_buffers(func) -> int:
    """How many selects of ``func`` (lowered) still choose between loads."""
    from schedules.common import count_nodes

    def chooses(call) -> bool:
        return isinstance(call.op, tvm.ir.Op) and call.op.name.endswith("if_then_else") and any(
            count_nodes(arg, tvm.ir.expr.TensorLoad) for arg in call.args[1:])

    return count_nodes(func.body, tvm.ir.expr.Call, chooses)


def test_concatenation_selects_are_decided_per_part():
    """The scheduled kernels lower without a select between inputs (each part of the split loops reads one);
    TVM's default lowering of the same kernels keeps one per element: a KV append, rotate_half through a reshape,
    padding on one axis and on two, a rotate_half inside an append (seams along two loops). A select on two loops
    at once (``tril``'s diagonal) is refused."""
    from tvm import te, topi

    from compiler import targets
    from schedules.cpu_elementwise import CpuElementwise, cut_points

    target = targets.resolve("cpu").target
    past, new = te.placeholder((1, 3, 33, 8), name="past"), te.placeholder((1, 1, 24), name="new")
    kv = topi.concatenate([past, topi.transpose(topi.reshape(new, (1, 1, 3, 8)), (0, 2, 1, 3))], 2)
    x = te.placeholder((2, 6, 16), name="x")
    rot = topi.concatenate([topi.negative(topi.strided_slice(x, [0, 0, 8], [2, 6, 16])), topi.strided_slice(x, [0, 0, 0], [2, 6, 8])], 2)
    lowered = lambda f: tvm.tirx.get_default_tir_pipeline(target)[0](  # noqa: E731
        tvm.tirx.transform.BindTarget(target.with_host(target))(tvm.IRModule({"main": f.with_attr("global_symbol", "main")})))["main"]
    heads = topi.transpose(topi.reshape(new, (1, 1, 3, 8)), (0, 2, 1, 3))
    rope_kv = topi.concatenate([past, topi.concatenate([topi.negative(topi.strided_slice(heads, [0, 0, 0, 4], [1, 3, 1, 8])),
                                                        topi.strided_slice(heads, [0, 0, 0, 0], [1, 3, 1, 4])], 3)], 2)
    for args in ([past, new, kv], [x, topi.reshape(rot, (2, 96))], [x, topi.nn.pad(x, [0, 0, 2], [0, 0, 1])],
                 [x, topi.nn.pad(x, [0, 1, 2], [0, 1, 0])], [past, new, rope_kv]):
        func = te.create_prim_func(args)
        assert _copies_between_buffers(lowered(func)) > 0  # the check sees the unscheduled kernel's select
        assert _copies_between_buffers(lowered(CpuElementwise().apply(func, target, False).mod["main"])) == 0
    lower_triangle = te.compute((6, 6), lambda i, j: tvm.tirx.if_then_else(j <= i, x[0, i, j], 0.0), name="tril")
    assert CpuElementwise().apply(te.create_prim_func([x, lower_triangle]), target, False) is None
    v, m = tvm.tirx.Var("v", "int32"), tvm.tirx.Var("m", "int32")
    ((var, modulus), points), = cut_points([tvm.tirx.all(5 < v, v <= 9), tvm.tirx.EQ(v, 12)]).items()
    assert var.same_as(v) and modulus is None and points == {6, 10, 12, 13}
    seams = cut_points([tvm.tirx.GE(tvm.tirx.floordiv(v, 7), 2), tvm.tirx.LT(tvm.tirx.floormod(m, 8), 4)])
    assert {(k[0].name, k[1]): p for k, p in seams.items()} == {("v", None): {14}, ("m", 8): {4}}
    assert cut_points([tvm.tirx.LT(v, m)]) is None


def test_concatenation_parts_are_parallel_vector_loops():
    """Across few outer iterations (3 heads of a KV cache on this machine's cores), each part of the seam is a parallel
    loop of vectors; across many (rows of a rotate_half along the innermost axis), the rows are one parallel loop and
    each part of a row a vector loop."""
    from collections import Counter

    from tvm import te, topi

    from compiler import targets
    from schedules.cpu_elementwise import CpuElementwise

    target = targets.resolve("cpu").target

    def loop_kinds(*tensors) -> Counter:
        func = CpuElementwise().apply(te.create_prim_func(list(tensors)), target, False).mod["main"]
        kinds: Counter = Counter()
        tvm_ffi.structural_walk(func.body, [(tvm.tirx.For, lambda f: kinds.update([f.kind]))])
        return kinds

    heads = min(3, 2 * int(target.attrs["num-cores"]) - 1)  # fewer than 2 per core: the parts go outermost
    past, new = te.placeholder((1, heads, 7000, 8), name="past"), te.placeholder((1, 1, heads * 8), name="new")
    kinds = loop_kinds(past, new, topi.concatenate([past, topi.transpose(topi.reshape(new, (1, 1, heads, 8)), (0, 2, 1, 3))], 2))
    assert kinds[tvm.tirx.ForKind.PARALLEL] == 2 and kinds[tvm.tirx.ForKind.VECTORIZED] == 2, kinds
    x = te.placeholder((40, 30, 16), name="x")
    rot = topi.concatenate([topi.negative(topi.strided_slice(x, [0, 0, 8], [40, 30, 16])),
                            topi.strided_slice(x, [0, 0, 0], [40, 30, 8])], 2)
    kinds = loop_kinds(x, rot)
    assert kinds[tvm.tirx.ForKind.PARALLEL] == 1 and kinds[tvm.tirx.ForKind.VECTORIZED] == 2, kinds


def test_row_reduction_rule_leaves_matmuls_alone():
    """A matmul reduces over K too, but reads B[k, j] down a column: not a row reduction (the GEMM rule's
    kernel, and float64 ones stay tunable); a row sum over the last axis is one."""
    from tvm import te

    from compiler import targets
    from schedules.cpu_row_reduction import CpuRowReduction

    target = targets.resolve("cpu").target
    a, b = te.placeholder((64, 96), name="a"), te.placeholder((96, 48), name="b")
    k = te.reduce_axis((0, 96), "k")
    mm = te.compute((64, 48), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="mm")
    relu = te.compute((64, 48), lambda i, j: te.max(mm[i, j], 0.0), name="relu")
    assert CpuRowReduction().apply(te.create_prim_func([a, b, relu]), target, False) is None
    r = te.reduce_axis((0, 96), "r")
    total = te.compute((64,), lambda i: te.sum(a[i, r], axis=r), name="total")
    mean = te.compute((64,), lambda i: total[i] / 96.0, name="mean")
    assert CpuRowReduction().apply(te.create_prim_func([a, mean]), target, False) is not None
