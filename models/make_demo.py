"""Build the bundled demo model ``models/demo.onnx`` (deterministic: same bytes on every run).

A CNN stem (Conv-BN-Relu, Conv-BN-HardSwish) feeding one transformer encoder block (LayerNorm, 4-head
self-attention with scaled softmax, GELU MLP, residuals), mean-pooled into 10 class probabilities.
It is written the way PyTorch exports such a model: dynamic batch, head reshapes computed from a
Shape->Gather->Unsqueeze->Concat subgraph, GELU as Erf arithmetic, a Constant-node scale.

    python models/make_demo.py [OUT.onnx]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

DIM, HEADS, TOKENS, CLASSES = 32, 4, 64, 10


def build() -> onnx.ModelProto:
    rng = np.random.default_rng(2023)
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def w(name: str, *shape: int, scale: float | None = None) -> str:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        s = scale if scale is not None else 1.0 / np.sqrt(fan_in)
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * s).astype(np.float32), name))
        return name

    def c(name: str, value) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def n(op: str, inputs: list[str], output: str, **attrs) -> str:
        nodes.append(helper.make_node(op, inputs, [output], name=f"/{output}", **attrs))
        return output

    def bn(x: str, ch: int, name: str) -> str:
        scale = c(f"{name}.weight", (1 + 0.1 * rng.standard_normal(ch)).astype(np.float32))
        bias = c(f"{name}.bias", (0.1 * rng.standard_normal(ch)).astype(np.float32))
        mean = c(f"{name}.running_mean", (0.1 * rng.standard_normal(ch)).astype(np.float32))
        var = c(f"{name}.running_var", (0.5 + rng.random(ch)).astype(np.float32))
        return n("BatchNormalization", [x, scale, bias, mean, var], f"{name}_out", epsilon=1e-5)

    # CNN stem: [N,3,32,32] -> [N,32,8,8]
    x = n("Conv", ["image", w("stem.0.weight", 16, 3, 3, 3), c("stem.0.bias", np.zeros(16, np.float32))],
          "conv0", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    x = n("Relu", [bn(x, 16, "stem.1")], "relu0")
    x = n("Conv", [x, w("stem.2.weight", DIM, 16, 3, 3)], "conv1", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    x = n("HardSwish", [bn(x, DIM, "stem.3")], "hswish1")

    # Tokens: reshape to [N, DIM, TOKENS] with the batch read from Shape (as exporters write it).
    shape = n("Shape", [x], "shape0")
    batch = n("Unsqueeze", [n("Gather", [shape, c("idx0", np.array(0, np.int64))], "batch0", axis=0),
                            c("axes0", np.array([0], np.int64))], "batch0_1d")
    tok_shape = n("Concat", [batch, c("dim_tok", np.array([DIM, TOKENS], np.int64))], "tok_shape", axis=0)
    x = n("Transpose", [n("Reshape", [x, tok_shape], "flat")], "tokens", perm=[0, 2, 1])
    x = n("Add", [x, w("pos_embed", 1, TOKENS, DIM, scale=0.02)], "embedded")

    # Encoder block, pre-norm.
    def layernorm(t: str, name: str) -> str:
        return n("LayerNormalization", [t, c(f"{name}.weight", np.ones(DIM, np.float32)),
                                        c(f"{name}.bias", np.zeros(DIM, np.float32))], f"{name}_out", axis=-1)

    def linear(t: str, name: str, din: int, dout: int) -> str:
        return n("Add", [n("MatMul", [t, w(f"{name}.weight", din, dout)], f"{name}_mm"),
                         w(f"{name}.bias", dout, scale=0.02)], f"{name}_out")

    head_dim = DIM // HEADS
    h = layernorm(x, "ln1")
    heads_shape = n("Concat", [batch, c("heads_dims", np.array([TOKENS, HEADS, head_dim], np.int64))],
                    "heads_shape", axis=0)
    q, k, v = (n("Reshape", [linear(h, f"attn.{p}", DIM, DIM), heads_shape], f"{p}_heads") for p in "qkv")
    q = n("Transpose", [q], "q_t", perm=[0, 2, 1, 3])
    k = n("Transpose", [k], "k_t", perm=[0, 2, 3, 1])
    v = n("Transpose", [v], "v_t", perm=[0, 2, 1, 3])
    nodes.append(helper.make_node("Constant", [], ["scale"], name="/scale",
                                  value_float=float(np.sqrt(head_dim))))
    scores = n("Div", [n("MatMul", [q, k], "qk"), "scale"], "scores")
    attn = n("MatMul", [n("Softmax", [scores], "probs_attn", axis=-1), v], "attn_v")
    merged_shape = n("Concat", [batch, c("merged_dims", np.array([TOKENS, DIM], np.int64))], "merged_shape", axis=0)
    attn = n("Reshape", [n("Transpose", [attn], "attn_t", perm=[0, 2, 1, 3]), merged_shape], "attn_merged")
    x = n("Add", [x, linear(attn, "attn.out", DIM, DIM)], "res1")

    h = linear(layernorm(x, "ln2"), "mlp.fc1", DIM, 2 * DIM)
    erf = n("Erf", [n("Div", [h, c("sqrt2", np.array(np.sqrt(2.0), np.float32))], "gelu_div")], "gelu_erf")
    gelu = n("Mul", [n("Mul", [h, n("Add", [erf, c("one", np.array(1.0, np.float32))], "gelu_add")], "gelu_mul"),
                     c("half", np.array(0.5, np.float32))], "gelu")
    x = n("Add", [x, linear(gelu, "mlp.fc2", 2 * DIM, DIM)], "res2")

    pooled = n("ReduceMean", [x], "pooled", axes=[1], keepdims=0)
    logits = n("Gemm", [pooled, w("head.weight", CLASSES, DIM), w("head.bias", CLASSES, scale=0.02)],
               "logits", transB=1)
    n("Softmax", [logits], "probs", axis=-1)

    graph = helper.make_graph(
        nodes, "tvmpipe_demo",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", CLASSES])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="tvmpipe-demo")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


DEFAULT_PATH = Path(__file__).with_name("demo.onnx")

if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_PATH
    onnx.save(build(), out)
    print(f"wrote {out}")
