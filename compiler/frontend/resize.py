"""ONNX Resize (opset 11+) and Upsample as per-axis gathers, following the ONNX reference's separable
definition: every coordinate transformation, nearest / linear / cubic, antialias, exclude_outside,
tf_crop_and_resize's extrapolation, ``axes`` and ``keep_aspect_ratio_policy``.

The upstream converter resizes to an output size (so a fractional ``scales`` maps coordinates by the
rounded size, not the scale), ignores antialias and fails on ``axes``. Here the output size, the source
coordinate of every output position and its interpolation weights are computed once in float64 numpy
(roi/scales/sizes are constants: ``support.CONSTANT_INPUTS``); the graph gathers the k neighbours along
each axis and sums them with those weights (nearest: one gather, exact for any dtype).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from tvm import relax

from .converters_math import dtype_of, is_float
from .converters_nn import rank, shape
from .converters_ops import rint
from .registry import register_converter
from .support import REFUSALS, attr

op = relax.op
Coeffs = Callable[[float, float], np.ndarray]  # (ratio in (0, 1], scale) -> weights of the window


def _text(attrs: dict, name: str, default: str) -> str:
    value = attrs.get(name, default)
    return value.decode() if isinstance(value, bytes) else value


def _nearest(rounding: str) -> Coeffs:
    def coeffs(ratio: float, scale: float) -> np.ndarray:
        if ratio == 1 or rounding == "ceil":
            return np.array([0.0, 1.0])
        up = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5, "floor": False}[rounding]
        return np.array([float(not up), float(up)])

    return coeffs


def _linear(antialias: bool) -> Coeffs:
    def coeffs(ratio: float, scale: float) -> np.ndarray:
        if not antialias:
            return np.array([1 - ratio, ratio])
        scale = min(scale, 1.0)
        start = int(np.floor(-1 / scale) + 1)
        w = np.clip(1 - np.abs((np.arange(start, 2 - start) - ratio) * scale), 0, 1)
        return w / w.sum()

    return coeffs


def _cubic(a: float, antialias: bool) -> Coeffs:
    def kernel(x: np.ndarray) -> np.ndarray:
        x = np.abs(x)
        near = ((a + 2) * x - (a + 3)) * x * x + 1
        far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
        return np.where(x <= 1, near, np.where(x < 2, far, 0.0))

    def coeffs(ratio: float, scale: float) -> np.ndarray:
        if not antialias:
            return kernel(np.array([ratio + 1, ratio, 1 - ratio, 2 - ratio]))
        scale = min(scale, 1.0)
        start = int(np.floor(-2 / scale) + 1)
        w = kernel(scale * (np.arange(start, 2 - start) - ratio))
        return w / w.sum()

    return coeffs


def _source(mode: str, n_in: int, n_out: int, scale: float, roi: tuple[float, float] | None):
    """Source coordinate of every output position, and which ones tf_crop_and_resize extrapolates."""
    y, width = np.arange(n_out, dtype=np.float64), scale * n_in
    if mode == "align_corners":
        return (np.zeros(n_out) if width == 1 else y * (n_in - 1) / (width - 1)), None
    if mode == "asymmetric":
        return y / scale, None
    if mode == "tf_crop_and_resize":
        lo, hi = roi
        x = np.full(n_out, (hi - lo) * (n_in - 1) / 2) if width == 1 else y * (hi - lo) * (n_in - 1) / (width - 1)
        x = x + lo * (n_in - 1)
        return x, (x < 0) | (x > n_in - 1)
    if mode == "pytorch_half_pixel":
        return (np.full(n_out, -0.5) if width == 1 else (y + 0.5) / scale - 0.5), None
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5, None
    if mode == "half_pixel_symmetric":
        return n_in / 2 * (1 - n_out / width) + (y + 0.5) / scale - 0.5, None
    if mode == "tf_half_pixel_for_nn":  # opset 11 only
        return (y + 0.5) / scale, None
    raise NotImplementedError(f"coordinate_transformation_mode '{mode}'")


def _plan(n_in: int, n_out: int, scale: float, roi, attrs: dict, coeffs: Coeffs):
    """(neighbour indices [n_out, k], weights [n_out, k], extrapolated [n_out] or None) for one axis."""
    x, outside = _source(_text(attrs, "coordinate_transformation_mode", "half_pixel"), n_in, n_out, scale, roi)
    floor = np.floor(x)
    ratios = np.where(x == floor, 1.0, x - floor)  # (0, 1]: the left neighbour is preferred
    w = np.stack([coeffs(float(r), scale) for r in ratios])
    k = w.shape[1]
    # the k nearest source positions (ties to the smaller), as the reference finds them in an edge-padded row
    pad = int(np.ceil(k / 2))
    padded = x + pad
    p = np.floor(padded).astype(np.int64)
    frac = padded - p
    if k % 2 == 0:
        start = p + np.where(frac == 0, -(k // 2), -(k // 2) + 1)
    else:
        start = p + np.where(frac <= 0.5, -((k - 1) // 2), -((k - 1) // 2) + 1)
    idx = start[:, None] + np.arange(k)[None, :] - pad
    if attrs.get("exclude_outside", 0):
        w = np.where((idx < 0) | (idx >= n_in), 0.0, w)
        total = w.sum(axis=1, keepdims=True)
        w = w / np.where(total == 0, 1.0, total)
    return np.clip(idx, 0, n_in - 1), w, outside


def _saturate(bb, y: relax.Expr, dtype: str) -> relax.Expr:
    """The reference's final cast: integers rounded half to even and clipped to their range."""
    if is_float(dtype):
        return op.astype(y, dtype)
    info = np.iinfo(dtype)
    return op.astype(op.clip(rint(bb, y), float(info.min), float(info.max)), dtype)


def resize_axes(bb, x: relax.Expr, sizes: dict[int, int], scales: dict[int, float], rois: dict, attrs: dict,
                coeffs: Coeffs) -> relax.Expr:
    """Resize ``x`` along each axis of ``sizes`` (its output size; ``scales`` its scale, ``rois`` its roi)."""
    r, dtype = rank(x), dtype_of(x)
    extrapolation = float(attrs.get("extrapolation_value", 0.0))
    plans = {}
    for a, n_out in sizes.items():
        n_in, roi = shape(x)[a], rois.get(a)
        if np.isclose(scales[a], 1.0) and n_out == n_in and (roi is None or np.allclose(roi, (0.0, 1.0))):
            continue  # the identity: the reference skips it too
        plans[a] = _plan(n_in, n_out, scales[a], roi, attrs, coeffs)
    one_hot = all(np.all((w == 0) | (w == 1)) and np.all(w.sum(axis=1) == 1) for _, w, _ in plans.values())
    work = dtype if one_hot else ("float64" if dtype == "float64" or not is_float(dtype) else "float32")
    y = x if work == dtype else bb.normalize(op.astype(x, work))
    for a, (idx, w, outside) in plans.items():
        if one_hot:
            y = bb.normalize(op.take(y, relax.const(idx[np.arange(len(idx)), w.argmax(axis=1)], "int64"), axis=a))
        else:
            terms = []
            for j in range(idx.shape[1]):
                weight = relax.const(w[:, j].reshape([-1] + [1] * (r - a - 1)), work)
                terms.append(op.multiply(op.take(y, relax.const(idx[:, j], "int64"), axis=a), weight))
            y = terms[0]
            for t in terms[1:]:
                y = op.add(y, t)
            y = bb.normalize(y)
        if outside is not None and outside.any():
            fill = np.asarray(extrapolation)
            if not is_float(work):  # the reference computes in float64 and rounds into the integer type
                info = np.iinfo(work)
                fill = np.clip(np.round(fill), info.min, info.max)
            keep = relax.const(~outside.reshape([-1] + [1] * (r - a - 1)))
            y = bb.normalize(op.where(keep, y, relax.const(fill, work)))
    return y if work == dtype else _saturate(bb, y, dtype)


def _values(x: relax.Expr | None) -> np.ndarray | None:
    """A constant input's value; None for an omitted or empty one."""
    if x is None:
        return None
    value = x.value.numpy()
    return value if value.size else None


def _coeffs(attrs: dict) -> Coeffs:
    mode, antialias = _text(attrs, "mode", "nearest"), bool(attrs.get("antialias", 0))
    if mode == "nearest":
        return _nearest(_text(attrs, "nearest_mode", "round_prefer_floor"))
    if mode == "linear":
        return _linear(antialias)
    if mode == "cubic":
        return _cubic(float(attrs.get("cubic_coeff_a", -0.75)), antialias)
    raise NotImplementedError(f"mode '{mode}'")


class Resize:
    """Opset 11+ (roi, scales, sizes as inputs)."""

    @staticmethod
    def get_converter(opset: int):
        if opset < 11:
            raise NotImplementedError(f"Resize opset {opset} (scales only, opset 10) is not supported")
        return Resize.convert

    @staticmethod
    def convert(bb, inputs, attrs, params) -> relax.Expr:
        x, roi, scales, sizes = (list(inputs) + [None] * 4)[:4]
        r, dims = rank(x), shape(x)
        axes = [a % r for a in attrs.get("axes", range(r))]
        roi, scales, sizes = _values(roi), _values(scales), _values(sizes)
        rois = {a: (float(roi[i]), float(roi[i + len(axes)])) for i, a in enumerate(axes)} if roi is not None else {}
        if sizes is not None:
            out = {a: int(sizes[i]) for i, a in enumerate(axes)}
            factor = {a: out[a] / dims[a] for a in axes}
            policy = _text(attrs, "keep_aspect_ratio_policy", "stretch")
            if policy != "stretch":
                one = (min if policy == "not_larger" else max)(factor.values())
                factor = dict.fromkeys(axes, one)
                out = {a: int(one * dims[a] + 0.5) for a in axes}
        else:
            factor = {a: float(scales[i]) for i, a in enumerate(axes)}
            out = {a: int(factor[a] * dims[a]) for a in axes}
        return resize_axes(bb, x, out, factor, rois, attrs, _coeffs(attrs))


def upsample(bb, inputs, attrs, params) -> relax.Expr:
    """Upsample (opsets 7-9): asymmetric coordinates, nearest rounding down (np.repeat for whole scales)."""
    x = inputs[0]
    scales = _values(inputs[1]) if len(inputs) > 1 else np.asarray(attrs["scales"], np.float32)
    mode = _text(attrs, "mode", "nearest")
    coeffs = _nearest("floor") if mode == "nearest" else _linear(False)
    factor = {a: float(s) for a, s in enumerate(scales)}
    out = {a: int(s * d) for (a, s), d in zip(factor.items(), shape(x))}
    return resize_axes(bb, x, out, factor, {}, {"coordinate_transformation_mode": "asymmetric"}, coeffs)


def _refusal(node: onnx.NodeProto, graph: onnx.GraphProto) -> str | None:
    if attr(node, "antialias", 0) and attr(node, "mode", "nearest") == "nearest":
        return "antialias=1 is undefined for mode='nearest'"
    return None


register_converter("", "Resize", Resize, override=True)
register_converter("", "Upsample", upsample, override=True)
REFUSALS["Resize"] = _refusal
