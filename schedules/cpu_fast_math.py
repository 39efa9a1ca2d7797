"""CPU legalisations of erf / tanh / GELU / sigmoid with vectorisable polynomial approximations (TOPI's fast_*).
(Small integer powers become products earlier, for every target: ``passes.small_powers``.)

On LLVM CPUs ``erf`` and ``tanh`` lower to scalar libm calls, which no schedule can vectorise: BERT's
GELU epilogue alone cost more than its matmul. TOPI's ``fast_erf`` / ``fast_tanh`` are the rational
approximations Eigen uses (within a few ulp of fp32), as onnxruntime's CPU kernels also approximate.
Sigmoid (EfficientNet's and RegNet's SiLU, squeeze-and-excitation gates) lowers to a scalar ``expf`` in the same way:
a 1x1 conv + SiLU over 112 x 112 took 7x its time with a Relu. It is written on softmax's ``vexp``, which keeps NaN
(TOPI's ``fast_exp`` clamps it to a number; onnxruntime's Sigmoid gives NaN).
Other targets keep TVM's own lowering (CUDA's erff/tanhf are fast already).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from tvm import relax, te, tirx, topi

from .common import compiling_for_cpu, default_legalize
from .softmax_tir import vexp


def _on_cpu_only(fast: Callable, dtypes: tuple[str, ...] | None = None) -> Callable:
    """``fast`` on CPUs (for inputs of ``dtypes`` only, if given), TVM's own lowering elsewhere."""
    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        if not compiling_for_cpu() or dtypes and str(call.args[0].ty.dtype) not in dtypes:
            return default_legalize(bb, call)
        return bb.call_te(fast, call.args[0], primfunc_name_hint=call.op.name.split(".")[-1])

    return legalize


def _gelu(x):
    return x * (0.5 + 0.5 * topi.fast_erf(x * (1 / math.sqrt(2))))


def _gelu_tanh(x):
    return x * (0.5 + 0.5 * topi.fast_tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)))


def _sigmoid_value(v: tirx.PrimExpr) -> tirx.PrimExpr:
    """float32 sigmoid(v) from e = exp(-|v|) <= 1 (``vexp``'s domain): 1 / (1 + e) for v >= 0, e / (1 + e) below;
    +-inf give 1 / 0, NaN stays NaN (it fails ``v >= 0`` and ``vexp`` propagates it)."""
    x, e = tirx.Var("x", "float32"), tirx.Var("e", "float32")
    one = tirx.const(1.0, "float32")
    body = tirx.Select(x >= tirx.const(0.0, "float32"), one, e) / (one + e)
    return tirx.Let(x, v, tirx.Let(e, vexp(-tirx.abs(x)), body))


def _sigmoid(x):
    return te.compute(x.shape, lambda *i: _sigmoid_value(x(*i)), name="sigmoid", tag="elemwise")


FAST_MATH: dict[str, Callable] = {
    "relax.erf": _on_cpu_only(topi.fast_erf),
    "relax.tanh": _on_cpu_only(topi.fast_tanh),
    "relax.nn.gelu": _on_cpu_only(_gelu),
    "relax.nn.gelu_tanh": _on_cpu_only(_gelu_tanh),
    "relax.sigmoid": _on_cpu_only(_sigmoid, ("float32",)),
}
