"""Build ``rmsnorm_model.onnx``: MatMul -> tvmpipe.example::RMSNorm -> Relu, and its NumPy reference.

    python examples/plugins/make_model.py        # rewrites examples/plugins/rmsnorm_model.onnx

The input is ``x: float32[batch, seq, 64]`` (bind both dims with ``--input-shape x:BxSx64``); the
hidden width 200 is deliberately not a multiple of the 32-thread warp, so the kernels' tails are exercised.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
MODEL = HERE / "rmsnorm_model.onnx"
DOMAIN, OP = "tvmpipe.example", "RMSNorm"
IN, HIDDEN, EPSILON = 64, 200, 1e-5


def build() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((IN, HIDDEN)) / np.sqrt(IN)).astype(np.float32)
    scale = (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="proj"),
        helper.make_node(OP, ["h", "scale"], ["n"], name="norm", domain=DOMAIN, epsilon=EPSILON),
        helper.make_node("Relu", ["n"], ["y"], name="act"),
    ]
    graph = helper.make_graph(
        nodes, "rmsnorm_example",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", IN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", HIDDEN])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(scale, "scale")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def rmsnorm(x: np.ndarray, scale: np.ndarray, epsilon: float) -> np.ndarray:
    """RMSNorm over the last axis, in float64."""
    x = np.asarray(x, np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + epsilon) * np.asarray(scale, np.float64)


def reference(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """The example model's output in float64 NumPy (onnxruntime cannot run the custom op)."""
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    eps = next(a.f for n in model.graph.node if n.op_type == OP for a in n.attribute if a.name == "epsilon")
    h = np.asarray(x, np.float64) @ weights["w"].astype(np.float64)
    return np.maximum(rmsnorm(h, weights["scale"], eps), 0)


if __name__ == "__main__":
    onnx.save(build(), MODEL)
    print(f"wrote {MODEL} ({MODEL.stat().st_size} bytes)")
