"""SliceSources: a layout chain that several slices read is recomputed inside each slice, not written once.

PyTorch's packed attention projection (torchvision's ViT, any ``nn.MultiheadAttention``) exports as qkv ->
Reshape -> Unsqueeze -> Transpose -> Squeeze (a [3, seq, batch, embed] copy of the whole projection) -> three
Gathers (``TakeAsSlice``'s slices). FuseOps never duplicates a producer that has several consumers, so the copy is a
kernel of its own, and with the attention scale multiplied in float32 (``ToMixedPrecision`` casts the shared
tensor up once) it writes float32: ViT-B/16 at batch 32 in fp16 spent 344 us in it, 12 layers x 87 MB, beside 434 us
in the three slices that read it back (H100, ``benchmarks/results/rerun/zoo-h100-gemm-bands/kernels-7b461b8.json``).
Given each slice its own copy of the chain (reshapes, transposes, axis insertions, casts: index arithmetic and a
conversion per element), FuseOps fuses every chain into its slice's kernel, which reads its third of the projection
straight from the GEMM's output; the shared copy is dead code. ViT-B/16 on the CPU (batch 1, fp32): 1.04x and 1.03x in
two A/B runs (``benchmarks/results/rerun/slice-sources/``); not yet timed on a GPU.
"""

from __future__ import annotations

import tvm
from tvm import relax

from .util import private, users

# ops whose output element is one input element, moved or converted: cheap to recompute per consumer
_LAYOUT = ("relax.reshape", "relax.permute_dims", "relax.expand_dims", "relax.squeeze", "relax.astype")
_SLICE = "relax.strided_slice"


def _op(value) -> str | None:
    return value.op.name if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) else None


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    """Each slice of a ``shared`` chain end reads a copy of the chain of its own (emitted as bindings: ``rewrite_call``
    would merge the copies back into one, as equal bindings)."""

    def __init__(self, var2val: dict, uses, shared: set, mod: tvm.IRModule | None = None) -> None:
        super().__init__(mod)
        self.var2val, self.uses, self.shared = var2val, uses, shared

    def chain(self, var: relax.Expr) -> relax.Expr:
        """``var``'s layout ops anew, down to a tensor something else also reads (or a non-layout op's output)."""
        if var not in self.shared and not (_layout(var, self.var2val) and private(var, self.uses)):
            return self.visit_expr(var)
        value = self.var2val[var]
        return self.builder_.emit(relax.Call(value.op, [self.chain(value.args[0]), *value.args[1:]], value.attrs,
                                             value.ty_args))

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        if _op(call) == _SLICE and call.args[0] in self.shared:
            return relax.Call(call.op, [self.chain(call.args[0]), *call.args[1:]], call.attrs, call.ty_args)
        return super().visit_call_(call)


def _layout(var, var2val: dict) -> bool:
    return isinstance(var, relax.DataflowVar) and _op(var2val.get(var)) in _LAYOUT


@relax.transform.function_pass(opt_level=0, name="SliceSources")
class SliceSources:
    def transform_function(self, func: relax.Function, mod: tvm.IRModule, ctx) -> relax.Function:
        var2val, uses = relax.analysis.get_var2val(func), users(func)
        slicers: dict = {}  # a layout chain's end -> how many slices read it
        for block in func.body.blocks:
            for binding in block.bindings:
                if _op(binding.value) == _SLICE and _layout(binding.value.args[0], var2val):
                    slicers[binding.value.args[0]] = slicers.get(binding.value.args[0], 0) + 1
        shared = {var for var, n in slicers.items() if n > 1 and uses[var] == n}
        return _Rewriter(var2val, uses, shared, mod).visit_expr(func) if shared else func
