"""Small helpers the graph passes share: constants as numpy, static shapes, who uses a variable."""

from __future__ import annotations

from collections import Counter

import numpy as np
import tvm
from tvm import relax


# Relax ops that map each element on its own (extra arguments, if any, are attributes such as clip's bounds).
UNARY_ELEMENTWISE = ("relax.nn.relu", "relax.nn.gelu", "relax.nn.gelu_tanh", "relax.nn.silu", "relax.nn.leakyrelu",
                     "relax.sigmoid", "relax.tanh", "relax.exp", "relax.erf", "relax.sqrt", "relax.negative",
                     "relax.abs", "relax.clip", "relax.astype")
# Relax ops that combine two (broadcast) tensors element by element.
BINARY_ELEMENTWISE = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.power", "relax.maximum",
                      "relax.minimum")


def const_array(expr: relax.Expr) -> np.ndarray | None:
    """The value of a Relax constant (None for anything else)."""
    return expr.value.numpy() if isinstance(expr, tvm.ir.GenericConst) else None


def scalar(expr: relax.Expr) -> float | None:
    """The value of a one-element floating-point constant, e.g. the 8.0 of ``scores / 8.0``."""
    value = const_array(expr)
    return float(value.reshape(())) if value is not None and value.size == 1 and value.dtype.kind == "f" else None


def static_shape(expr: relax.Expr) -> tuple[int, ...] | None:
    """The static shape of a tensor-typed expression (None if unknown or symbolic)."""
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    try:
        return tuple(int(d) for d in ty.shape)
    except TypeError:
        return None


def dtype(expr: relax.Expr) -> str:
    """The element type of a tensor-typed expression, e.g. 'float32'."""
    return str(expr.ty.dtype)


def nbytes(expr: relax.Expr) -> int:
    """Bytes of a statically shaped tensor (0 when the shape is not static)."""
    shape = static_shape(expr)
    return 0 if shape is None else int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype(expr)).itemsize


def users(func: relax.Function) -> Counter:
    """How many bindings (plus the function's return value) read each variable."""
    count: Counter = Counter()
    for block in func.body.blocks:
        for binding in block.bindings:
            count.update(relax.analysis.used_vars(binding.value))
    count.update(relax.analysis.used_vars(func.body.body))
    return count


def private(var: relax.Expr, uses: Counter) -> bool:
    """True for an intermediate that only one op reads: rewriting its producer away changes nothing else."""
    return isinstance(var, relax.DataflowVar) and uses[var] == 1


def sole_producer(var: relax.Expr, var2val: dict, uses: Counter) -> relax.Call | None:
    """The op call that computes ``var``, if ``var`` is private: only then may a rewrite change or drop it."""
    value = var2val.get(var) if private(var, uses) else None
    return value if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) else None
