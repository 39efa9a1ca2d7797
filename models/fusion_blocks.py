"""ONNX blocks written the way exporters write them, for the fusion tests and ``benchmarks/fusion.py``.

Convolution blocks (Conv -> BN -> activation [-> residual Add]), a MobileNetV2 inverted residual block, and
self/cross attention in the layouts that PyTorch and TensorFlow exporters produce (``ATTENTION_LAYOUTS``),
optionally inside a pre-norm transformer encoder block. Weights are random (seeded): these are for
checking numerics and counting kernels, not for accuracy.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT
ACTIVATIONS = ("Relu", "Relu6", "Sigmoid", "HardSigmoid", "HardSwish", "Gelu", "Silu", "LeakyRelu")


class Graph:
    """A tiny graph builder: ``n(op, inputs, **attrs)`` appends a node and returns its output name."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []

    def input(self, name: str, shape: list, elem: int = F) -> str:
        if all(i.name != name for i in self.inputs):  # asked again (a mask, by every layer): one input
            self.inputs.append(helper.make_tensor_value_info(name, elem, shape))
        return name

    def c(self, value) -> str:
        name = f"c{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def w(self, *shape: int, scale: float | None = None) -> str:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        s = 1.0 / np.sqrt(fan_in) if scale is None else scale
        return self.c((self.rng.standard_normal(shape) * s).astype(np.float32))

    def n(self, op: str, inputs: list[str], **attrs) -> str:
        out = f"t{len(self.nodes)}"
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"{op}_{len(self.nodes)}", **attrs))
        return out

    def model(self, outputs: list[str], opset: int = 17) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, "block", self.inputs,
                                  [helper.make_tensor_value_info(o, F, None) for o in outputs], self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = 8 if opset < 21 else 10
        model = onnx.shape_inference.infer_shapes(model)
        onnx.checker.check_model(model)
        return model

    # ---- layers

    def act(self, x: str, kind: str) -> str:
        if kind == "Relu6":
            return self.n("Clip", [x, self.c(np.float32(0)), self.c(np.float32(6))])
        if kind == "Silu":  # no ONNX op before opset 24: exported as x * Sigmoid(x)
            return self.n("Mul", [x, self.n("Sigmoid", [x])])
        attrs = {"HardSigmoid": {"alpha": 0.2, "beta": 0.5}, "LeakyRelu": {"alpha": 0.1}}.get(kind, {})
        return self.n(kind, [x], **attrs)

    def bn(self, x: str, ch: int) -> str:
        r = self.rng
        return self.n("BatchNormalization", [x, self.c((1 + 0.1 * r.standard_normal(ch)).astype(np.float32)),
                                             self.c((0.1 * r.standard_normal(ch)).astype(np.float32)),
                                             self.c((0.1 * r.standard_normal(ch)).astype(np.float32)),
                                             self.c((0.5 + r.random(ch)).astype(np.float32))], epsilon=1e-5)

    def conv(self, x: str, cin: int, cout: int, k: int, groups: int = 1, bias: bool = True) -> str:
        ins = [x, self.w(cout, cin // groups, k, k)] + ([self.c(np.zeros(cout, np.float32))] if bias else [])
        return self.n("Conv", ins, kernel_shape=[k, k], pads=[k // 2] * 4, group=groups)

    def linear(self, x: str, din: int, dout: int) -> str:
        return self.n("Add", [self.n("MatMul", [x, self.w(din, dout)]), self.w(dout, scale=0.1)])

    def layernorm(self, x: str, dim: int) -> str:
        return self.n("LayerNormalization", [x, self.c(np.ones(dim, np.float32)), self.c(np.zeros(dim, np.float32))],
                      axis=-1, epsilon=1e-5)

    def heads(self, x: str, batch: int, seq: int, h: int, d: int, perm: list[int]) -> str:
        return self.n("Transpose", [self.n("Reshape", [x, self.c(np.array([batch, seq, h, d]))])], perm=perm)


# ---------------------------------------------------------------- convolution blocks


def conv_bn_act(act: str = "Relu", ch: int = 8, hw: int = 9, depth: int = 1, batch: int = 1) -> onnx.ModelProto:
    """``depth`` x [Conv3x3 -> BN -> act -> Conv1x1 -> BN -> + residual]."""
    g = Graph()
    x = g.input("x", [batch, ch, hw, hw])
    for _ in range(depth):
        y = g.act(g.bn(g.conv(x, ch, ch, 3), ch), act)
        x = g.n("Add", [g.bn(g.conv(y, ch, ch, 1, bias=False), ch), x])
    return g.model([x], opset=20)


def mobilenet_block(ch: int = 16, expand: int = 6, hw: int = 14, batch: int = 1) -> onnx.ModelProto:
    """MobileNetV2 inverted residual: 1x1 expand -> BN -> Relu6 -> 3x3 depthwise -> BN -> Relu6 -> 1x1 -> BN -> +x."""
    g = Graph()
    x = g.input("x", [batch, ch, hw, hw])
    mid = ch * expand
    y = g.act(g.bn(g.conv(x, ch, mid, 1, bias=False), mid), "Relu6")
    y = g.act(g.bn(g.conv(y, mid, mid, 3, groups=mid, bias=False), mid), "Relu6")
    y = g.bn(g.conv(y, mid, ch, 1, bias=False), ch)
    return g.model([g.n("Add", [y, x])])


# ---------------------------------------------------------------- attention, as exporters write it


def _bert(g: Graph, q: str, k: str, v: str, b: int, sq: int, sk: int, h: int, d: int) -> str:
    """HF BERT via torch.onnx: scores / sqrt(d) + (1 - mask) * -10000 from a [batch, seq_k] input mask."""
    mask = g.input("mask", [b, sk])
    ext = g.n("Mul", [g.n("Sub", [g.c(np.float32(1)), g.n("Unsqueeze", [mask, g.c(np.array([1, 2]))])]),
                      g.c(np.float32(-10000))])
    qh, vh = g.heads(q, b, sq, h, d, [0, 2, 1, 3]), g.heads(v, b, sk, h, d, [0, 2, 1, 3])
    kt = g.n("Transpose", [g.heads(k, b, sk, h, d, [0, 2, 1, 3])], perm=[0, 1, 3, 2])  # permute, then transpose(-1,-2)
    s = g.n("Add", [g.n("Div", [g.n("MatMul", [qh, kt]), g.c(np.float32(np.sqrt(d)))]), ext])
    return g.n("MatMul", [g.n("Softmax", [s], axis=-1), vh])


def _sdpa(g: Graph, q: str, k: str, v: str, b: int, sq: int, sk: int, h: int, d: int) -> str:
    """F.scaled_dot_product_attention via the dynamo exporter: Q and Kᵀ each scaled by sqrt(scale), a causal
    mask built from Trilu and Where (aligned to the bottom right when seq_k > seq_q, as a KV cache does)."""
    root = g.c(np.float32(np.sqrt(1 / np.sqrt(d))))
    qh, vh = g.heads(q, b, sq, h, d, [0, 2, 1, 3]), g.heads(v, b, sk, h, d, [0, 2, 1, 3])
    kt = g.n("Mul", [g.n("Transpose", [g.heads(k, b, sk, h, d, [0, 2, 1, 3])], perm=[0, 1, 3, 2]), root])
    allowed = g.n("Cast", [g.n("Trilu", [g.c(np.ones((sq, sk), np.int64)), g.c(np.array(sk - sq))], upper=0)],
                  to=TensorProto.BOOL)
    causal = g.n("Where", [allowed, g.c(np.float32(0)), g.c(np.float32(-np.inf))])
    s = g.n("Add", [g.n("MatMul", [g.n("Mul", [qh, root]), kt]), causal])
    return g.n("MatMul", [g.n("Softmax", [s], axis=-1), vh])


def _gpt2(g: Graph, q: str, k: str, v: str, b: int, sq: int, sk: int, h: int, d: int) -> str:
    """HF GPT-2 eager: Where(causal bias buffer sliced to the sequence, scores, finfo.min) + padding mask."""
    lowest = np.finfo(np.float32).min
    buffer = g.c(np.tril(np.ones((1, 1, 32, 32), bool)))
    causal = g.n("Slice", [buffer, g.c(np.array([0, 0])), g.c(np.array([sq, sk])), g.c(np.array([2, 3]))])
    mask = g.input("mask", [b, sk])
    pad = g.n("Mul", [g.n("Sub", [g.c(np.float32(1)), g.n("Unsqueeze", [mask, g.c(np.array([1, 2]))])]),
                      g.c(np.float32(lowest))])
    qh, vh = g.heads(q, b, sq, h, d, [0, 2, 1, 3]), g.heads(v, b, sk, h, d, [0, 2, 1, 3])
    kt = g.heads(k, b, sk, h, d, [0, 2, 3, 1])
    s = g.n("Div", [g.n("MatMul", [qh, kt]), g.c(np.float32(np.sqrt(d)))])
    s = g.n("Add", [g.n("Where", [causal, s, g.c(np.float32(lowest))]), pad])
    return g.n("MatMul", [g.n("Softmax", [s], axis=-1), vh])


def _keras(g: Graph, q: str, k: str, v: str, b: int, sq: int, sk: int, h: int, d: int) -> str:
    """Keras MultiHeadAttention via tf2onnx (einsums lowered to Transpose+MatMul): the query is scaled before
    the head transpose, and a [batch, seq_q, seq_k] mask adds (1 - mask) * -1e9."""
    mask = g.input("mask", [b, sq, sk])
    adder = g.n("Mul", [g.n("Sub", [g.c(np.float32(1)), g.n("Unsqueeze", [mask, g.c(np.array([1]))])]),
                        g.c(np.float32(-1e9))])
    qs = g.n("Mul", [g.n("Reshape", [q, g.c(np.array([b, sq, h, d]))]), g.c(np.float32(1 / np.sqrt(d)))])
    qh = g.n("Transpose", [qs], perm=[0, 2, 1, 3])
    kt = g.heads(k, b, sk, h, d, [0, 2, 3, 1])
    s = g.n("Add", [g.n("MatMul", [qh, kt]), adder])
    return g.n("MatMul", [g.n("Softmax", [s], axis=-1), g.heads(v, b, sk, h, d, [0, 2, 1, 3])])


ATTENTION_LAYOUTS = {"bert": _bert, "sdpa_causal": _sdpa, "gpt2": _gpt2, "keras": _keras}


def attention(layout: str, b: int = 2, sq: int = 5, sk: int | None = None, h: int = 3, d: int = 4) -> onnx.ModelProto:
    """One attention block ([batch, seq, heads*dim] in and out) in an exporter layout; cross-attention to a
    ``mem`` input when ``sk`` differs from ``sq``. ``layout="mha"`` is torch.nn.MultiheadAttention's
    sequence-first export: 3-D ``[batch*heads, seq, dim]`` batched matmuls with a pre-scaled query."""
    g = Graph()
    e = h * d
    sk = sq if sk is None else sk
    if layout == "mha":
        x, mem = g.input("x", [sq, b, e]), g.input("mem", [sk, b, e])
        q = g.n("Mul", [g.linear(x, e, e), g.c(np.float32(1 / np.sqrt(d)))])
        qh, kh, vh = (g.n("Transpose", [g.n("Reshape", [t, g.c(np.array([n, b * h, d]))])], perm=[1, 0, 2])
                      for t, n in ((q, sq), (g.linear(mem, e, e), sk), (g.linear(mem, e, e), sk)))
        o = g.n("MatMul", [g.n("Softmax", [g.n("MatMul", [qh, g.n("Transpose", [kh], perm=[0, 2, 1])])], axis=-1), vh])
        out = g.n("Reshape", [g.n("Transpose", [o], perm=[1, 0, 2]), g.c(np.array([sq, b, e]))])
        return g.model([g.linear(out, e, e)])
    x = g.input("x", [b, sq, e])
    mem = x if sk == sq else g.input("mem", [b, sk, e])
    o = ATTENTION_LAYOUTS[layout](g, g.linear(x, e, e), g.linear(mem, e, e), g.linear(mem, e, e), b, sq, sk, h, d)
    out = g.n("Reshape", [g.n("Transpose", [o], perm=[0, 2, 1, 3]), g.c(np.array([b, sq, e]))])
    return g.model([g.linear(out, e, e)])


def encoder_block(b: int = 1, seq: int = 64, h: int = 4, d: int = 16, layout: str = "bert", layers: int = 1,
                  mlp: int = 4) -> onnx.ModelProto:
    """``layers`` pre-norm transformer encoder blocks: x + Attn(LN(x)); x + MLP(LN(x)) with an erf GELU (exported
    form) and ``mlp`` x the width inside the MLP. The attention mask input (if the layout has one) is shared."""
    g = Graph()
    e = h * d
    x = g.input("x", [b, seq, e])
    for _ in range(layers):
        y = g.layernorm(x, e)
        o = ATTENTION_LAYOUTS[layout](g, g.linear(y, e, e), g.linear(y, e, e), g.linear(y, e, e), b, seq, seq, h, d)
        merged = g.n("Reshape", [g.n("Transpose", [o], perm=[0, 2, 1, 3]), g.c(np.array([b, seq, e]))])
        x = g.n("Add", [x, g.linear(merged, e, e)])
        hid = g.linear(g.layernorm(x, e), e, mlp * e)
        erf = g.n("Erf", [g.n("Div", [hid, g.c(np.float32(np.sqrt(2)))])])
        gelu = g.n("Mul", [g.n("Mul", [hid, g.n("Add", [erf, g.c(np.float32(1))])]), g.c(np.float32(0.5))])
        x = g.n("Add", [x, g.linear(gelu, mlp * e, e)])
    return g.model([x])


def kv_cache_step(form: str, s: int = 3, d: int = 8) -> onnx.ModelProto:
    """A decoding step of grouped-query heads (``s`` new tokens): new keys concatenated to the K/V cache (also returned),
    each K/V head repeated to its group of query heads as transformers writes it (``repeat_kv``), as PyTorch's dynamo
    exporter writes SDPA's ``enable_gqa`` (``dynamo_sdpa``), or the other way round (``interleaved``)."""
    b, past, h, g = 2, 11, 6, 2
    keys, e, r = past + s, h * d, h // g
    gr = Graph()
    x, bias = gr.input("x", [b, s, e]), gr.input("bias", [b, 1, s, keys])

    def heads(t, n):  # [b, s, n * d] -> [b, n, s, d]
        return gr.n("Transpose", [gr.n("Reshape", [t, gr.c(np.array([b, s, n, d]))])], perm=[0, 2, 1, 3])

    def cached(name, shape):  # (the cache with the new keys, repeated to the query heads, reshaped to ``shape``)
        full = gr.n("Concat", [gr.input(f"past_{name}", [b, g, past, d]), heads(gr.linear(x, e, g * d), g)], axis=2)
        axis, expanded = (1, [b, r, g, keys, d]) if form == "interleaved" else (2, [b, g, r, keys, d])
        unit = gr.n("Unsqueeze", [full, gr.c(np.array(axis if form == "dynamo_sdpa" else [axis]))])
        return full, gr.n("Reshape", [gr.n("Expand", [unit, gr.c(np.array(expanded))]), gr.c(np.array(shape))])

    if form == "dynamo_sdpa":
        k_full, k = cached("k", [b * h, keys, d])
        kt = gr.n("Reshape", [gr.n("Transpose", [k], perm=[0, 2, 1]), gr.c(np.array([b, h, d, keys]))])
    else:
        k_full, k = cached("k", [b, h, keys, d])
        kt = gr.n("Transpose", [k], perm=[0, 1, 3, 2])
    v_full, v = cached("v", [b, h, keys, d])
    scores = gr.n("Div", [gr.n("MatMul", [heads(gr.linear(x, e, e), h), kt]), gr.c(np.float32(np.sqrt(d)))])
    p = gr.n("Softmax", [gr.n("Add", [scores, bias])], axis=-1)
    o = gr.n("Reshape", [gr.n("Transpose", [gr.n("MatMul", [p, v])], perm=[0, 2, 1, 3]), gr.c(np.array([b, s, e]))])
    return gr.model([gr.linear(o, e, e), k_full, v_full])
