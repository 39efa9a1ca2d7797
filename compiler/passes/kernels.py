"""Which Relax ops each kernel computes, and how many intermediate bytes its fusion keeps out of memory.

LegalizeOps lowers every Relax op to a PrimFunc, FuseOps groups PrimFunc calls into ``fused_*`` Relax
functions and FuseTIR merges each group into one PrimFunc: one kernel. The op names are gone by then, so
``KernelRecorder`` wraps every legalisation to remember which op made which PrimFunc, reads the groups
after FuseOps, and writes the result on the final PrimFuncs as attributes, which travel with the kernel
through scheduling and tuning:

- ``tvmpipe.ops``: the Relax ops the kernel computes, in order (``tir.NAME`` for a PrimFunc the frontend
  emitted directly, as it does for Clip);
- ``tvmpipe.saved_bytes``: the bytes unfused kernels would move through memory for the tensors produced
  and consumed inside this kernel: one write plus one read per consuming op (reshape-like ops are views,
  not round trips, and count nothing). An attention op counts the score and probability matrices
  (``batch x heads x seq_q x seq_k`` each) that the unfused softmax attention writes and reads back.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tvm
from tvm import relax, tirx

from .util import dtype, nbytes, static_shape, users

OPS_ATTR, SAVED_ATTR = "tvmpipe.ops", "tvmpipe.saved_bytes"
_ATTENTION = ("relax.nn.attention", "relax.nn.attention_bias")
# Unfused, these are views of their input (RewriteDataflowReshape): no memory round trip to save.
_VIEWS = ("relax.reshape", "relax.squeeze", "relax.expand_dims", "relax.flatten")


def _internal_bytes(call: relax.Call) -> int:
    """Intermediate traffic a composite op does away with (see the module docstring)."""
    if call.op.name not in _ATTENTION:
        return 0
    q, k = static_shape(call.args[0]), static_shape(call.args[1])
    if q is None or k is None:  # symbolic shapes: nothing to count
        return 0
    (b, sq, h, _), (_, sk, _, _) = q, k
    return 2 * 2 * b * h * sq * sk * np.dtype(dtype(call.args[0])).itemsize


def _call_tir_target(binding: relax.Binding) -> str | None:
    value = binding.value
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name == "relax.call_tir":
        return value.args[0].name_hint
    return None


class KernelRecorder:
    """Records op provenance through one ``passes.optimize`` run (see the module docstring)."""

    def __init__(self, custom: dict[str, Callable]):
        self.custom = custom
        self.origin: dict[str, tuple[str, int]] = {}  # PrimFunc name -> (Relax op, its internal bytes)
        self.groups: dict[str, tuple[list[str], int]] = {}  # fused function -> (ops, saved bytes)

    def _wrap(self, name: str, legalize: Callable) -> Callable:
        def recorded(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
            before = {gv.name_hint for gv in bb.get().get_global_vars()}
            out = legalize(bb, call)
            for gv in bb.get().get_global_vars():
                if gv.name_hint not in before:
                    self.origin[gv.name_hint] = (name, _internal_bytes(call))
            return out

        return recorded

    def legalize(self, mod: tvm.IRModule) -> tvm.IRModule:
        """LegalizeOps with our custom legalisations, every one recorded (all ops: a legalisation may emit
        other Relax ops, e.g. clip -> minimum/maximum, which LegalizeOps then lowers in turn)."""
        for gv, func in mod.functions.items():  # TIR the frontend emitted itself (e.g. Clip as max/min)
            if isinstance(func, tirx.PrimFunc):
                self.origin[gv.name_hint] = (f"tir.{gv.name_hint}", 0)
        cmap = {}
        for name in tvm.ir.Op.list_op_names():
            legalize = self.custom.get(name) or tvm.ir.Op.get(name).get_attr("FLegalize")
            if name.startswith("relax.") and legalize is not None:
                cmap[name] = self._wrap(name, legalize)
        return relax.transform.LegalizeOps(customize_legalize_map=cmap)(mod)

    def record_groups(self, mod: tvm.IRModule) -> tvm.IRModule:
        """After FuseOps: each ``fused_*`` function's ops and the bytes of its internal tensors."""
        for gv, func in mod.functions.items():
            if not isinstance(func, relax.Function) or not func.attrs or not func.attrs.get("Primitive", False):
                continue
            uses, outputs = users(func), set(relax.analysis.used_vars(func.body.body))
            ops, saved = [], 0
            for block in func.body.blocks:
                for binding in block.bindings:
                    op, internal = self.origin.get(_call_tir_target(binding) or "", ("", 0))
                    ops += [op] if op else []
                    saved += internal
                    if binding.var not in outputs and op not in _VIEWS:
                        saved += nbytes(binding.var) * (1 + uses[binding.var])
            self.groups[gv.name_hint] = (ops, saved)
        return mod

    def tag(self, mod: tvm.IRModule) -> tvm.IRModule:
        """Write ``tvmpipe.ops`` / ``tvmpipe.saved_bytes`` on every kernel."""
        for gv, func in list(mod.functions.items()):
            if not isinstance(func, tirx.PrimFunc):
                continue
            op, internal = self.origin.get(gv.name_hint, ("", 0))
            ops, saved = self.groups.get(gv.name_hint, ([op] if op else [], internal))
            mod[gv] = func.with_attr(OPS_ATTR, ops).with_attr(SAVED_ATTR, saved)
        return mod
