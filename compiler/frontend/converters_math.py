"""Elementwise ONNX ops (and MatMul) whose Relax converter is missing or wrong at the edges (found by the
ONNX node tests).

Each converter here computes the ONNX definition exactly, including the edge cases the upstream one
gets wrong: IEEE infinities in Mod, over-wide shifts, integer powers, IsInf's sign flags, fp16 constants,
float16 matmuls summed in float16.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from .registry import register_converter

op = relax.op


def dtype_of(x: relax.Expr) -> str:
    return str(x.ty.dtype)


def const(value, like: relax.Expr) -> relax.Expr:
    """A scalar constant of ``like``'s dtype (the upstream converters mix float32 constants into fp16 math)."""
    return relax.const(value, dtype_of(like))


def is_float(dtype: str) -> bool:
    return dtype == "bfloat16" or np.dtype(dtype).kind == "f"  # numpy has no bfloat16


def mod(bb, inputs, attrs, params) -> relax.Expr:
    """Integer Mod and fmod=1 are right upstream; float fmod=0 (Python's %) is built from fmod so that
    infinities follow numpy: -3 % inf == inf, 1 % -inf == -inf (floor(x / y) * y gives NaN there)."""
    x, y = inputs
    if attrs.get("fmod", 0):
        return op.mod(x, y)
    if not is_float(dtype_of(x)):
        return op.floor_mod(x, y)
    r = op.mod(x, y)
    zero = const(0, x)
    fix = op.logical_and(op.not_equal(r, zero), op.logical_xor(op.less(r, zero), op.less(y, zero)))
    return op.where(fix, op.add(r, y), r)


def is_inf(bb, inputs, attrs, params) -> relax.Expr:
    x = inputs[0]
    pos, neg = attrs.get("detect_positive", 1), attrs.get("detect_negative", 1)
    if pos and neg:
        return op.isinf(x)
    if not pos and not neg:
        return op.zeros_like(x, "bool")
    return op.equal(x, const(np.inf if pos else -np.inf, x))


def bit_shift(bb, inputs, attrs, params) -> relax.Expr:
    """Shifts by >= the bit width or by a negative amount are UB in C (and so in TVM); ONNX defines them
    as 0, or as the sign fill (-1 for a negative value) for an arithmetic right shift."""
    x, s = inputs
    left = attrs.get("direction", b"LEFT") in (b"LEFT", "LEFT")
    bits = np.dtype(dtype_of(x)).itemsize * 8
    shifted = (op.left_shift if left else op.right_shift)(x, s)
    in_range = op.logical_and(op.greater_equal(s, const(0, s)), op.less(s, const(bits, s)))
    fill = op.zeros_like(shifted)
    if not left and np.dtype(dtype_of(x)).kind == "i":
        fill = op.where(op.less(x, const(0, x)), op.full_like(shifted, const(-1, x)), fill)
    return op.where(in_range, shifted, fill)


def power(bb, inputs, attrs, params) -> relax.Expr:
    """Pow with an exponent of another type (cast to the base's float type), and integer ** integer by
    repeated squaring (exact, wrapping like C; x ** -n is 0 unless |x| == 1)."""
    x, e = inputs
    if is_float(dtype_of(x)):
        return op.power(x, e if dtype_of(e) == dtype_of(x) else op.astype(e, dtype_of(x)))
    if is_float(dtype_of(e)):  # int ** float: ONNX computes in the base's integer type after the float power
        return op.astype(op.power(op.astype(x, "float64"), op.astype(e, "float64")), dtype_of(x))
    e = op.astype(e, dtype_of(x))
    one, zero = const(1, x), const(0, x)
    result, base, rest = op.ones_like(op.add(x, e)), x, op.maximum(e, zero)
    for _ in range(np.dtype(dtype_of(x)).itemsize * 8 - 1):
        odd = op.equal(op.bitwise_and(rest, one), one)
        result = op.where(odd, op.multiply(result, base), result)
        base, rest = op.multiply(base, base), op.right_shift(rest, one)
    if np.dtype(dtype_of(x)).kind == "u":
        return result
    # negative exponents: 1 ** -n = 1, (-1) ** -n = +-1, anything else truncates to 0
    neg = op.where(op.equal(x, one), op.ones_like(result),
                   op.where(op.equal(x, const(-1, x)), result, op.zeros_like(result)))
    return op.where(op.less(e, zero), neg, result)


def elu(bb, inputs, attrs, params) -> relax.Expr:
    x = inputs[0]
    alpha = const(attrs.get("alpha", 1.0), x)
    return op.where(op.greater(x, const(0, x)), x, op.multiply(alpha, op.subtract(op.exp(x), const(1, x))))


def celu(bb, inputs, attrs, params) -> relax.Expr:
    x = inputs[0]
    alpha = const(attrs.get("alpha", 1.0), x)
    neg = op.multiply(alpha, op.subtract(op.exp(op.divide(x, alpha)), const(1, x)))
    return op.add(op.maximum(x, const(0, x)), op.minimum(neg, const(0, x)))


def swish(bb, inputs, attrs, params) -> relax.Expr:
    x = inputs[0]
    return op.multiply(x, op.sigmoid(op.multiply(x, const(attrs.get("alpha", 1.0), x))))


for _name, _conv in {"Mod": mod, "IsInf": is_inf, "BitShift": bit_shift, "Pow": power, "Elu": elu,
                     "Celu": celu, "Swish": swish}.items():
    register_converter("", _name, _conv, override=True)


def matmul(bb, inputs, attrs, params) -> relax.Expr:
    """16-bit float products are summed in float32 (as numpy, onnxruntime and tensor cores do); summing
    in float16 loses several units of the last place over a long reduction."""
    a, b = inputs
    if dtype_of(a) in ("float16", "bfloat16") and dtype_of(b) == dtype_of(a):
        return op.astype(op.matmul(a, b, out_dtype="float32"), dtype_of(a))
    return op.matmul(a, b)


register_converter("", "MatMul", matmul, override=True)
