"""FoldBatchNorm: inference BatchNormalization disappears into the weights of the op before it.

At inference BN is a per-channel affine map ``y = x * s + t`` (``s = gamma / sqrt(var + eps)``,
``t = beta - mean * s``). After a Conv / ConvTranspose / MatMul with constant weights whose output only the
BN reads, ``s`` goes into the weights and ``t`` into the bias (computed here in numpy, once): the BN kernel
and the tensor it reads vanish. Any other BN becomes that multiply-add, which FuseOps then fuses into the
producer's kernel as an epilogue. (The frontend's ONNX cleaning already folds BN that directly follows a
Conv/ConvTranspose/Gemm; this pass catches the rest, e.g. MatMul -> BN, Conv -> Relu -> BN.)
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op, is_tuple_get_item, rewrite_call, wildcard

from .util import const_array, dtype, sole_producer, users

_BN = is_op("relax.nn.batch_norm")(wildcard(), is_const(), is_const(), is_const(), is_const())
_CONV = ("relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d")
_CONV_T = ("relax.nn.conv1d_transpose", "relax.nn.conv2d_transpose")


def _along(v: np.ndarray, axis: int, rank: int) -> np.ndarray:
    """Reshape a per-channel vector to broadcast along ``axis`` of a rank-``rank`` tensor."""
    shape = [1] * rank
    shape[axis] = -1
    return v.reshape(shape)


def _scaled_weight(call: relax.Call, s: np.ndarray, axis: int) -> np.ndarray | None:
    """The producer's constant weight with output channel ``c`` multiplied by ``s[c]``, if that is possible."""
    name = call.op.name
    w = const_array(call.args[1]) if name in ("relax.matmul", *_CONV, *_CONV_T) else None
    if w is None:
        return None
    if name == "relax.matmul":
        return w * s if w.ndim >= 2 and axis == call.ty.ndim - 1 else None
    if call.attrs.out_layout.index("C") != axis:
        return None
    o = call.attrs.kernel_layout.index("O")
    if name in _CONV:
        return w * _along(s, o, w.ndim)
    if call.attrs.kernel_layout.index("I") != 0 or o != 1:
        return None
    groups = int(call.attrs.groups)  # IOHW weight: group g's rows produce channels g*O .. g*O+O-1
    grouped = w.reshape(groups, -1, *w.shape[1:])
    return (grouped * s.reshape(groups, 1, -1, *[1] * (w.ndim - 2))).reshape(w.shape)


def _fold(item: relax.Expr, matches: dict, var2val: dict, uses) -> relax.Expr:
    bn = matches[_BN]
    attrs, data = bn.attrs, bn.args[0]
    if attrs.training:
        return item
    gamma, beta, mean, var = (const_array(a).astype(np.float64) for a in bn.args[1:])
    rank = data.ty.ndim
    axis = int(attrs.axis) % rank
    s = (gamma if attrs.scale else 1.0) / np.sqrt(var + float(attrs.epsilon))
    t = (beta if attrs.center else 0.0) - mean * s
    dt = dtype(data)

    producer, bias = sole_producer(data, var2val, uses), np.zeros(1)
    if producer is not None and producer.op.name == "relax.add":  # a bias add: fold through it
        lhs, c = producer.args if const_array(producer.args[1]) is not None else producer.args[::-1]
        if const_array(c) is not None:
            producer, bias = sole_producer(lhs, var2val, uses), const_array(c).astype(np.float64)
    if producer is not None:
        w = _scaled_weight(producer, s, axis)
        if w is not None:
            linear = relax.Call(producer.op, [producer.args[0], relax.const(w.astype(dt))], producer.attrs)
            return relax.op.add(linear, relax.const((bias * _along(s, axis, rank) + _along(t, axis, rank)).astype(dt)))
    return relax.op.add(
        relax.op.multiply(bn.args[0], relax.const(_along(s, axis, rank).astype(dt))),
        relax.const(_along(t, axis, rank).astype(dt)),
    )


@relax.transform.function_pass(opt_level=0, name="FoldBatchNorm")
class FoldBatchNorm:
    def transform_function(self, func: relax.Function, mod: tvm.IRModule, ctx) -> relax.Function:
        var2val, uses = relax.analysis.get_var2val(func), users(func)
        return rewrite_call(is_tuple_get_item(_BN, 0), lambda e, m: _fold(e, m, var2val, uses), func)
