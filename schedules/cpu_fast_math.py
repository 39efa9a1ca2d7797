"""CPU legalisations of erf / tanh / GELU with vectorisable polynomial approximations (TOPI's fast_*).
(Small integer powers become products earlier, for every target: ``passes.small_powers``.)

On LLVM CPUs ``erf`` and ``tanh`` lower to scalar libm calls, which no schedule can vectorise: BERT's
GELU epilogue alone cost more than its matmul. TOPI's ``fast_erf`` / ``fast_tanh`` are the rational
approximations Eigen uses (within a few ulp of fp32), as onnxruntime's CPU kernels also approximate.
Other targets keep TVM's own lowering (CUDA's erff/tanhf are fast already).
"""

from __future__ import annotations

import math
from collections.abc import Callable

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


FAST_MATH: dict[str, Callable] = {
    "relax.erf": _on_cpu_only(topi.fast_erf),
    "relax.tanh": _on_cpu_only(topi.fast_tanh),
    "relax.nn.gelu": _on_cpu_only(_gelu),
    "relax.nn.gelu_tanh": _on_cpu_only(_gelu_tanh),
}
