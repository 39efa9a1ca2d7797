"""Reductions, normalisations and losses whose Relax converter is missing or wrong (found by the ONNX node tests).

- ReduceMax/ReduceMin: TOPI starts a float max at the lowest *finite* value, so a row of -inf reduces to
  -3.4e38 (and NaN is dropped); ours starts at -inf and propagates NaN, as numpy and ONNX do.
- LayerNormalization: upstream returns dummy zeros for the Mean/InvStdDev outputs: computed here in the
  stash type (float32), as ONNX defines. RMSNormalization: upstream fails to build when the scale has a
  lower rank than the normalised shape.
- LpNormalization, NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss: no upstream converter.
- SpaceToDepth: upstream ignores mode='CRD'; ConvTranspose: upstream ignores output_shape.
"""

from __future__ import annotations

import numpy as np
from tvm import relax, te, tirx
from tvm.relax.frontend.onnx import onnx_frontend as upstream

from .converters_math import const, dtype_of, is_float
from .registry import register_converter

op = relax.op


def rank(x: relax.Expr) -> int:
    return len(x.ty.shape)


def shape(x: relax.Expr) -> list[int]:
    return [int(d) for d in x.ty.shape]


class Rewrite:
    """The upstream converter of ``op_type``, with ``fix(bb, result)`` applied to what it returns."""

    def __init__(self, op_type: str, fix):
        self.op_type, self.fix = op_type, fix

    def get_converter(self, opset: int):
        convert = upstream._get_convert_map()[self.op_type].get_converter(opset)
        return lambda bb, inputs, attrs, params: self.fix(bb, bb.normalize(convert(bb, inputs, attrs, params)))


def _reduce_te(x: te.Tensor, axes: list[int], keepdims: bool, is_max: bool) -> te.Tensor:
    ndim = len(x.shape)
    axes = sorted({a % ndim for a in axes}) if axes else list(range(ndim))
    red = {a: te.reduce_axis((0, x.shape[a]), f"k{a}") for a in axes}
    out_shape = [1 if a in red else d for a, d in enumerate(x.shape)] if keepdims else \
        [d for a, d in enumerate(x.shape) if a not in red]
    if is_float(str(x.dtype)):
        init = -np.inf if is_max else np.inf
        # a != a: NaN (tirx.isnan has no bfloat16 lowering)
        better = (lambda a, b: tirx.Or(a > b, a != a)) if is_max else (lambda a, b: tirx.Or(a < b, a != a))
        reducer = te.comm_reducer(lambda a, b: tirx.Select(better(a, b), a, b), lambda t: tirx.const(init, t))
    else:
        ident = tirx.min_value if is_max else tirx.max_value
        reducer = te.comm_reducer(lambda a, b: tirx.max(a, b) if is_max else tirx.min(a, b), lambda t: ident(t))

    def body(*idx):
        it, full = iter(idx), []
        for a in range(ndim):
            if a in red:
                full.append(red[a])
                if keepdims:
                    next(it)
            else:
                full.append(next(it))
        return reducer(x[tuple(full)], axis=[red[a] for a in axes])

    return te.compute(out_shape, body, name="reduce_max" if is_max else "reduce_min")


def _exact_minmax(bb, result: relax.Expr) -> relax.Expr:
    """Replace ``R.max``/``R.min`` (as upstream emitted it) by the IEEE-exact reduction above."""
    call = result
    if isinstance(result, relax.Var):
        call = bb.lookup_binding(result)
    if not isinstance(call, relax.Call) or getattr(call.op, "name", "") not in ("relax.max", "relax.min"):
        return result
    axes = [int(a) for a in call.attrs.axis] if call.attrs.axis is not None else None
    return bb.emit_te(_reduce_te, call.args[0], axes, bool(call.attrs.keepdims), call.op.name == "relax.max")


class ExactMinMax(Rewrite):
    """ReduceMax/ReduceMin by ``_exact_minmax``; a bool input reduces as uint8 (max: any, min: all), as TOPI
    has no bool identity element."""

    def get_converter(self, opset: int):
        convert = super().get_converter(opset)

        def run(bb, inputs, attrs, params):
            if dtype_of(inputs[0]) != "bool":
                return convert(bb, inputs, attrs, params)
            as_int = [bb.normalize(op.astype(inputs[0], "uint8")), *inputs[1:]]
            return op.astype(convert(bb, as_int, attrs, params), "bool")

        return run


def _stashed(bb, x: relax.Expr, attrs: dict) -> relax.Expr:
    """``x`` in the normalisations' stash type (float32 unless stash_type says otherwise)."""
    stash = "float32" if attrs.get("stash_type", 1) == 1 else dtype_of(x)
    return bb.normalize(op.astype(x, stash)) if dtype_of(x) != stash else x


def layer_norm(bb, inputs, attrs, params) -> relax.Expr:
    """Y, Mean and InvStdDev per ONNX: statistics in the stash type (float32), Y cast back to X's type."""
    x, scale, bias = (list(inputs) + [None, None])[:3]
    axis = attrs.get("axis", -1) % rank(x)
    axes = list(range(axis, rank(x)))
    xs = _stashed(bb, x, attrs)
    mean = op.mean(xs, axes, keepdims=True)
    centered = op.subtract(xs, mean)
    var = op.mean(op.multiply(centered, centered), axes, keepdims=True)
    inv_std = op.rsqrt(op.add(var, const(attrs.get("epsilon", 1e-5), xs)))
    if dtype_of(x) == dtype_of(xs):  # the fused op that the kernels (and their schedules) know
        if bias is None:
            bias = relax.const(np.zeros(shape(scale)), dtype_of(scale))
        y = op.nn.layer_norm(x, scale, bias, axes, attrs.get("epsilon", 1e-5))
    else:
        y = op.multiply(op.astype(op.multiply(centered, inv_std), dtype_of(x)), scale)
        y = y if bias is None else op.add(y, bias)
    return relax.Tuple([bb.normalize(y), bb.normalize(mean), bb.normalize(inv_std)])


class RmsNorm:
    """Upstream's, with the scale broadcast to the normalised shape first (``R.nn.rms_norm`` needs that)."""

    @staticmethod
    def get_converter(opset: int):
        convert = upstream._get_convert_map()["RMSNormalization"].get_converter(opset)

        def rms_norm(bb, inputs, attrs, params):
            x, scale = inputs[:2]
            axis = attrs.get("axis", -1) % rank(x)
            if axis == 0:  # TOPI's rms_norm fails to build when every axis is reduced: decompose
                xs = _stashed(bb, x, attrs)
                ms = op.mean(op.multiply(xs, xs), list(range(rank(x))), keepdims=True)
                normed = op.multiply(xs, op.rsqrt(op.add(ms, const(attrs.get("epsilon", 1e-5), xs))))
                return op.multiply(op.astype(normed, dtype_of(x)), scale)
            if shape(scale) != shape(x)[axis:]:
                scale = bb.normalize(op.broadcast_to(scale, shape(x)[axis:]))
            return convert(bb, [x, scale], attrs, params)

        return rms_norm


def lp_norm(bb, inputs, attrs, params) -> relax.Expr:
    x = inputs[0]
    axis, p = attrs.get("axis", -1), attrs.get("p", 2)
    if p == 1:
        norm = op.sum(op.abs(x), [axis], keepdims=True)
    else:
        norm = op.sqrt(op.sum(op.multiply(x, x), [axis], keepdims=True))
    # x / 0 -> 0, as the ONNX reference does for an all-zero slice
    return op.where(op.equal(norm, const(0, x)), op.zeros_like(x), op.divide(x, norm))


def _nll(log_prob: relax.Expr, target: relax.Expr, weight, attrs) -> relax.Expr:
    """Negative log-likelihood per ONNX: weighted, ignore_index masked, reduced none/sum/mean."""
    reduction = attrs.get("reduction", b"mean")
    reduction = reduction.decode() if isinstance(reduction, bytes) else reduction
    ignore = attrs.get("ignore_index")
    safe = target
    keep = None
    if ignore is not None:
        keep = op.not_equal(target, relax.const(ignore, dtype_of(target)))
        safe = op.where(keep, target, op.zeros_like(target))
    picked = op.squeeze(op.gather_elements(log_prob, op.expand_dims(safe, 1), axis=1), [1])
    w = op.take(weight, safe, axis=0) if weight is not None else op.ones_like(picked)
    if keep is not None:
        w = op.where(keep, w, op.zeros_like(w))
    loss = op.negative(op.multiply(picked, w))
    if reduction == "none":
        return loss
    total = op.sum(loss, None)
    return total if reduction == "sum" else op.divide(total, op.sum(w, None))


def nll_loss(bb, inputs, attrs, params) -> relax.Expr:
    x, target = inputs[:2]
    return _nll(x, target, inputs[2] if len(inputs) > 2 else None, attrs)


def softmax_cross_entropy(bb, inputs, attrs, params) -> relax.Expr:
    scores, labels = inputs[:2]
    log_prob = bb.normalize(op.nn.log_softmax(scores, axis=1))
    loss = _nll(log_prob, labels, inputs[2] if len(inputs) > 2 else None, attrs)
    return relax.Tuple([bb.normalize(loss), log_prob])


def space_to_depth(bb, inputs, attrs, params) -> relax.Expr:
    x, b = inputs[0], attrs["blocksize"]
    n, c, h, w = shape(x)
    mode = attrs.get("mode", b"DCR")
    perm = [0, 1, 3, 5, 2, 4] if mode in (b"CRD", "CRD") else [0, 3, 5, 1, 2, 4]
    blocks = op.reshape(x, [n, c, h // b, b, w // b, b])
    return op.reshape(op.permute_dims(blocks, perm), [n, c * b * b, h // b, w // b])


class ConvTranspose:
    """Upstream's, with an ``output_shape`` attribute (which it ignores) turned into pads the ONNX way;
    a negative end pad (output longer than the natural size) becomes output_padding."""

    @staticmethod
    def get_converter(opset: int):
        convert = upstream._get_convert_map()["ConvTranspose"].get_converter(opset)

        def run(bb, inputs, attrs, params):
            if "output_shape" not in attrs:
                return convert(bb, inputs, attrs, params)
            x, w = inputs[:2]
            spatial = shape(x)[2:]
            n = len(spatial)
            kernel = list(attrs.get("kernel_shape", shape(w)[2:]))
            strides, dilations = list(attrs.get("strides", [1] * n)), list(attrs.get("dilations", [1] * n))
            out_pad = list(attrs.get("output_padding", [0] * n))
            target = list(attrs["output_shape"])[-n:]
            upper = attrs.get("auto_pad", b"NOTSET") in (b"SAME_UPPER", "SAME_UPPER")
            begin, end = [], []
            for i in range(n):
                total = strides[i] * (spatial[i] - 1) + out_pad[i] + (kernel[i] - 1) * dilations[i] + 1 - target[i]
                small, large = total // 2, total - total // 2
                b, e = (small, large) if upper else (large, small)
                if b < 0:
                    raise ValueError(f"output_shape {target} needs a negative start pad")
                if e < 0:
                    out_pad[i], e = out_pad[i] - e, 0
                begin.append(b)
                end.append(e)
            attrs = {k: v for k, v in attrs.items() if k not in ("output_shape", "auto_pad")}
            attrs.update(pads=begin + end, output_padding=out_pad)
            return convert(bb, inputs, attrs, params)

        return run


for _name, _conv in {
    "ReduceMax": ExactMinMax("ReduceMax", _exact_minmax), "ReduceMin": ExactMinMax("ReduceMin", _exact_minmax),
    "LayerNormalization": layer_norm, "RMSNormalization": RmsNorm, "LpNormalization": lp_norm,
    "NegativeLogLikelihoodLoss": nll_loss, "SoftmaxCrossEntropyLoss": softmax_cross_entropy,
    "SpaceToDepth": space_to_depth, "ConvTranspose": ConvTranspose,
}.items():
    register_converter("", _name, _conv, override=True)
