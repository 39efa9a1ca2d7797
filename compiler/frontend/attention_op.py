"""ONNX ``Attention`` (opset 23+) -> ``relax.nn.attention``, the op attention recognition emits too.

The upstream Relax frontend maps every ``Attention`` to the com.microsoft contrib op, whose attributes
differ (it fails with KeyError 'num_heads' on the standard one). Here: 3-D ``[batch, seq, heads*dim]`` or
4-D ``[batch, heads, seq, dim]`` Q/K/V, grouped-query K/V heads (kept grouped: the op takes them; the explicit
path below repeats them to the query heads, as the spec does), a boolean or additive mask, ``is_causal``, ``scale``, and a past key/value cache (concatenated,
and returned as ``present_key``/``present_value``). ``softcap``, the ``qk_matmul_output`` output, sliding
windows, ``nonpad_kv_seqlen``, a ``softmax_precision`` other than the input type and a mask shorter than the
keys take an explicit path (matmul, bias, softmax, matmul) that follows the ONNX reference step by step.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from ..passes.util import dtype, static_shape
from . import support
from .registry import register_converter

_SUPPORTED_ATTRS = {"is_causal", "kv_num_heads", "q_num_heads", "qk_matmul_output_mode", "scale", "softcap",
                    "softmax_precision", "left_window_size", "right_window_size"}


def _refusal(node: onnx.NodeProto, graph: onnx.GraphProto) -> str | None:
    """Why this Attention node would be computed wrongly, or None."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    unknown = sorted(set(attrs) - _SUPPORTED_ATTRS)
    if unknown:
        return f"attribute{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} not supported"
    return None


def _bnsh(x: relax.Expr, heads: int | None) -> relax.Expr:
    """[batch, seq, heads*dim] (3-D, ``heads`` given) or [batch, heads, seq, dim] -> [batch, heads, seq, dim]."""
    if x.ty.ndim == 4:
        return x
    b, s, hidden = static_shape(x)
    return relax.op.permute_dims(relax.op.reshape(x, [b, s, heads, hidden // heads]), [0, 2, 1, 3])


def _offset_bias(bb, dt: str, sq: int, sk: int, offset: relax.Expr, left: int, right: int | None) -> relax.Expr:
    """0 where query i (at absolute position i + offset) may see key j, else -inf: ``right`` None is the causal
    frontier j <= i + offset, else the window i + offset - left <= j <= i + offset + right (-1: unbounded).
    ``offset`` is a scalar or per batch ([batch, 1, 1, 1], from nonpad_kv_seqlen), as in the ONNX reference."""
    i = relax.const(np.arange(sq).reshape(sq, 1), "int64")
    j = relax.const(np.arange(sk).reshape(1, sk), "int64")
    diff = bb.normalize(relax.op.subtract(relax.op.add(i, offset), j))  # (i + offset) - j
    if right is None:
        allowed = relax.op.greater_equal(diff, relax.const(0, "int64"))
    else:
        allowed = relax.const(np.ones((sq, sk), bool))
        if left >= 0:
            allowed = relax.op.logical_and(allowed, relax.op.less_equal(diff, relax.const(left, "int64")))
        if right >= 0:
            allowed = relax.op.logical_and(allowed, relax.op.greater_equal(diff, relax.const(-right, "int64")))
    return relax.op.where(bb.normalize(allowed), relax.const(0.0, dt), relax.const(-np.inf, dt))


def _explicit(bb, attr: dict, qn, kn, vn, mask, nonpad, past: int | None, three_d: bool) -> list[relax.Expr]:
    """Y, present K/V and qk_matmul_output as the ONNX reference computes them (Q and K each scaled by
    sqrt(scale) in the input type, softcap before the bias, softmax in ``softmax_precision``, rows whose bias
    is all -inf zeroed): the path for what ``relax.nn.attention`` cannot express."""
    op, dt = relax.op, dtype(qn)
    (b, hq, sq, d), (_, hkv, sk, _), dv = static_shape(qn), static_shape(kn), static_shape(vn)[3]
    bias = relax.const(np.zeros((sq, sk), dt))
    if mask is not None:
        mshape = static_shape(mask)
        if mshape[-1] < sk:  # a mask over the first keys only: the rest are masked out
            fill = np.full([*mshape[:-1], sk - mshape[-1]], False if dtype(mask) == "bool" else -np.inf)
            mask = bb.normalize(op.concat([mask, relax.const(fill.astype(dtype(mask)))], axis=-1))
        if dtype(mask) == "bool":
            mask = op.where(mask, relax.const(0.0, dt), relax.const(-np.inf, dt))
        bias = bb.normalize(op.add(bias, op.astype(mask, dt)))
    if nonpad is not None:  # an external cache: per batch, the keys past nonpad_kv_seqlen[b] are padding
        lens = bb.normalize(op.reshape(op.astype(nonpad, "int64"), [b, 1, 1, 1]))
        offset = bb.normalize(op.subtract(lens, relax.const(sq, "int64")))
        keys = relax.const(np.arange(sk).reshape(1, 1, 1, sk), "int64")
        padding = op.where(op.less(keys, lens), relax.const(0.0, dt), relax.const(-np.inf, dt))
    else:
        offset, padding = relax.const(past or 0, "int64"), None
    if attr.get("is_causal", 0):
        bias = bb.normalize(op.add(bias, _offset_bias(bb, dt, sq, sk, offset, -1, None)))
    left, right = attr.get("left_window_size", -1), attr.get("right_window_size", -1)
    if left >= 0 or right >= 0:
        bias = bb.normalize(op.add(bias, _offset_bias(bb, dt, sq, sk, offset, left, right)))
    if padding is not None:
        bias = bb.normalize(op.add(bias, padding))

    root = relax.const(np.asarray(np.sqrt(attr.get("scale", 1.0 / np.sqrt(d))), dt))
    kr, vr = (op.repeat(t, hq // hkv, axis=1) if hkv != hq else t for t in (kn, vn))
    scores = bb.normalize(op.matmul(op.multiply(qn, root), op.permute_dims(op.multiply(kr, root), [0, 1, 3, 2])))
    cap = attr.get("softcap", 0.0)
    if cap > 0:
        cap = relax.const(np.asarray(cap, dt))
        scores = bb.normalize(op.multiply(op.tanh(op.divide(scores, cap)), cap))
    biased = bb.normalize(op.add(scores, bias))
    precision = attr.get("softmax_precision")
    wide = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(precision)).name if precision is not None else dt
    probs = bb.normalize(op.nn.softmax(op.astype(biased, wide), axis=-1))
    # a row with no attendable key: 0, decided on the bias ("not -inf" as ">= the lowest finite value": see below)
    allowed = op.astype(op.greater_equal(bias, relax.const(ml_dtypes.finfo(dt).min, dt)), "int8")
    live = op.greater(op.max(allowed, axis=-1, keepdims=True), relax.const(0, "int8"))
    probs = bb.normalize(op.astype(op.where(live, probs, relax.const(0.0, wide)), dt))
    qk = {0: scores, 1: scores, 2: biased, 3: probs}[attr.get("qk_matmul_output_mode", 0)]
    out = bb.normalize(op.matmul(probs, vr))
    y = op.reshape(op.permute_dims(out, [0, 2, 1, 3]), [b, sq, hq * dv]) if three_d else out
    return [bb.normalize(y), kn, vn, qk]


class Attention(OnnxOpConverter):
    @classmethod
    def _impl_v23(cls, bb, inputs, attr, params):
        q, k, v, mask, past_k, past_v, nonpad = (list(inputs) + [None] * 7)[:7]
        three_d = q.ty.ndim == 3
        qn = bb.normalize(_bnsh(q, attr.get("q_num_heads")))
        kn = bb.normalize(_bnsh(k, attr.get("kv_num_heads")))
        vn = bb.normalize(_bnsh(v, attr.get("kv_num_heads")))
        past = 0
        if past_k is not None:
            past = static_shape(past_k)[2]
            kn = bb.normalize(relax.op.concat([past_k, kn], axis=2))
            vn = bb.normalize(relax.op.concat([past_v, vn], axis=2))
        (b, hq, sq, d), (_, _, sk, _), dv = static_shape(qn), static_shape(kn), static_shape(vn)[3]
        n = attr["tvm_custom"]["num_outputs"]
        precision = attr.get("softmax_precision")
        if (n > 3 or nonpad is not None or attr.get("softcap", 0.0) > 0
                or attr.get("left_window_size", -1) >= 0 or attr.get("right_window_size", -1) >= 0
                or (precision is not None and onnx.helper.tensor_dtype_to_np_dtype(precision) != np.dtype(dtype(q)))
                or (mask is not None and static_shape(mask)[-1] != sk)):
            outs = _explicit(bb, attr, qn, kn, vn, mask, nonpad, past, three_d)
            return outs[0] if n == 1 else relax.Tuple(outs[:n])
        qb, kb, vb = (relax.op.permute_dims(t, [0, 2, 1, 3]) for t in (qn, kn, vn))  # (grouped K/V heads as they are)

        bias, causal = None, None
        if mask is not None:
            if dtype(mask) == "bool":
                mask = bb.normalize(relax.op.where(mask, relax.const(0.0, dtype(q)), relax.const(-np.inf, dtype(q))))
            shape = static_shape(mask)
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
            lowest = relax.const(ml_dtypes.finfo(dtype(q)).min, dtype(q))
            allowed = relax.op.astype(relax.op.greater_equal(bias_mask, lowest), "int8")
            live = relax.op.greater(relax.op.max(allowed, axis=-1, keepdims=True), relax.const(0, "int8"))
            zero = relax.const(0.0, dtype(q))
            out = bb.normalize(relax.op.where(relax.op.permute_dims(live, [0, 2, 1, 3]), out, zero))
        y = relax.op.reshape(out, [b, sq, hq * dv]) if three_d else relax.op.permute_dims(out, [0, 2, 1, 3])
        return y if n == 1 else relax.Tuple([bb.normalize(y), kn, vn][:n])


register_converter("", "Attention", Attention)
support.REFUSALS["Attention"] = _refusal
