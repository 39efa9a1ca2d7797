"""CPU legalisations of erf / tanh / GELU with vectorisable polynomial approximations (TOPI's fast_*),
and of small integer powers as products.

On LLVM CPUs ``erf`` and ``tanh`` lower to scalar libm calls, which no schedule can vectorise: BERT's
GELU epilogue alone cost more than its matmul. TOPI's ``fast_erf`` / ``fast_tanh`` are the rational
approximations Eigen uses (within a few ulp of fp32), as onnxruntime's CPU kernels also approximate.
Other targets keep TVM's own lowering (CUDA's erff/tanhf are fast already).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import tvm
from tvm import relax, topi

from .common import compiling_for_cpu, default_legalize


def _on_cpu_only(fast: Callable) -> Callable:
    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        if not compiling_for_cpu():
            return default_legalize(bb, call)
        return bb.call_te(fast, call.args[0], primfunc_name_hint=call.op.name.split(".")[-1])

    return legalize


def _gelu(x):
    return x * (0.5 + 0.5 * topi.fast_erf(x * (1 / math.sqrt(2))))


def _gelu_tanh(x):
    return x * (0.5 + 0.5 * topi.fast_tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)))


def _power(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """x ** 2 and x ** 3 (GPT-2's tanh-GELU) as multiplications: libm's powf is scalar."""
    exponent = call.args[1]
    value = exponent.value.numpy() if isinstance(exponent, tvm.ir.expr.Constant) else None
    if not compiling_for_cpu() or value is None or value.size != 1 or float(value) not in (2.0, 3.0):
        return default_legalize(bb, call)
    cube = float(value) == 3.0
    return bb.call_te(lambda x: x * x * x if cube else x * x, call.args[0], primfunc_name_hint="power")


FAST_MATH: dict[str, Callable] = {
    "relax.power": _power,
    "relax.erf": _on_cpu_only(topi.fast_erf),
    "relax.tanh": _on_cpu_only(topi.fast_tanh),
    "relax.nn.gelu": _on_cpu_only(_gelu),
    "relax.nn.gelu_tanh": _on_cpu_only(_gelu_tanh),
}
