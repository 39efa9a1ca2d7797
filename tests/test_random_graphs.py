"""Random small ONNX graphs (elementwise, broadcasting, matmul, softmax, reductions; random shapes and axes)
compiled by tvmpipe and compared with onnxruntime."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as TP
from onnx import helper

from helpers import make_model, ort_run, save

UNARY = ["Relu", "Tanh", "Sigmoid", "Abs", "Neg", "Exp"]
BINARY = ["Add", "Sub", "Mul", "Max", "Min"]
REDUCE = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"]


@st.composite
def graphs(draw):
    """(nodes, initializers, input shape, output shape): a chain of 1-4 ops on one float32 input."""
    shape = draw(st.lists(st.integers(1, 6), min_size=1, max_size=4))
    in_shape = list(shape)
    nodes, inits, cur = [], {}, "x"
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    for i in range(draw(st.integers(1, 4))):
        out = f"t{i}"
        kind = draw(st.sampled_from(["unary", "binary", "softmax", "reduce", "matmul"]))
        if kind == "unary":
            nodes.append(helper.make_node(draw(st.sampled_from(UNARY)), [cur], [out]))
        elif kind == "binary":  # the other operand broadcasts: a suffix of the shape with some dims 1
            suffix = shape[len(shape) - draw(st.integers(0, len(shape))):]
            other = [d if draw(st.booleans()) else 1 for d in suffix]
            inits[f"w{i}"] = rng.standard_normal(other).astype(np.float32)
            operands = [cur, f"w{i}"] if draw(st.booleans()) else [f"w{i}", cur]
            nodes.append(helper.make_node(draw(st.sampled_from(BINARY)), operands, [out]))
        elif kind == "softmax":
            axis = draw(st.integers(-len(shape), len(shape) - 1))
            nodes.append(helper.make_node(draw(st.sampled_from(["Softmax", "LogSoftmax"])), [cur], [out], axis=axis))
        elif kind == "reduce":
            axes = sorted(draw(st.sets(st.integers(0, len(shape) - 1), min_size=1)))
            keep = draw(st.booleans()) or len(axes) == len(shape)
            inits[f"axes{i}"] = np.array(axes, np.int64)
            nodes.append(helper.make_node(draw(st.sampled_from(REDUCE)), [cur, f"axes{i}"], [out], keepdims=int(keep)))
            shape = [1 if a in axes else d for a, d in enumerate(shape)] if keep else \
                [d for a, d in enumerate(shape) if a not in axes]
        else:
            k = draw(st.integers(1, 7))
            inits[f"m{i}"] = rng.standard_normal((shape[-1], k)).astype(np.float32)
            nodes.append(helper.make_node("MatMul", [cur, f"m{i}"], [out]))
            shape = shape[:-1] + [k]
        cur = out
    nodes[-1].output[0] = "y"
    return nodes, inits, in_shape, shape


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(graph=graphs(), seed=st.integers(0, 2**32 - 1))
def test_random_graph_matches_onnxruntime(tmp_path_factory, graph, seed):
    from compiler import compile_model, load

    nodes, inits, in_shape, out_shape = graph
    tmp = tmp_path_factory.mktemp("g")
    model = make_model(nodes, [("x", TP.FLOAT, in_shape)], [("y", TP.FLOAT, out_shape)], inits, opset=18)
    src = save(model, tmp / "m.onnx")
    x = np.random.default_rng(seed).standard_normal(in_shape).astype(np.float32)
    ref = ort_run(src, {"x": x})["y"]
    compile_model(src, "cpu", tmp / "m.tvmpkg")
    ours = load(tmp / "m.tvmpkg")(x=x)["y"]
    assert ours.shape == ref.shape and ours.dtype == ref.dtype
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(ref).max())))
