"""Pad, CenterCropPad, Split, OneHot, AffineGrid, Col2Im and MaxUnpool from gathers, scatters, slices
and comparisons: the upstream converters fail on forms the ONNX node tests use (Pad's run-time
constant_value at opset 25, zero-size splits, OneHot's bound depth, AffineGrid's bound size, MaxUnpool's
output_shape; CenterCropPad and Col2Im have none); Unsqueeze is upstream's, given a scalar ``axes`` as a list.
Shape-deciding inputs are constants here (``support.CONSTANT_INPUTS``), so every index map is computed once in numpy
and the graph only gathers and selects: exact for any dtype.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as upstream

from .converters_math import dtype_of, is_float
from .converters_nn import rank, shape
from .registry import register_converter

op = relax.op


def _values(x: relax.Expr | None) -> np.ndarray | None:
    """A constant input's value (None if the optional input is omitted)."""
    return None if x is None else x.value.numpy()


def _source_index(idx: np.ndarray, n: int, mode: str) -> np.ndarray:
    """For output positions ``idx`` (in source coordinates, possibly outside [0, n)), the element each copies."""
    if mode == "reflect" and n > 1:  # period 2(n-1): np.pad's repeated reflection
        t = np.mod(idx, 2 * n - 2)
        return np.where(t < n, t, 2 * n - 2 - t)
    if mode == "wrap":
        return np.mod(idx, n)
    return np.clip(idx, 0, n - 1)  # edge (and constant, whose outside positions are replaced)


def _pad(bb, x: relax.Expr, widths: dict[int, tuple[int, int]], mode: str, value: relax.Expr,
         fill: float | None = None) -> relax.Expr:
    """``widths``: axis -> (before, after). Negative widths crop first, then the positive ones pad what is
    left (onnxruntime's order: wrap/reflect see the cropped axis). One gather per axis; mode='constant'
    then selects ``value`` outside the source along that axis. Except the common case, a floating-point tensor
    padded with a value known here (``fill``): one ``nn.pad`` (a select per element, which the CPU rule turns into
    copies of parts)."""
    r = rank(x)
    padding = all(w >= 0 for ws in widths.values() for w in ws)  # (no crops)
    if mode == "constant" and fill is not None and is_float(dtype_of(x)) and padding:
        return bb.normalize(op.nn.pad(x, [w for a in range(r) for w in widths.get(a, (0, 0))], "constant", fill))
    y = x
    for a, (begin, end) in widths.items():
        n = shape(x)[a]
        if begin == 0 and end == 0:
            continue
        lo, m = max(-begin, 0), n - max(-begin, 0) - max(-end, 0)  # the kept source range [lo, lo + m)
        idx = np.arange(-max(begin, 0), m + max(end, 0))
        if m <= 0:  # nothing to copy: the whole axis is the constant (the other modes need a source)
            y = bb.normalize(op.broadcast_to(op.reshape(value, [1] * r), [*shape(y)[:a], len(idx), *shape(y)[a + 1:]]))
            continue
        y = bb.normalize(op.take(y, relax.const(lo + _source_index(idx, m, mode), "int64"), axis=a))
        outside = (idx < 0) | (idx >= m)
        if mode == "constant" and outside.any():
            keep = relax.const(~outside.reshape([-1] + [1] * (r - a - 1)))
            y = bb.normalize(op.where(keep, y, value))
    return y


def pad(bb, inputs, attrs, params) -> relax.Expr:
    """Every mode, negative pads (crops) and ``axes``; the constant value may be a run-time scalar."""
    x = inputs[0]
    r = rank(x)
    mode = attrs.get("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if len(inputs) > 1:  # opset 11+
        pads = _values(inputs[1]).astype(np.int64).tolist()
        value = inputs[2] if len(inputs) > 2 else None
        axes = _values(inputs[3]) if len(inputs) > 3 else None
    else:
        pads, value, axes = list(attrs["pads"]), relax.const(attrs.get("value", 0.0), dtype_of(x)), None
    axes = list(range(r)) if axes is None else [int(a) % r for a in axes]
    fill = None  # the value, where known here (not a run-time scalar; ONNX gives it the data's type)
    if value is None or (isinstance(value, tvm.ir.GenericConst) and value.value.numpy().size == 1):
        fill = 0.0 if value is None else float(value.value.numpy().reshape(-1)[0])  # (exporters write a 0-d or [1])
    value = relax.const(0, dtype_of(x)) if value is None else bb.normalize(op.astype(value, dtype_of(x)))
    return _pad(bb, x, {a: (pads[k], pads[k + len(axes)]) for k, a in enumerate(axes)}, mode, value, fill)


def center_crop_pad(bb, inputs, attrs, params) -> relax.Expr:
    """Crop or zero-pad each of ``axes`` to the target size around the centre (the odd element at the end)."""
    x = inputs[0]
    r = rank(x)
    target = _values(inputs[1]).astype(int).tolist()
    axes = [a % r for a in attrs.get("axes", range(r))]
    widths = {}
    for a, size in zip(axes, target):
        d = size - shape(x)[a]
        half = abs(d) // 2 * (1 if d > 0 else -1)
        widths[a] = (half, d - half)
    return _pad(bb, x, widths, "constant", relax.const(0, dtype_of(x)))


def split(bb, inputs, attrs, params) -> relax.Expr:
    """Parts of the given sizes (zero sizes included), or ``num_outputs`` / as many outputs as the node has
    equal parts (the last one smaller, opset 18)."""
    x = inputs[0]
    axis = attrs.get("axis", 0) % rank(x)
    n, outputs = shape(x)[axis], attrs["tvm_custom"]["num_outputs"]
    sizes = _values(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else attrs.get("split")
    if sizes is None:
        part = -(-n // attrs.get("num_outputs", outputs))
        sizes = [min(part, n - start) for start in range(0, n, part)] if n else [0] * outputs
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(int).tolist()
    if all(size > 0 for size in sizes):  # R.split: one kernel writing every part
        return op.split(x, starts[1:-1], axis=axis)
    # R.split wants strictly increasing split points: one slice per part instead
    return relax.Tuple([bb.normalize(op.strided_slice(x, [axis], [b], [e])) for b, e in zip(starts, starts[1:])])


def one_hot(bb, inputs, attrs, params) -> relax.Expr:
    """values[1] where the index (negative ones counted from ``depth``) equals the position along the new
    axis, values[0] elsewhere (an out-of-range index gives a row of values[0])."""
    indices, depth, values = inputs
    depth = int(_values(depth).reshape(-1)[0])  # float or int; ONNX takes the whole part
    r = rank(indices) + 1
    axis = attrs.get("axis", -1) % r
    idx = bb.normalize(op.astype(indices, "int64"))  # float indices: their whole part, as ONNX
    idx = bb.normalize(op.where(op.less(idx, relax.const(0, "int64")), op.add(idx, relax.const(depth, "int64")), idx))
    positions = relax.const(np.arange(depth).reshape([-1] + [1] * (r - axis - 1)), "int64")
    hot = op.equal(op.expand_dims(idx, axis), positions)
    off_on = [bb.normalize(op.strided_slice(values, [0], [k], [k + 1])) for k in (0, 1)]
    return op.where(bb.normalize(hot), op.reshape(off_on[1], []), op.reshape(off_on[0], []))


def affine_grid(bb, inputs, attrs, params) -> relax.Expr:
    """grid[n, ..., :] = theta[n] @ (x, y[, z], 1) over the normalised pixel centres (or corners with
    align_corners): a matmul with a constant base grid, in theta's dtype."""
    theta = inputs[0]
    size = _values(inputs[1]).astype(int).tolist()
    spatial = size[2:]
    align = bool(attrs.get("align_corners", 0))

    def coords(n: int) -> np.ndarray:
        if align:
            return np.linspace(-1.0, 1.0, n) if n > 1 else np.zeros(1)
        return (2 * np.arange(n) + 1) / n - 1

    # coordinates x (last spatial axis) first, then y (and z), then the homogeneous 1
    mesh = np.meshgrid(*[coords(n) for n in spatial], indexing="ij")
    base = np.stack([*reversed(mesh), np.ones(spatial)], axis=-1).reshape(-1, len(spatial) + 1)
    base = relax.const(base.astype(dtype_of(theta)))
    grid = op.matmul(base, op.permute_dims(theta, [0, 2, 1]))  # [N, pixels, dims]
    return op.reshape(grid, [size[0], *spatial, len(spatial)])


def col2im(bb, inputs, attrs, params) -> relax.Expr:
    """Sum the column blocks back into the image: for every image position, the (kernel offset, block)
    entries that land on it are gathered and added in kernel-offset order, as the reference accumulates; a
    position with fewer contributions gathers an appended zero column for the rest."""
    x = inputs[0]
    image, kernel = (_values(v).astype(int).tolist() for v in inputs[1:3])
    n_dims = len(image)
    dil = attrs.get("dilations", [1] * n_dims)
    pads = attrs.get("pads", [0] * 2 * n_dims)
    strides = attrs.get("strides", [1] * n_dims)
    blocks = [(image[d] + pads[d] + pads[d + n_dims] - dil[d] * (kernel[d] - 1) - 1) // strides[d] + 1
              for d in range(n_dims)]
    n, ck, length = shape(x)
    k_total = int(np.prod(kernel))
    sources: list[list[int]] = [[] for _ in range(int(np.prod(image)))]
    for k, k_idx in enumerate(np.ndindex(*kernel)):
        for b, b_idx in enumerate(np.ndindex(*blocks)):
            pos = [b_idx[d] * strides[d] - pads[d] + k_idx[d] * dil[d] for d in range(n_dims)]
            if all(0 <= pos[d] < image[d] for d in range(n_dims)):
                sources[int(np.ravel_multi_index(pos, image))].append(k * length + b)
    zero = k_total * length
    width = max(1, max(map(len, sources)))
    index = np.array([src + [zero] * (width - len(src)) for src in sources], np.int64)
    c = ck // k_total
    flat = op.reshape(x, [n, c, k_total * length])
    flat = bb.normalize(op.concat([flat, relax.const(np.zeros((n, c, 1)), dtype_of(x))], axis=2))
    total = op.take(flat, relax.const(index[:, 0], "int64"), axis=2)
    for m in range(1, width):
        total = op.add(total, op.take(flat, relax.const(index[:, m], "int64"), axis=2))
    return op.reshape(bb.normalize(total), [n, c, *image])


def max_unpool(bb, inputs, attrs, params) -> relax.Expr:
    """Scatter X to its flat Indices in the inferred shape, then zero-pad at the end of each axis up to
    ``output_shape`` when given (a constant): the reference's order."""
    x, indices = inputs[:2]
    dims, kernel = shape(x), attrs["kernel_shape"]
    nk = len(kernel)
    strides, pads = attrs.get("strides", [1] * nk), attrs.get("pads", [0] * 2 * nk)
    inferred = dims[:2] + [(dims[d + 2] - 1) * strides[d] - pads[d] - pads[d + nk] + kernel[d] for d in range(nk)]
    size = int(np.prod(inferred))
    flat = op.scatter_elements(relax.const(np.zeros(size), dtype_of(x)), op.reshape(indices, [-1]),
                               op.reshape(x, [-1]), axis=0)
    y = bb.normalize(op.reshape(bb.normalize(flat), inferred))
    if len(inputs) < 3 or inputs[2] is None:
        return y
    wanted = _values(inputs[2]).astype(int).tolist()
    widths = {a: (0, wanted[a] - inferred[a]) for a in range(len(inferred))}
    return _pad(bb, y, widths, "constant", relax.const(0, dtype_of(x)))


class Unsqueeze(upstream.Unsqueeze):
    """``axes`` may be a scalar: PyTorch's dynamo exporter writes one axis so (grouped-query SDPA's head repeat),
    onnxruntime takes it, and the upstream converter iterates it ("'int' object is not iterable")."""

    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        axes = _values(inputs[1])
        if axes is not None and axes.ndim == 0:
            inputs = [inputs[0], relax.const(axes.reshape(1))]
        return super()._impl_v13(bb, inputs, attr, params)


for _name, _conv in {"Pad": pad, "CenterCropPad": center_crop_pad, "Split": split, "OneHot": one_hot,
                     "AffineGrid": affine_grid, "Col2Im": col2im, "MaxUnpool": max_unpool,
                     "Unsqueeze": Unsqueeze}.items():
    register_converter("", _name, _conv, override=True)
