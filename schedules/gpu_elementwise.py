"""CUDA elementwise / layout kernels (GELU chains, casts, residual adds, reshapes, transposes, splits): a vector
of up to ``LANES`` elements per thread, 32-bit index math.

DLight's ``Fallback`` gives each thread one scalar element and keeps Relax's int64 indices: GPT-2's batch-32
fp16 prefill spent ~6 ms of its 15.6 ms there on the H200, its tanh-GELU moving 0.6 TB/s against a 4.2 TB/s
copy (``benchmarks/results/profile-h200-b32.json``); with this rule the model took 13.7 ms. The kernel is
inlined into the blocks that write its outputs as on the CPU (``cpu_elementwise.inline_to_outputs``); each
output's innermost axis is split into vectors of ``LANES`` (fewer where the axis, or 16 bytes of the widest
type the kernel computes in, require: no tail) and the vectors spread over blocks of ``THREADS`` threads.
TVM's codegen makes a load a vector one where its index is provably a multiple of the lanes (the elementwise
chains, split columns, the head dimension of a transpose) and gathers it element by element where not.
Kernels over floating-point buffers only (see ``_float_buffer``). Each vector takes one side of a select (a
concatenation, padding) whole, an if / else of vector loads: a select that does not test the innermost axis (a KV
cache's append along the sequence) as it is; one that does (rotary embeddings' rotate_half, cat(-x2, x1) along the
head dim) where every point at which it flips is a multiple of the lanes, its test then rewritten to read the
vector's first element (``v // lanes * lanes`` for ``v``), which TVM's vectoriser sees as the same for all lanes
(with ``v`` it scalarises the whole kernel, although the simplifier finds the test lane-uniform afterwards). Where
a select may flip inside a vector (a conv's zero padding in its patches), each thread computes its vector's elements
(16 bytes of the output) one by one into registers and stores them as one vector, a row's vectors across threadIdx.x
and the rows across threadIdx.y and the grid (``_grid``): ResNet-50's patches took 0.5 TB/s an element a thread, 0.99
TB/s a flat index's vector a thread (every element dividing it by each axis's extent) and 2.19 on the grid (stage 1's
3x3, H100, copy 2.83: ``benchmarks/results/rerun/resnet-patches/``).
"""

from __future__ import annotations

import math

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis.common_analysis import get_sblockrealize
from tvm.s_tir.dlight.base import ScheduleRule
from tvm.target import Target

from .common import elem_bytes, largest_divisor, substitute, uses
from .cpu_elementwise import (cut_points, if_then_else_conditions, inline_to_outputs, is_if_then_else, selects,
                              static_size)

THREADS = 256
VECTOR_BYTES = 16
# Not 8 float16 lanes: TVM 0.27 gathers a strided float16x8 load (im2col, NCHW -> NHWC) with make_uint4 of
# eight halves, which does not compile
LANES = 4
# Lanes computed one by one and stored as one vector (no vector load to gather): 16 bytes of float16
SERIAL_LANES = 8
INT32_MAX = (1 << 31) - 1
GRID_YZ = 65535  # CUDA's most blocks along a grid's y or z
FLOATS = {"float16", "bfloat16", "float32"}
FLOAT_CODES = (tvm.DataTypeCode.FLOAT, tvm.DataTypeCode.BFLOAT)


class GpuElementwise(ScheduleRule):
    """Kernels made only of spatial (injective) blocks of static shape, on CUDA."""

    def apply(self, func: tirx.PrimFunc, target: Target, _: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or target.kind.name != "cuda" or not all(map(_float_buffer, func.params)):
            return None
        found = inline_to_outputs(tirx.transform.ForceNarrowIndexToInt32()(tvm.IRModule({"main": func}))["main"])
        if found is None:
            return None
        sch, outputs = found
        # a vector holds at most 16 bytes of the widest type the kernel computes in (TVM 0.27's CUDA codegen
        # writes a float32x8 constant as make_ulonglong4 of eight floats, which does not compile)
        widest = _widest_computed(func) // 8
        fits = tuple(v for v in (LANES, 2) if v * widest <= VECTOR_BYTES)
        lanes_of = {}  # output block -> lanes
        aligned = {}  # innermost variable of a block whose selects test it -> its vector's first element
        serial = set()  # blocks whose vectors are computed element by element into registers, then stored whole
        for block in outputs:
            if not static_size(sch, block):
                return None
            last = sch.get_loops(block)[-1]
            extent = int(sch.get(last).extent)
            if not any(uses(c, sch.get(last).loop_var) for c in selects(sch, block)):
                lanes_of[sch.get(block).name_hint] = largest_divisor(extent, fits) or 1
                continue
            var = _innermost_var(sch, block)
            seams = _innermost_seams(sch, block, var)
            lanes = seams is not None and largest_divisor(math.gcd(extent, *seams), fits)
            if not lanes:  # a select that may flip within a vector (a conv's padding): its lanes one by one, the
                # vector only stored (16 bytes of the output's type)
                width = elem_bytes(sch.get(block).writes[0].source)
                serial_fits = tuple(v for v in (SERIAL_LANES, 4, 2) if v * width <= VECTOR_BYTES)
                lanes_of[sch.get(block).name_hint] = largest_divisor(extent, serial_fits) or 1
                serial.add(sch.get(block).name_hint)
                continue
            lanes_of[sch.get(block).name_hint] = lanes
            step = tirx.const(lanes, var.ty.dtype)
            aligned[var] = tirx.floordiv(var, step) * step
        if aligned:
            sch = s_tir.Schedule(_tests_read(sch.mod["main"], aligned))
        for name, lanes in lanes_of.items():
            block = sch.get_sblock(name)
            *outer, last = sch.get_loops(block)
            # vectors along the innermost axis (fused into the others, the indices become div/mod expressions
            # in which TVM proves a vector's alignment less often)
            vectors, lane = sch.split(last, [None, lanes])
            if name in serial:
                tx = _grid(sch, outer, vectors) or _flat(sch, block, outer, vectors, lanes)
                stored = sch.cache_write(block, 0, "local")
                sch.reverse_compute_at(stored, tx)
                sch.unroll(lane)
                sch.vectorize(sch.get_loops(stored)[-1])
            else:
                _flat(sch, block, outer, vectors, lanes)
                sch.vectorize(lane)
        return sch


def _flat(sch: s_tir.Schedule, block, outer: list, vectors, lanes: int):
    """Every vector of ``block`` one thread's, in blocks of ``THREADS``: its loop (under ``vectors``) bound to
    threadIdx.x."""
    bx, tx = sch.split(sch.fuse(*outer, vectors), [None, min(THREADS, static_size(sch, block) // lanes)])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    return tx


def _grid(sch: s_tir.Schedule, outer: list, vectors):
    """Vectors of the innermost axis on threadIdx.x (and blockIdx.x past ``THREADS``), the next axis on threadIdx.y
    (as many of it as fill the block) and blockIdx.y, the others on blockIdx.z: a thread's position along the outer
    axes is then uniform over its block or nearly (a conv's patch row: its channel and window offsets), where the flat
    fused index made every element divide and take the remainder by each axis's extent (ResNet-50's patches: 0.99
    TB/s). The loop bound to threadIdx.x, or None where the grid's y / z would pass CUDA's 65535."""
    if not outer:
        return None
    nv, rows = int(sch.get(vectors).extent), int(sch.get(outer[-1]).extent)
    # whole blocks of vectors where a divisor of theirs fills at least half a block (no tail to guard)
    tx = nv if nv <= THREADS else next((t for t in range(THREADS, THREADS // 2, -1) if nv % t == 0), THREADS)
    ty = next(t for t in (64, 32, 16, 8, 4, 2, 1) if t * tx <= THREADS and rows % t == 0)
    rest = math.prod(int(sch.get(loop).extent) for loop in outer[:-1])
    if rows // ty > GRID_YZ or rest > GRID_YZ:
        return None
    bx, tx_loop = sch.split(vectors, [None, tx])
    by, ty_loop = sch.split(outer[-1], [None, ty])
    if outer[:-1]:
        sch.bind(sch.fuse(*outer[:-1]), "blockIdx.z")
    sch.reorder(by, bx, ty_loop, tx_loop)
    sch.bind(by, "blockIdx.y")
    sch.bind(bx, "blockIdx.x")
    sch.bind(ty_loop, "threadIdx.y")
    sch.bind(tx_loop, "threadIdx.x")
    return tx_loop


def _innermost_var(sch: s_tir.Schedule, block) -> tirx.Var | None:
    """The variable of ``block`` bound to its innermost loop alone, if one is."""
    last = sch.get(sch.get_loops(block)[-1]).loop_var
    return next((iv.var for iv, value in zip(sch.get(block).iter_vars, get_sblockrealize(sch, block).iter_values)
                 if value.same_as(last)), None)


def _innermost_seams(sch: s_tir.Schedule, block, var: tirx.Var | None) -> set[int] | None:
    """The points of the innermost axis (``block``'s variable ``var``, ``_innermost_var``) at which the block's selects
    flip (each a comparison of its variable with constants: ``cut_points``), or None where they test it otherwise."""
    cuts = cut_points(if_then_else_conditions(sch.get(block).body))
    if var is None or cuts is None or any(v.same_as(var) and m is not None for v, m in cuts):
        return None
    return set().union(*(points for (v, _), points in cuts.items() if v.same_as(var)))


def _tests_read(func: tirx.PrimFunc, vmap: dict) -> tirx.PrimFunc:
    """``func`` with its select tests reading each variable of ``vmap`` as its value there (an innermost variable
    ``v`` as ``v // lanes * lanes``: the same where the selects flip only at multiples of the lanes)."""

    def test(call: tirx.Call) -> tirx.Call:
        return tirx.if_then_else(substitute(call.args[0], vmap), *call.args[1:]) if is_if_then_else(call) else call

    return func.with_body(tvm_ffi.structural_map(func.body, [(tvm.ir.expr.Call, test)]))


def _widest_computed(func: tirx.PrimFunc) -> int:
    """Bits of the widest floating-point type an expression of ``func`` computes in (indices are int32 or
    int64 either way: a vector's lanes share their index math)."""
    widest = 8

    def visit(expr) -> None:
        nonlocal widest
        if isinstance(expr.ty, tvm.ir.PrimType) and tvm.DataType(expr.ty.dtype).type_code in FLOAT_CODES:
            widest = max(widest, tvm.DataType(expr.ty.dtype).bits)

    tvm_ffi.structural_walk(func.body, [(tvm.ir.expr.Expr, visit)], order="post")
    return widest


def _float_buffer(var) -> bool:
    """Whether a kernel argument is a floating-point buffer of static shape and fewer than 2^31 elements: the
    kernels this rule takes. Integer and boolean ones stay with DLight: TVM's int32 narrowing would narrow their
    data too, and its CUDA codegen loads a pair of booleans as a ushort2 (two bytes each)."""
    return str(var.dtype) in FLOATS and all(isinstance(d, tirx.IntImm) for d in var.shape) \
        and math.prod(int(d) for d in var.shape) <= INT32_MAX
