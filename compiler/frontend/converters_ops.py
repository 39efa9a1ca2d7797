"""ONNX ops with no (or a failing) upstream Relax converter, built from Relax ops by their ONNX definition."""

from __future__ import annotations

import numpy as np
import onnx
import tvm
from tvm import relax, te, tirx
from tvm.relax.frontend.onnx import onnx_frontend as upstream

from .converters_math import const, dtype_of, swish
from .converters_nn import rank, shape
from .registry import register_converter

op = relax.op


def swiglu(bb, inputs, attrs, params) -> relax.Expr:
    a, b = inputs
    return op.multiply(swish(bb, [a], attrs, params), b)


def bitcast(bb, inputs, attrs, params) -> relax.Expr:
    """Reinterpret the bits (same width): TIR's reinterpret, elementwise."""
    x = inputs[0]
    to = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(attrs["to"])).name
    if dtype_of(x) == "bool" or to == "bool":  # one byte either way, values 0/1
        return op.astype(x, to)
    return bb.emit_te(lambda t: te.compute(t.shape, lambda *i: tirx.reinterpret(to, t[i]), name="bitcast"), x)


def eye_like(bb, inputs, attrs, params) -> relax.Expr:
    dtype = attrs.get("dtype")
    to = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(dtype)).name if dtype is not None else dtype_of(inputs[0])
    # R.eye_like's legalisation ignores its dtype (it returns the input's): cast the 0/1 matrix instead
    return op.astype(op.eye_like(inputs[0], attrs.get("k", 0), dtype_of(inputs[0])), to)


def _centered(x: relax.Expr, zero_point) -> relax.Expr:
    x = op.astype(x, "int32")
    return x if zero_point is None else op.subtract(x, op.astype(zero_point, "int32"))


def rint(bb, x: relax.Expr) -> relax.Expr:
    """Round half to even (numpy's rint), written out: TIR's round rounds halves away from zero."""
    x = bb.normalize(x)
    low = op.floor(x)
    frac = op.subtract(x, low)
    half, one, two = const(0.5, x), const(1, x), const(2, x)
    low_even = op.equal(op.multiply(op.floor(op.divide(low, two)), two), low)
    up = op.logical_or(op.greater(frac, half), op.logical_and(op.equal(frac, half), op.logical_not(low_even)))
    return op.where(up, op.add(low, one), low)


def qlinear_matmul(bb, inputs, attrs, params) -> relax.Expr:
    """Integer matmul of the centred operands, rescaled in float64 and rounded half to even (ONNX reference)."""
    a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp = inputs
    acc = op.matmul(_centered(a, a_zp), _centered(b, b_zp), out_dtype="int32")
    scale = op.astype(op.divide(op.multiply(a_scale, b_scale), y_scale), "float64")
    out_dtype = dtype_of(y_zp) if y_zp is not None else dtype_of(a)
    y = op.multiply(op.astype(acc, "float64"), scale)
    if y_zp is not None:
        y = op.add(y, op.astype(y_zp, "float64"))
    info = np.iinfo(out_dtype)
    return op.astype(op.clip(rint(bb, y), float(info.min), float(info.max)), out_dtype)


class ConvInteger:
    """Upstream's Conv on int32 operands with the zero points subtracted (int32 accumulation, as ONNX)."""

    @staticmethod
    def get_converter(opset: int):
        conv = upstream._get_convert_map()["Conv"].get_converter(opset)

        def convert(bb, inputs, attrs, params):
            x, w = inputs[:2]
            zx = inputs[2] if len(inputs) > 2 else None
            zw = inputs[3] if len(inputs) > 3 else None
            if zw is not None and rank(zw) == 1:  # one zero point per output channel
                zw = bb.normalize(op.reshape(zw, [-1] + [1] * (rank(w) - 1)))
            return conv(bb, [bb.normalize(_centered(x, zx)), bb.normalize(_centered(w, zw)), None], attrs, params)

        return convert


class QLinearConv:
    """``ConvInteger`` of the centred operands plus the int32 bias, rescaled in float64 by
    x_scale * w_scale / y_scale (per output channel when w_scale is), shifted by y_zero_point, clipped and
    rounded half to even into y's type, as the ONNX reference."""

    @staticmethod
    def get_converter(opset: int):
        conv = ConvInteger.get_converter(opset)

        def convert(bb, inputs, attrs, params):
            x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp = inputs[:8]
            bias = inputs[8] if len(inputs) > 8 else None
            acc = bb.normalize(conv(bb, [x, w, x_zp, w_zp], attrs, params))
            channels = [1, shape(w)[0]] + [1] * (rank(w) - 2)
            if bias is not None:
                acc = bb.normalize(op.add(acc, op.reshape(bias, channels)))
            if rank(w_scale) == 1 and shape(w_scale)[0] > 1:
                w_scale = op.reshape(w_scale, channels)
            scale = op.astype(op.divide(op.multiply(x_scale, w_scale), y_scale), "float64")
            y = op.multiply(op.astype(acc, "float64"), scale)
            out_dtype = dtype_of(y_zp) if y_zp is not None else dtype_of(x)
            if y_zp is not None:
                y = op.add(y, op.astype(y_zp, "float64"))
            info = np.iinfo(out_dtype)
            return op.astype(rint(bb, op.clip(y, float(info.min), float(info.max))), out_dtype)

        return convert


def reverse_sequence(bb, inputs, attrs, params) -> relax.Expr:
    """Gather along the time axis from t -> len[b] - 1 - t for t < len[b] (the rest stays in place)."""
    x, lens = inputs
    time_axis = attrs.get("time_axis", 0)  # batch_axis is then the other of axes 0 and 1 (the spec allows no other)
    dims = shape(x)
    steps = np.arange(dims[time_axis], dtype="int64")
    t = relax.const(steps.reshape((-1, 1) if time_axis == 0 else (1, -1)), "int64")  # else int32
    n = op.reshape(bb.normalize(op.astype(lens, "int64")), (1, -1) if time_axis == 0 else (-1, 1))
    n = bb.normalize(n)
    src = bb.normalize(op.where(op.less(t, n), op.subtract(op.subtract(n, relax.const(1, "int64")), t), t))
    src = bb.normalize(op.broadcast_to(op.reshape(src, dims[:2] + [1] * (rank(x) - 2)), dims))
    return op.gather_elements(x, src, axis=time_axis)


def rotary_embedding(bb, inputs, attrs, params) -> relax.Expr:
    """RotaryEmbedding (opset 23) as the ONNX reference computes it: on [batch, seq, heads, head_size]."""
    x, cos, sin = inputs[:3]
    pos = inputs[3] if len(inputs) > 3 else None
    dims = shape(x)
    if len(dims) == 4:
        xt = op.permute_dims(x, [0, 2, 1, 3])
        b, s, h, d = dims[0], dims[2], dims[1], dims[3]
    else:
        b, s, hidden = dims
        h = attrs["num_heads"]
        d = hidden // h
        xt = op.reshape(x, [b, s, h, d])
    rd = attrs.get("rotary_embedding_dim", 0) or d
    if pos is not None:
        cos, sin = op.take(cos, pos, axis=0), op.take(sin, pos, axis=0)
    cos, sin = op.expand_dims(cos, 2), op.expand_dims(sin, 2)
    rot = op.strided_slice(xt, [3], [0], [rd])
    if attrs.get("interleaved", 0):
        x1, x2 = op.strided_slice(rot, [3], [0], [rd], [2]), op.strided_slice(rot, [3], [1], [rd], [2])
    else:
        x1, x2 = op.strided_slice(rot, [3], [0], [rd // 2]), op.strided_slice(rot, [3], [rd // 2], [rd])
    real = op.subtract(op.multiply(cos, x1), op.multiply(sin, x2))
    imag = op.add(op.multiply(sin, x1), op.multiply(cos, x2))
    if attrs.get("interleaved", 0):
        out = op.reshape(op.stack([real, imag], axis=4), [b, s, h, rd])
    else:
        out = op.concat([real, imag], axis=3)
    if rd < d:
        out = op.concat([out, op.strided_slice(xt, [3], [rd], [d])], axis=3)
    return op.permute_dims(out, [0, 2, 1, 3]) if len(dims) == 4 else op.reshape(out, dims)


def causal_conv_with_state(bb, inputs, attrs, params) -> relax.Expr:
    """Depthwise causal conv1d over [past_state | input]; the last k-1 steps are the new state."""
    x, w = inputs[:2]
    bias = inputs[2] if len(inputs) > 2 else None
    past = inputs[3] if len(inputs) > 3 else None
    (n, c, _), k = shape(x), shape(w)[2]
    past = past if past is not None else relax.const(np.zeros((n, c, k - 1)), dtype_of(x))
    padded = bb.normalize(op.concat([past, x], axis=2))
    y = bb.normalize(op.nn.conv1d(padded, w, groups=c))
    if bias is not None:
        y = bb.normalize(op.add(y, op.reshape(bias, [1, c, 1])))
    if attrs.get("activation", b"none") in (b"silu", b"swish", "silu", "swish"):  # in float32, as ONNX
        wide = bb.normalize(op.astype(y, "float32"))
        y = op.astype(op.multiply(wide, op.sigmoid(wide)), dtype_of(x))
    length = shape(padded)[2]
    return relax.Tuple([bb.normalize(y), bb.normalize(op.strided_slice(padded, [2], [length - k + 1], [length]))])


def tensor_scatter(bb, inputs, attrs, params) -> relax.Expr:
    """Write ``update`` into ``past_cache`` along ``axis`` from write_indices[batch] on (mod the cache
    length for mode='circular'): every cache slot takes update[slot - start] where that index is valid."""
    cache, update = inputs[:2]
    starts = inputs[2] if len(inputs) > 2 else None
    dims, axis = shape(cache), attrs.get("axis", -2) % rank(cache)
    seq, size = shape(update)[axis], dims[axis]
    slot = relax.const(np.arange(size).reshape([-1] + [1] * (rank(cache) - axis - 1)), "int64")  # else int32
    if starts is None:
        starts = relax.const(np.zeros(dims[0]), "int64")
    start = bb.normalize(op.reshape(op.astype(starts, "int64"), [dims[0]] + [1] * (rank(cache) - 1)))
    j = bb.normalize(op.subtract(slot, start))
    if attrs.get("mode", b"linear") in (b"circular", "circular"):
        j = bb.normalize(op.floor_mod(j, relax.const(size, "int64")))
    valid = bb.normalize(op.logical_and(op.greater_equal(j, relax.const(0, "int64")),
                                        op.less(j, relax.const(seq, "int64"))))
    index = bb.normalize(op.clip(j, 0, seq - 1))
    index_shape = dims[:axis] + [size] + shape(update)[axis + 1:]
    gathered = op.gather_elements(update, bb.normalize(op.broadcast_to(index, index_shape)), axis=axis)
    return op.where(bb.normalize(op.broadcast_to(valid, dims)), gathered, cache)


def _dft_matrix(length: int, n: int, inverse: bool, onesided: bool) -> np.ndarray:
    """M such that (re + i*im) @ M is the DFT of length-``length`` signals (rows past n are 0: truncation)."""
    if inverse and onesided:  # irfft: a Hermitian half spectrum -> n real samples
        k, t = np.arange(length)[:, None], np.arange(n)[None, :]
        weight = np.where((k == 0) | (2 * k == n), 1.0, 2.0) * (k <= n // 2)
        return weight / n * np.exp(2j * np.pi * k * t / n)
    t, k = np.arange(length)[:, None], np.arange(n // 2 + 1 if onesided else n)[None, :]
    m = np.exp((2j if inverse else -2j) * np.pi * t * k / n) * (t < n)
    return m / n if inverse else m


def dft(bb, inputs, attrs, params) -> relax.Expr:
    """DFT as matmuls with a cos/sin matrix along ``axis``: exact to rounding and no FFT kernel needed for
    the (static, short) signal lengths of a compiled graph. Complex or real input, inverse, rfft, irfft."""
    x, r = inputs[0], rank(inputs[0])
    axis = attrs.get("axis", 1)
    if len(inputs) > 2 and inputs[2] is not None:  # opset 20: an input, a constant by support.CONSTANT_INPUTS
        axis = int(inputs[2].value.numpy())
    axis %= r
    inverse, onesided = bool(attrs.get("inverse", 0)), bool(attrs.get("onesided", 0))
    length = shape(x)[axis]
    if len(inputs) > 1 and inputs[1] is not None:
        n = int(inputs[1].value.numpy())
    else:
        n = 2 * (length - 1) if inverse and onesided else length
    m = _dft_matrix(length, n, inverse, onesided)
    perm = [d for d in range(r - 1) if d != axis] + [axis]  # the transformed axis last, complex dim dropped

    def component(k: int) -> relax.Expr:
        return bb.normalize(op.permute_dims(op.squeeze(op.strided_slice(x, [r - 1], [k], [k + 1]), [r - 1]), perm))

    def times(a: relax.Expr, matrix: np.ndarray) -> relax.Expr:
        return op.matmul(a, relax.const(matrix, dtype_of(x)))

    re, im = component(0), component(1) if shape(x)[-1] == 2 else None
    parts = [times(re, m.real) if im is None else op.subtract(times(re, m.real), times(im, m.imag))]
    if not (inverse and onesided):
        parts.append(times(re, m.imag) if im is None else op.add(times(re, m.imag), times(im, m.real)))
    back = list(np.argsort(perm))
    parts = [bb.normalize(op.expand_dims(op.permute_dims(bb.normalize(p), back), r - 1)) for p in parts]
    return op.concat(parts, axis=r - 1) if len(parts) > 1 else parts[0]


def stft(bb, inputs, attrs, params) -> relax.Expr:
    """Frames gathered at the constant frame_step (support.CONSTANT_INPUTS), weighted by the window (ones
    if omitted), then ``dft`` along the frame (onesided by default): [batch, frames, bins, 2]."""
    x, step = inputs[0], int(inputs[1].value.numpy().item())
    window = inputs[2] if len(inputs) > 2 else None
    if len(inputs) > 3 and inputs[3] is not None:
        length = int(inputs[3].value.numpy().item())
    else:
        length = shape(window)[0] if window is not None else shape(x)[1]
    batch, samples, parts = shape(x)
    frames = 1 + (samples - length) // step
    index = (np.arange(frames)[:, None] * step + np.arange(length)[None, :]).reshape(-1)
    framed = op.reshape(op.take(x, relax.const(index, "int64"), axis=1), [batch, frames, length, parts])
    if window is not None:
        framed = op.multiply(framed, op.reshape(op.astype(window, dtype_of(x)), [1, 1, length, 1]))
    return dft(bb, [bb.normalize(framed)], {"axis": 2, "onesided": attrs.get("onesided", 1)}, params)


def binarizer(bb, inputs, attrs, params) -> relax.Expr:
    x = inputs[0]
    return op.astype(op.greater(x, const(attrs.get("threshold", 0.0), x)), dtype_of(x))


def array_feature_extractor(bb, inputs, attrs, params) -> relax.Expr:
    x, idx = inputs
    return op.take(x, op.reshape(idx, [-1]), axis=rank(x) - 1)


def trilu(bb, inputs, attrs, params) -> relax.Expr:
    """Upstream's, with the run-time ``k`` path fixed (it builds its mask from unnormalised expressions)."""
    x = inputs[0]
    k = inputs[1] if len(inputs) > 1 else None
    upper = attrs.get("upper", 1)
    if k is None or isinstance(k, tvm.ir.GenericConst):
        k = 0 if k is None else int(k.value.numpy().item())
        return op.triu(x, k) if upper else op.tril(x, k)
    m, n = shape(x)[-2:]
    diff = relax.const(np.arange(n)[None, :] - np.arange(m)[:, None], "int64")  # col - row
    k = bb.normalize(op.astype(op.reshape(k, []), "int64"))
    keep = op.greater_equal(diff, k) if upper else op.less_equal(diff, k)
    return op.where(bb.normalize(keep), x, op.zeros_like(x))


def cum_prod(bb, inputs, attrs, params) -> relax.Expr:
    """CumProd along a constant axis (support.CONSTANT_INPUTS); ``reverse`` scans from the end (flip, scan,
    flip back), ``exclusive`` starts every scan from 1."""
    x = inputs[0]
    axis = int(inputs[1].value.numpy().item()) % rank(x)
    reverse = bool(attrs.get("reverse", 0))
    x = op.flip(x, axis) if reverse else x
    y = bb.normalize(op.cumprod(x, axis, exclusive=bool(attrs.get("exclusive", 0))))
    return op.flip(y, axis) if reverse else y


class NonMaxSuppression:
    """Upstream's, with the IoU threshold raised to the next float32: TOPI suppresses a box at IoU >= the
    threshold, ONNX only above it (test_nonmaxsuppression_iou_threshold_boundary). The thresholds and the
    box limit are constants (``support.CONSTANT_INPUTS``)."""

    @staticmethod
    def get_converter(opset: int):
        convert = upstream._get_convert_map()["NonMaxSuppression"].get_converter(opset)

        def run(bb, inputs, attrs, params):
            iou = np.float32(inputs[3].value.numpy().item())
            above = relax.const(np.nextafter(iou, np.float32(np.inf)), "float32")
            return convert(bb, [*inputs[:3], above, *inputs[4:]], attrs, params)

        return run


class TopK:
    """Upstream's; uint64 (which TOPI does not sort) through an order-preserving int64 key, the bits with
    the top one flipped, and the values gathered back from the input at the chosen indices."""

    @staticmethod
    def get_converter(opset: int):
        convert = upstream._get_convert_map()["TopK"].get_converter(opset)

        def run(bb, inputs, attrs, params):
            x = inputs[0]
            if dtype_of(x) != "uint64":
                return convert(bb, inputs, attrs, params)
            key = op.bitwise_xor(op.astype(x, "int64"), relax.const(np.iinfo(np.int64).min, "int64"))
            found = bb.normalize(convert(bb, [bb.normalize(key), *inputs[1:]], attrs, params))
            indices = bb.normalize(relax.TupleGetItem(found, 1))
            axis = attrs.get("axis", -1) % rank(x)
            return relax.Tuple([bb.normalize(op.gather_elements(x, indices, axis=axis)), indices])

        return run


# The cosine windows as sums of cos(2 pi k n / N') terms: op -> coefficient of each k (ONNX's definitions).
_WINDOWS = {"HannWindow": (0.5, -0.5), "HammingWindow": (25 / 46, -21 / 46), "BlackmanWindow": (0.42, -0.5, 0.08)}


def _window(coefficients: tuple[float, ...]):
    def convert(bb, inputs, attrs, params) -> relax.Expr:
        """A constant: the size is one (support.CONSTANT_INPUTS), so the window is computed here in float64
        and rounded once to ``output_datatype``; N' is the size, or size - 1 for periodic=0."""
        size = int(inputs[0].value.numpy().item())
        period = size if attrs.get("periodic", 1) else size - 1
        n = np.arange(size, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):  # size 1, symmetric: 0/0 is NaN, as ONNX's reference
            w = sum(c * np.cos(2 * np.pi * k * n / period) for k, c in enumerate(coefficients))
        dtype = onnx.helper.tensor_dtype_to_np_dtype(attrs.get("output_datatype", onnx.TensorProto.FLOAT))
        return relax.const(w.astype(dtype))

    return convert


register_converter("ai.onnx.ml", "Binarizer", binarizer)
register_converter("ai.onnx.ml", "ArrayFeatureExtractor", array_feature_extractor)
for _name, _conv in {
    "CausalConvWithState": causal_conv_with_state, "TensorScatter": tensor_scatter, "DFT": dft, "Trilu": trilu,
    "SwiGLU": swiglu, "BitCast": bitcast, "EyeLike": eye_like, "QLinearMatMul": qlinear_matmul,
    "ConvInteger": ConvInteger, "QLinearConv": QLinearConv, "ReverseSequence": reverse_sequence, "RotaryEmbedding": rotary_embedding,
    "CumProd": cum_prod, "NonMaxSuppression": NonMaxSuppression, "TopK": TopK, "STFT": stft,
    **{name: _window(c) for name, c in _WINDOWS.items()},
}.items():
    register_converter("", _name, _conv, override=True)
