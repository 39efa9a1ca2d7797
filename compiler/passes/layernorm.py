"""FuseLayerNorm: LayerNormalization written out op by op becomes one ``relax.nn.layer_norm``.

Exports below opset 17 (and many TF graphs) have no LayerNormalization op: they write
``d = x - mean(x); y = d / sqrt(mean(d^2) + eps) * gamma + beta`` over the trailing axes. FuseOps cannot
put two reductions in one kernel, so that is three kernels and full-size intermediates through memory;
the op is one kernel.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

from .util import const_array, dtype, private, scalar, static_shape, users

_X, _EPS, _GAMMA, _BETA = wildcard(), is_const(), is_const(), is_const()
_MEAN = is_op("relax.mean")(_X)
_D = is_op("relax.subtract")(_X, _MEAN)
_SQ = is_op("relax.power")(_D, is_const()) | is_op("relax.multiply")(_D, _D)
_VAR = is_op("relax.mean")(_SQ)
_EPS_ADD = is_op("relax.add")(_VAR, _EPS)
_SQRT = is_op("relax.sqrt")(_EPS_ADD | _VAR)
_NORM = is_op("relax.divide")(_D, _SQRT)
_SCALED = is_op("relax.multiply")(_NORM, _GAMMA)
_FULL = is_op("relax.add")(_SCALED, _BETA)


def _axes(mean: relax.Call, rank: int) -> list[int] | None:
    """The normalised axes of a keepdims mean if they are the trailing ones, else None."""
    if not mean.attrs.keepdims or mean.attrs.axis is None:
        return None
    axes = sorted(int(a) % rank for a in mean.attrs.axis)
    return axes if axes == list(range(rank - len(axes), rank)) else None


def _affine(c: relax.Expr, norm_shape: tuple[int, ...]) -> np.ndarray | None:
    """gamma/beta as the op wants them (exactly the normalised shape), if they only vary along it."""
    v = const_array(c)
    lead = v.shape[: max(0, v.ndim - len(norm_shape))]
    if any(s != 1 for s in lead):
        return None
    try:
        return np.broadcast_to(v.reshape(v.shape[len(lead):]), norm_shape)
    except ValueError:
        return None


def _fuse(anchor: relax.Call, m: dict, uses, affine: int) -> relax.Expr:
    """``affine``: 0 for the bare normalisation, 1 with the gamma multiply, 2 with gamma and beta."""
    x, shape = m[_X], static_shape(m[_X])
    axes = None if shape is None else _axes(m[_MEAN], len(shape))
    sq = m[_SQ]
    if axes is None or _axes(m[_VAR], len(shape)) != axes or (sq.op.name == "relax.power" and scalar(sq.args[1]) != 2):
        return anchor
    # The intermediates may be read only inside the pattern (d twice), else fusing would compute them twice.
    inner = [m[_D].args[1], m[_VAR].args[0], m[_SQRT].args[0], m[_NORM].args[1]]
    inner += [m[_EPS_ADD].args[0]] if _EPS_ADD in m else []
    inner += [m[_SCALED].args[0]] if affine else []
    inner += [anchor.args[0]] if affine == 2 else []
    d = m[_NORM].args[0]
    if uses[d] != 2 or not isinstance(d, relax.DataflowVar) or not all(private(v, uses) for v in inner):
        return anchor
    eps = scalar(m[_EPS]) if _EPS_ADD in m else 0.0
    norm_shape = shape[axes[0]:]
    dt = dtype(x)
    gamma = _affine(m[_GAMMA], norm_shape) if affine else np.ones(norm_shape, dt)
    beta = _affine(m[_BETA], norm_shape) if affine == 2 else np.zeros(norm_shape, dt)
    if gamma is None or beta is None or eps is None or eps < 0:
        return anchor
    return relax.op.nn.layer_norm(x, relax.const(gamma.astype(dt)), relax.const(beta.astype(dt)), axes, eps)


@relax.transform.function_pass(opt_level=0, name="FuseLayerNorm")
class FuseLayerNorm:
    def transform_function(self, func: relax.Function, mod: tvm.IRModule, ctx) -> relax.Function:
        for affine, pattern in ((2, _FULL), (1, _SCALED), (0, _NORM)):  # the longest match first
            uses = users(func)
            func = rewrite_call(pattern, lambda c, m, a=affine, u=uses: _fuse(c, m, u, a), func)
        return func
