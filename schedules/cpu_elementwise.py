"""CPU elementwise / layout kernels (GELU-tanh chains, reshapes, transposes, splits, concatenations): parallel
vector loops.

Unscheduled, TVM runs them as one scalar thread; GPT-2's tanh-GELU alone took a tenth of the model.
Every block is inlined into the blocks that write the kernel's outputs (one, or one per Split output);
each of those gets its loops fused, split into vectors (the widest vector that divides the element count,
so there is no tail) and spread over the cores.

A concatenation selects per element (``if_then_else(4 <= j, b[j - 4], a[j])``). Inlined and left to LLVM, such
a select became masked gathers of both sides, and on znver4/5 (not x86-64-v4) a rotary embedding came out wrong
(ONNX test_rotary_embedding_3d_input). So the output loops the selects test are partitioned at their seams
(``_partition``; a Llama key's rotate_half inside its cache append has seams along two): each part reads one input,
its selects decided by the loops' ranges, and copies it as vectors.
A Llama-style decoding step's two KV-cache concatenations (8 x 2048 x 128 float32): 0.84 ms, 1.40 ms unscheduled
(``benchmarks/results/rerun/attention-kv-cache-step/``).
"""

from __future__ import annotations

import math

import tvm
import tvm_ffi
from tvm import ir, s_tir, tirx
from tvm.s_tir.dlight.analysis import get_root_block
from tvm.s_tir.dlight.analysis.common_analysis import get_sblockrealize
from tvm.s_tir.dlight.base import ScheduleRule
from tvm.sym import Analyzer
from tvm.target import Target

from .common import any_node, count_nodes, largest_divisor, substitute, vector_shape


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
        cores = int(target.attrs.get("num-cores", 1))
        for block in outputs:
            if not (_partition(sch, block, widest, vectorize, cores) if if_then_else_conditions(sch.get(block).body)
                    else parallel_vectors(sch, block, widest, vectorize)):
                return None
        return sch


def inline_to_outputs(func: tirx.PrimFunc) -> tuple[s_tir.Schedule, list] | None:
    """A schedule of an injective kernel with every block inlined into the blocks that write its outputs (one,
    or one per Split output), and those blocks; None for kernels this cannot take (see the module docstring)."""
    if _gathers(func):  # data-dependent addresses: left to the default lowering
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


def parallel_vectors(sch: s_tir.Schedule, block, widest: int, vectorize: bool) -> bool:
    """The block's elements in vectors spread over the cores; False if its extents are not static or it has no
    elements. Where the widest vector divides the last axis (unit axes aside), one loop over all elements split into
    such vectors; else a loop over rows (the axes before it) and each row in vectors of the widest width that divides
    it, or one by one. A vector that crossed rows (16 lanes over rows of 28) was read and written element by element (TVM's
    lowering does not simplify the flattened index it vectorises), each element's index divided by every extent."""
    loops = sch.get_loops(block)
    size = static_size(sch, block)
    if not loops or not size:
        return False
    axes = len(loops)
    while axes > 1 and int(sch.get(loops[axes - 1]).extent) == 1:  # trailing unit axes: the row is the axis before
        axes -= 1
    last = int(sch.get(loops[axes - 1]).extent)
    if last % widest == 0 or axes == 1:
        outer, inner = sch.split(sch.fuse(*loops), [None, largest_divisor(size, (widest, 8, 4, 2, 1))])
    else:
        outer = sch.fuse(*loops[: axes - 1])
        inner = sch.split(loops[axes - 1], [None, largest_divisor(last, (widest, 8, 4, 2, 1))])[1]
        if axes < len(loops):
            inner = sch.fuse(inner, *loops[axes:])
    if size >= PARALLEL_MIN:
        sch.parallel(outer)
    if vectorize:
        sch.vectorize(inner)
    return True


def _partition(sch: s_tir.Schedule, block, widest: int, vectorize: bool, cores: int) -> bool:
    """Split the output loops that the block's selects test at their seams (a rotary embedding's rotate_half along
    the head dim inside a KV cache's append along the sequence: two), each part of each a vector loop with its
    selects decided, the outermost parts or the loops above them spread over the cores; False where a select tests
    anything but loops against constants (padding on two axes of one, ``tril``), or an element count is not static."""
    size, analyzer = static_size(sch, block), Analyzer()
    for iv in sch.get(block).iter_vars:  # a reshape's index math (j % 56 // 7) simplifies within the domains
        analyzer.bind(iv.var, iv.dom)
    seams = cut_points([analyzer.simplify(c) for c in if_then_else_conditions(sch.get(block).body)])
    if not size or seams is None:
        return False
    subjects = [var for var, _ in seams]
    if any(a.same_as(b) for i, a in enumerate(subjects) for b in subjects[i + 1:]):
        return False  # (a variable and its remainder both tested: not a seam this can split)
    binding = _binding(sch, block)
    cut = []  # (loop, its seams)
    for (var, modulus), points in seams.items():
        loop = next((lp for lp in sch.get_loops(block) if sch.get(lp).loop_var.same_as(binding.get(var))), None)
        if loop is None:
            return False
        extent = int(sch.get(loop).extent)
        if modulus is not None and modulus < extent:  # a concatenation seen through a reshape: j % m
            if extent % modulus:
                return False
            loop, extent = sch.split(loop, [None, modulus])[1], modulus
        if inside := sorted(p for p in points if 0 < p < extent):
            cut.append((loop, inside))
    if not cut:  # the selects are constant over the loops
        return _decided(sch, block) and parallel_vectors(sch, block, widest, vectorize)
    position = lambda lp: next(i for i, x in enumerate(sch.get_loops(block)) if sch.get(x).same_as(sch.get(lp)))  # noqa: E731
    cut.sort(key=lambda c: position(c[0]))
    # The vectors are split off before partitioning: a part's loop starts at its seam, and TVM fuses and splits
    # only loops that start at 0.
    loops, (deepest, seams_in) = sch.get_loops(block), cut[-1]
    if below := loops[position(deepest) + 1:]:
        lanes = largest_divisor(math.prod(int(sch.get(lp).extent) for lp in below), (widest, 8, 4, 2, 1))
        vector = sch.split(sch.fuse(*below), [None, lanes])[1]
    else:  # the parts are runs of the innermost axis: vectors that divide every run
        lanes = largest_divisor(math.gcd(int(sch.get(deepest).extent), *seams_in), (widest, 8, 4, 2, 1))
        outer_lanes, vector = sch.split(deepest, [None, lanes])
        cut[-1] = (outer_lanes, [c // lanes for c in seams_in])
    if vectorize:
        sch.vectorize(vector)
    shared = sch.get_loops(block)[:position(cut[0][0])]
    if shared and math.prod(int(sch.get(lp).extent) for lp in shared) < 2 * cores and (below or len(cut) > 1):
        sch.reorder(cut[0][0], *shared)  # too few outer iterations to spread: the parts go outermost instead
        shared = []
    outer = sch.fuse(*shared) if len(shared) > 1 else (shared[0] if shared else None)
    spread = size >= PARALLEL_MIN
    depth = [position(lp) for lp, _ in cut]  # in the loop nest above the partitions

    def split(copy, level: int) -> bool:
        """Partition ``copy``'s loop of ``cut[level]`` (its loops start at the previous level's part), then each part's."""
        if level == len(cut):
            return _decided(sch, copy)
        loop = sch.get_loops(copy)[depth[level] - (depth[level - 1] if level else 0)]
        seams_at = cut[level][1]
        for part in sch.loop_partition(loop, [b - a for a, b in zip([0, *seams_at], seams_at)] + [None]):
            if level == 0 and outer is None and spread:
                sch.parallel(part)
            if not split(sch.get_child_blocks(part)[0], level + 1):
                return False
        return True

    if not split(block, 0):
        return False
    if outer is not None and spread:
        sch.parallel(outer)
    return True


def is_if_then_else(call) -> bool:
    """Whether ``call`` is a select (``if_then_else``)."""
    return isinstance(call.op, tvm.ir.Op) and call.op.name.endswith("if_then_else")


def if_then_else_conditions(stmt) -> list:
    """The conditions of the ``if_then_else`` calls under ``stmt``."""
    found = []
    tvm_ffi.structural_walk(stmt, [(tvm.ir.expr.Call, lambda c: is_if_then_else(c) and found.append(c.args[0]))])
    return found


# a comparison with a constant c on its right -> where it flips, as offsets from c (v < c flips at c, v <= c at c + 1)
_FLIP = {tirx.LT: (0,), tirx.GE: (0,), tirx.LE: (1,), tirx.GT: (1,), tirx.EQ: (0, 1), tirx.NE: (0, 1)}
_MIRROR = {tirx.LT: tirx.GT, tirx.LE: tirx.GE, tirx.GT: tirx.LT, tirx.GE: tirx.LE, tirx.EQ: tirx.EQ, tirx.NE: tirx.NE}


def cut_points(conditions: list) -> dict[tuple[tirx.Var, int | None], set[int]] | None:
    """{(v, m): points} where every condition is a conjunction of comparisons of block variables ``v`` (or ``v % m``,
    or ``v // d``: a concatenation seen through a reshape) with constants, whose truth changes only at ``points``
    (of ``v % m`` where m is given); empty if all are constant; None otherwise."""
    atoms, seams = [], {}
    while conditions:
        c = conditions.pop()
        if isinstance(c, tirx.And):
            conditions += [c.a, c.b]
        else:
            atoms.append(c)
    for atom in atoms:
        if isinstance(atom, tirx.IntImm):  # decided already
            continue
        kind, lhs, rhs = type(atom), atom.a, atom.b
        if kind not in _FLIP:
            return None
        if isinstance(lhs, tirx.IntImm):
            kind, lhs, rhs = _MIRROR[kind], rhs, lhs
        if not isinstance(rhs, tirx.IntImm):
            return None
        subject, modulus, scale = lhs, None, 1
        if isinstance(lhs, (tirx.FloorMod, tirx.FloorDiv)) and isinstance(lhs.b, tirx.IntImm) and lhs.b.value > 0:
            subject = lhs.a
            if isinstance(lhs, tirx.FloorMod):
                modulus = int(lhs.b.value)
            else:  # v // d flips where v does at d times the point
                scale = int(lhs.b.value)
        if not isinstance(subject, tirx.Var):
            return None
        key = next((k for k in seams if k[0].same_as(subject) and k[1] == modulus), (subject, modulus))
        seams.setdefault(key, set()).update((int(rhs.value) + offset) * scale for offset in _FLIP[kind])
    return seams


def _binding(sch: s_tir.Schedule, block) -> dict:
    """``block``'s variables -> their values in its loops' variables."""
    return dict(zip((iv.var for iv in sch.get(block).iter_vars), get_sblockrealize(sch, block).iter_values))


def selects(sch: s_tir.Schedule, block) -> list:
    """The conditions of ``block``'s selects in terms of its loops' variables."""
    binding = _binding(sch, block)
    return [substitute(c, binding) for c in if_then_else_conditions(sch.get(block).body)]


def _decided(sch: s_tir.Schedule, block) -> bool:
    """Whether every select of ``block`` is constant over the ranges of the loops around it (those outside the
    partitions' blocks too); the lowering then folds it away."""
    analyzer, sref = Analyzer(), sch.get_sref(block).parent
    while sref is not None:
        if isinstance(loop := sref.stmt, tirx.For):
            analyzer.bind(loop.loop_var, ir.Range.from_min_extent(loop.min, loop.extent))
        sref = sref.parent
    return all(isinstance(analyzer.simplify(c), tirx.IntImm) for c in selects(sch, block))


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
