"""ONNX ``Attention`` (opset 23+) -> ``relax.nn.attention``, the op attention recognition emits too.

The upstream Relax frontend maps every ``Attention`` to the com.microsoft contrib op, whose attributes
differ (it fails with KeyError 'num_heads' on the standard one). Here: 3-D ``[batch, seq, heads*dim]`` or
4-D ``[batch, heads, seq, dim]`` Q/K/V, grouped-query K/V heads (repeated to the query heads, as the spec
does), a boolean or additive mask, ``is_causal``, ``scale``, and a past key/value cache (concatenated,
and returned as ``present_key``/``present_value``). What the op cannot express exactly is refused up front.
"""

from __future__ import annotations

import numpy as np
import onnx
from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from ..passes.util import dtype, static_shape
from . import support
from .registry import register_converter

_SUPPORTED_ATTRS = {"is_causal", "kv_num_heads", "q_num_heads", "qk_matmul_output_mode", "scale", "softcap",
                    "softmax_precision"}


def _refusal(node: onnx.NodeProto, graph: onnx.GraphProto) -> str | None:
    """Why this Attention node would be computed wrongly, or None."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    unknown = sorted(set(attrs) - _SUPPORTED_ATTRS)
    if unknown:
        return f"attribute{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} not supported"
    if attrs.get("softcap", 0.0):
        return "softcap is not supported"
    if len(node.input) > 6 and node.input[6]:
        return "nonpad_kv_seqlen is not supported"
    if len(node.output) > 3 and node.output[3]:
        return "output qk_matmul_output is not supported"
    return None


def _bnsh(x: relax.Expr, heads: int | None) -> relax.Expr:
    """[batch, seq, heads*dim] (3-D, ``heads`` given) or [batch, heads, seq, dim] -> [batch, heads, seq, dim]."""
    if x.ty.ndim == 4:
        return x
    b, s, hidden = static_shape(x)
    return relax.op.permute_dims(relax.op.reshape(x, [b, s, heads, hidden // heads]), [0, 2, 1, 3])


class Attention(OnnxOpConverter):
    @classmethod
    def _impl_v23(cls, bb, inputs, attr, params):
        q, k, v, mask, past_k, past_v = (list(inputs) + [None] * 6)[:6]
        precision = attr.get("softmax_precision")
        if precision is not None and onnx.helper.tensor_dtype_to_np_dtype(precision) != np.dtype(dtype(q)):
            raise NotImplementedError(f"softmax_precision {onnx.TensorProto.DataType.Name(precision)} differs from "
                                      f"the input type {dtype(q)}")
        three_d = q.ty.ndim == 3
        qn = bb.normalize(_bnsh(q, attr.get("q_num_heads")))
        kn = bb.normalize(_bnsh(k, attr.get("kv_num_heads")))
        vn = bb.normalize(_bnsh(v, attr.get("kv_num_heads")))
        past = 0
        if past_k is not None:
            past = static_shape(past_k)[2]
            kn = bb.normalize(relax.op.concat([past_k, kn], axis=2))
            vn = bb.normalize(relax.op.concat([past_v, vn], axis=2))
        (b, hq, sq, d), (_, hkv, sk, _), dv = static_shape(qn), static_shape(kn), static_shape(vn)[3]
        qb, kb, vb = (relax.op.permute_dims(t, [0, 2, 1, 3]) for t in (qn, kn, vn))
        if hkv != hq:  # grouped-query: each K/V head serves hq/hkv consecutive query heads
            kb, vb = relax.op.repeat(kb, hq // hkv, axis=2), relax.op.repeat(vb, hq // hkv, axis=2)

        bias, causal = None, None
        if mask is not None:
            if dtype(mask) == "bool":
                mask = bb.normalize(relax.op.where(mask, relax.const(0.0, dtype(q)), relax.const(-np.inf, dtype(q))))
            shape = static_shape(mask)
            if shape[-1] != sk:
                raise NotImplementedError(f"attn_mask covers {shape[-1]} keys, not all {sk} (padding is not supported)")
            bias = relax.op.reshape(mask, [1] * (4 - len(shape)) + list(shape)) if len(shape) < 4 else mask
            bias_mask = bias
        if attr.get("is_causal", 0):
            # The spec's causal frontier is key j <= query i + past (the past length, 0 without a cache).
            if past == 0:
                causal = "TopLeft"
            elif past == sk - sq:
                causal = "BottomRight"
            else:
                frontier = np.where(np.tril(np.ones((sq, sk), bool), past), 0.0, -np.inf).astype(dtype(q))
                frontier = relax.const(frontier.reshape(1, 1, sq, sk))
                bias = frontier if bias is None else relax.op.add(bias, frontier)
        scale = attr.get("scale", 1.0 / np.sqrt(d))
        out = bb.normalize(relax.op.nn.attention(qb, kb, vb, bias, scale=float(scale), causal_mask=causal))
        if mask is not None:  # a query whose keys are all masked out: softmax gives NaN, the spec says Y = 0
            # per key "not -inf" as ">= the lowest finite value" (a comparison with an infinity folds away under
            # fast math, and a max reduction starts from the lowest finite value, not -inf), then any key per row
            lowest = relax.const(np.finfo(dtype(q)).min, dtype(q))
            allowed = relax.op.astype(relax.op.greater_equal(bias_mask, lowest), "int8")
            live = relax.op.greater(relax.op.max(allowed, axis=-1, keepdims=True), relax.const(0, "int8"))
            zero = relax.const(0.0, dtype(q))
            out = bb.normalize(relax.op.where(relax.op.permute_dims(live, [0, 2, 1, 3]), out, zero))
        y = relax.op.reshape(out, [b, sq, hq * dv]) if three_d else relax.op.permute_dims(out, [0, 2, 1, 3])
        n = attr["tvm_custom"]["num_outputs"]
        return y if n == 1 else relax.Tuple([bb.normalize(y), kn, vn][:n])


register_converter("", "Attention", Attention)
support.REFUSALS["Attention"] = _refusal
