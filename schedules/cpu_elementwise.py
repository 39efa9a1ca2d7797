"""CPU elementwise / layout kernels (GELU-tanh chains, reshapes, transposes, splits): parallel vector loops.

Unscheduled, TVM runs them as one scalar thread; GPT-2's tanh-GELU alone took a tenth of the model.
Every block is inlined into the blocks that write the kernel's outputs (one, or one per Split output);
each of those gets its loops fused, split into vectors (the widest vector that divides the element count,
so there is no tail) and spread over the cores.
"""

from __future__ import annotations

import math

import tvm
from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import get_root_block
from tvm.s_tir.dlight.base import ScheduleRule
from tvm.target import Target

from .common import any_node, count_nodes, largest_divisor, vector_shape


PARALLEL_MIN = 1 << 14  # elements: below this, waking the other threads costs more than it saves
# Inlining a block read twice by its consumer doubles the expression: long chains of such blocks (integer
# Pow by repeated squaring has ~400) grow exponentially and exhaust memory in lowering. Real elementwise
# epilogues are far shorter than this.
MAX_BLOCKS = 32
# Likewise one big block read many times by the rest: inlining copies its expression into every read. The
# low-precision encoders of compiler/frontend/lowp.py read their input 60 times; a float8 decode of ~100
# nodes copied into each took 15 s to compile. (Measured: GPT-2's tanh-GELU copies 19 x 19 nodes, a float32
# -> float8 cast 60 x 9, a float8 -> float8 cast 60 x 97.)
MAX_COPIED = 2000  # expression nodes


class CpuElementwise(ScheduleRule):
    """Kernels made only of spatial (injective) blocks of static shape, on LLVM CPUs."""

    def apply(self, func: tirx.PrimFunc, target: Target, _: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or target.kind.name != "llvm":
            return None
        found = inline_to_outputs(func)
        if found is None:
            return None
        sch, outputs = found
        vectorize, widest = not calls(func, NO_VECTOR_LOWERING), vector_shape(target, "float32")[0]
        for block in outputs:
            if not _parallel_vectors(sch, block, widest, vectorize):
                return None
        return sch


def inline_to_outputs(func: tirx.PrimFunc) -> tuple[s_tir.Schedule, list] | None:
    """A schedule of an injective kernel with every block inlined into the blocks that write its outputs (one,
    or one per Split output), and those blocks; None for kernels this cannot take (see the module docstring)."""
    # Left to the default lowering: data-dependent addresses, and per-element selects (concatenation,
    # padding), which inlined into one block gave wrong results (ONNX test_rotary_embedding_3d_input).
    if _gathers(func) or calls(func, {"if_then_else"}):
        return None
    sch = s_tir.Schedule(func)
    blocks = sch.get_child_blocks(get_root_block(sch))
    if not blocks or len(blocks) > MAX_BLOCKS or any(iv.iter_type != tirx.IterVar.DataPar for b in blocks for iv in sch.get(b).iter_vars):
        return None
    params = list(func.params)  # the buffers of the kernel's arguments
    outputs = []  # the blocks that write an output (a Split writes several); the rest is inlined
    for block in blocks[:-1]:
        size = count_nodes(sch.get(block).body, tvm.ir.expr.Expr)
        if any(count_nodes(func.body, tvm.ir.expr.TensorLoad, lambda load: load.source.same_as(buf.source)) * size
               > MAX_COPIED for buf in sch.get(block).writes):  # each load of it becomes a copy, inlined
            return None
        try:
            sch.compute_inline(block)
        except s_tir.ScheduleError:
            if not any(sch.get(block).writes[0].source.same_as(out) for out in params):
                return None
            outputs.append(block)
    return sch, [*outputs, blocks[-1]]


def static_size(sch: s_tir.Schedule, block) -> int | None:
    """The number of elements ``block`` writes, if its loop extents are static."""
    extents = [sch.get(loop).extent for loop in sch.get_loops(block)]
    if not all(isinstance(e, tirx.IntImm) for e in extents):
        return None
    return math.prod(int(e) for e in extents)


def _parallel_vectors(sch: s_tir.Schedule, block, widest: int, vectorize: bool) -> bool:
    """One loop over the block's elements, split into vectors (the widest that divides the count, so no
    tail) spread over the cores; False if its extents are not static or it has no elements."""
    loops = sch.get_loops(block)
    size = static_size(sch, block)
    if not loops or not size:
        return False
    outer, inner = sch.split(sch.fuse(*loops), [None, largest_divisor(size, (widest, 8, 4, 2, 1))])
    if size >= PARALLEL_MIN:
        sch.parallel(outer)
    if vectorize:
        sch.vectorize(inner)
    return True


def _gathers(func: tirx.PrimFunc) -> bool:
    """Whether an address is read from memory (take, gather, scatter, unpooling): the rule assumes one output
    written element by element, which scatters are not (ONNX test_scatter_elements_*, test_maxunpool_* broke it)."""
    loaded = lambda index: any_node(index, tvm.ir.expr.TensorLoad, lambda _: True)  # noqa: E731
    data_dependent = lambda access: any(loaded(i) for i in access.indices)  # noqa: E731
    return any_node(func.body, tvm.ir.expr.TensorLoad, data_dependent) or any_node(func.body, tirx.BufferStore, data_dependent)


# Intrinsics that TVM 0.27's LLVM codegen lowers only as scalars (a vectorised cosh fails to build).
NO_VECTOR_LOWERING = {"cosh", "sinh"}


def calls(func: tirx.PrimFunc, ops: set[str]) -> bool:
    """Whether ``func`` calls one of ``ops`` (names without their namespace: "tirx.cosh", "prim.if_then_else")."""
    return any_node(func.body, tvm.ir.expr.Call, lambda c: isinstance(c.op, tvm.ir.Op) and c.op.name.split(".")[-1] in ops)
