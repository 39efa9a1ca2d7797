"""TensorIR definitions of (log-)softmax over the last axis of a ``rows x cols`` tensor.

``canonical`` is what legalisation emits: the plain three-block softmax (row max, sum of exponentials,
normalise) with float32 accumulation. The other functions restate the same computation in the tiled
index space that a schedule needs, because TVM's ``transform_layout`` / ``transform_block_layout``
cannot pad a row to a tile multiple nor keep a thread's slice of the row compact:

- ``cuda_rows``: one row per group of ``lanes`` threads; each thread holds ``per_thread`` vectors of
  ``vec`` elements, element ``((j * lanes) + l) * vec + v`` of the row (coalesced, 128-bit when
  ``vec * itemsize == 16``), cached on chip and read from memory once.
- ``cuda_split``: the same tiling over ``chunks`` slices of a long row, in two kernels: per-chunk
  (max, sum of exp) partials, then a combine + normalise pass.
- ``cpu``: per row, ``lanes``-wide running max / sum vectors and a vectorisable ``exp``.

Numerics (ONNX Softmax / LogSoftmax, opset 13): ``y = exp(x - max) / sum(exp(x - max))`` and
``y = x - max - log(sum(exp(x - max)))`` over the row, computed in float32 for every input type.
``-inf`` entries give 0, a row holding NaN or ``+inf`` gives NaN, huge magnitudes stay finite.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

ACC = "float32"


def _normalized(kind: str, x, row_max, row_sum, exp=T.exp):
    """One output element (float32) from the float32 input value and the row's statistics."""
    if kind == "log_softmax":
        return x - row_max - T.log(row_sum)
    return exp(x - row_max) * (T.float32(1) / row_sum)


def canonical(rows: int, cols: int, dtype: str, kind: str):
    """The PrimFunc legalisation emits for ``kind`` ("softmax" / "log_softmax") of a [rows, cols] tensor."""

    @T.prim_func(s_tir=True)
    def func(x: T.Buffer((rows, cols), dtype), y: T.Buffer((rows, cols), dtype)):
        T.func_attr({"tirx.noalias": True})
        row_max = T.sblock_alloc_buffer((rows,), ACC)
        row_sum = T.sblock_alloc_buffer((rows,), ACC)
        for r, k in T.grid(rows, cols):
            with T.sblock("row_max"):
                vr, vk = T.axis.remap("SR", [r, k])
                with T.init():
                    row_max[vr] = T.min_value(ACC)
                row_max[vr] = T.max(row_max[vr], T.Cast(ACC, x[vr, vk]))
        for r, k in T.grid(rows, cols):
            with T.sblock("row_sum"):
                vr, vk = T.axis.remap("SR", [r, k])
                with T.init():
                    row_sum[vr] = T.float32(0)
                row_sum[vr] = row_sum[vr] + T.exp(T.Cast(ACC, x[vr, vk]) - row_max[vr])
        for r, k in T.grid(rows, cols):
            with T.sblock("normalize"):
                vr, vk = T.axis.remap("SS", [r, k])
                y[vr, vk] = T.Cast(dtype, _normalized(kind, T.Cast(ACC, x[vr, vk]), row_max[vr], row_sum[vr]))

    return func


def cuda_rows(rows: int, cols: int, dtype: str, kind: str, lanes: int, vec: int, per_thread: int, cache: str = ""):
    """Row-resident softmax: blocks load / row_max / row_sum / normalize / store over [r, j, l, v].

    ``cache`` is the dtype of the cached row (default: the input's).
    """
    nvec = cols // vec  # vectors per row; slots j * lanes + l >= nvec are padding
    J, L, V = per_thread, lanes, vec
    cache = cache or dtype

    @T.prim_func(s_tir=True)
    def func(x: T.Buffer((rows, cols), dtype), y: T.Buffer((rows, cols), dtype)):
        T.func_attr({"tirx.noalias": True})
        xc = T.sblock_alloc_buffer((rows, J, L, V), cache)
        row_max = T.sblock_alloc_buffer((rows,), ACC)
        ec = T.sblock_alloc_buffer((rows, J, L, V), ACC)  # exp(x - max), computed once per element
        row_sum = T.sblock_alloc_buffer((rows,), ACC)
        yc = T.sblock_alloc_buffer((rows, J, L, V), dtype)
        for r, j, l, v in T.grid(rows, J, L, V):
            with T.sblock("load"):
                vr, vj, vl, vv = T.axis.remap("SSSS", [r, j, l, v])
                xc[vr, vj, vl, vv] = T.if_then_else(
                    vj * L + vl < nvec, T.Cast(cache, x[vr, (vj * L + vl) * V + vv]), T.Cast(cache, T.float32("-inf"))
                )
        for r, j, l, v in T.grid(rows, J, L, V):
            with T.sblock("row_max"):
                vr, vj, vl, vv = T.axis.remap("SRRR", [r, j, l, v])
                with T.init():
                    row_max[vr] = T.min_value(ACC)
                row_max[vr] = T.max(row_max[vr], T.Cast(ACC, xc[vr, vj, vl, vv]))
        for r, j, l, v in T.grid(rows, J, L, V):
            with T.sblock("exp"):
                vr, vj, vl, vv = T.axis.remap("SSSS", [r, j, l, v])
                ec[vr, vj, vl, vv] = T.exp(T.Cast(ACC, xc[vr, vj, vl, vv]) - row_max[vr])
        for r, j, l, v in T.grid(rows, J, L, V):
            with T.sblock("row_sum"):
                vr, vj, vl, vv = T.axis.remap("SRRR", [r, j, l, v])
                with T.init():
                    row_sum[vr] = T.float32(0)
                row_sum[vr] = row_sum[vr] + ec[vr, vj, vl, vv]
        for r, j, l, v in T.grid(rows, J, L, V):
            with T.sblock("normalize"):
                vr, vj, vl, vv = T.axis.remap("SSSS", [r, j, l, v])
                if kind == "log_softmax":
                    yc[vr, vj, vl, vv] = T.Cast(dtype, T.Cast(ACC, xc[vr, vj, vl, vv]) - row_max[vr] - T.log(row_sum[vr]))
                else:
                    yc[vr, vj, vl, vv] = T.Cast(dtype, ec[vr, vj, vl, vv] * (T.float32(1) / row_sum[vr]))
        for r, j, l, v in T.grid(rows, J, L, V):
            with T.sblock("store"):
                vr, vj, vl, vv = T.axis.remap("SSSS", [r, j, l, v])
                if vj * L + vl < nvec:
                    y[vr, (vj * L + vl) * V + vv] = yc[vr, vj, vl, vv]

    return func


def cuda_split(rows: int, cols: int, dtype: str, kind: str, lanes: int, vec: int, per_thread: int, chunks: int):
    """Split-row softmax: kernel 1 writes per-chunk (max, sum exp(x - max)); kernel 2 combines them
    (``S = sum_q s_q * exp(m_q - M)``) and normalises its chunk. Chunk ``p`` holds row vectors
    ``(p * per_thread + j) * lanes + l``."""
    nvec = cols // vec
    J, L, V, P = per_thread, lanes, vec, chunks

    @T.prim_func(s_tir=True)
    def func(x: T.Buffer((rows, cols), dtype), y: T.Buffer((rows, cols), dtype)):
        T.func_attr({"tirx.noalias": True})
        xa = T.sblock_alloc_buffer((rows, P, J, L, V), dtype)
        part_max = T.sblock_alloc_buffer((rows, P), ACC)
        part_sum = T.sblock_alloc_buffer((rows, P), ACC)
        part = T.sblock_alloc_buffer((rows, P, 2), ACC)  # kernel 1 -> kernel 2: (max, sum) per chunk
        xb = T.sblock_alloc_buffer((rows, P, J, L, V), dtype)
        row_max = T.sblock_alloc_buffer((rows, P), ACC)
        row_sum = T.sblock_alloc_buffer((rows, P), ACC)
        yb = T.sblock_alloc_buffer((rows, P, J, L, V), dtype)
        for r, p, j, l, v in T.grid(rows, P, J, L, V):
            with T.sblock("load_1"):
                vr, vp, vj, vl, vv = T.axis.remap("SSSSS", [r, p, j, l, v])
                xa[vr, vp, vj, vl, vv] = T.if_then_else(
                    (vp * J + vj) * L + vl < nvec,
                    x[vr, ((vp * J + vj) * L + vl) * V + vv],
                    T.Cast(dtype, T.float32("-inf")),
                )
        for r, p, j, l, v in T.grid(rows, P, J, L, V):
            with T.sblock("part_max"):
                vr, vp, vj, vl, vv = T.axis.remap("SSRRR", [r, p, j, l, v])
                with T.init():
                    part_max[vr, vp] = T.min_value(ACC)
                part_max[vr, vp] = T.max(part_max[vr, vp], T.Cast(ACC, xa[vr, vp, vj, vl, vv]))
        for r, p, j, l, v in T.grid(rows, P, J, L, V):
            with T.sblock("part_sum"):
                vr, vp, vj, vl, vv = T.axis.remap("SSRRR", [r, p, j, l, v])
                with T.init():
                    part_sum[vr, vp] = T.float32(0)
                part_sum[vr, vp] = part_sum[vr, vp] + T.exp(T.Cast(ACC, xa[vr, vp, vj, vl, vv]) - part_max[vr, vp])
        for r, p, i in T.grid(rows, P, 2):
            with T.sblock("save"):
                vr, vp, vi = T.axis.remap("SSS", [r, p, i])
                part[vr, vp, vi] = T.Select(vi == 0, part_max[vr, vp], part_sum[vr, vp])
        # Kernel 2 walks the chunks in reverse, so it starts on those kernel 1 read last (still in L2).
        for r, p, j, l, v in T.grid(rows, P, J, L, V):
            with T.sblock("load_2"):
                vr, vp, vj, vl, vv = T.axis.remap("SSSSS", [r, p, j, l, v])
                xb[vr, vp, vj, vl, vv] = T.if_then_else(
                    ((P - 1 - vp) * J + vj) * L + vl < nvec,
                    x[rows - 1 - vr, (((P - 1 - vp) * J + vj) * L + vl) * V + vv],
                    T.Cast(dtype, T.float32("-inf")),
                )
        for r, p, q in T.grid(rows, P, P):
            with T.sblock("row_max"):
                vr, vp, vq = T.axis.remap("SSR", [r, p, q])
                with T.init():
                    row_max[vr, vp] = T.min_value(ACC)
                row_max[vr, vp] = T.max(row_max[vr, vp], part[rows - 1 - vr, vq, 0])
        for r, p, q in T.grid(rows, P, P):
            with T.sblock("row_sum"):
                vr, vp, vq = T.axis.remap("SSR", [r, p, q])
                with T.init():
                    row_sum[vr, vp] = T.float32(0)
                row_sum[vr, vp] = row_sum[vr, vp] + part[rows - 1 - vr, vq, 1] * T.exp(
                    part[rows - 1 - vr, vq, 0] - row_max[vr, vp]
                )
        for r, p, j, l, v in T.grid(rows, P, J, L, V):
            with T.sblock("normalize"):
                vr, vp, vj, vl, vv = T.axis.remap("SSSSS", [r, p, j, l, v])
                yb[vr, vp, vj, vl, vv] = T.Cast(
                    dtype, _normalized(kind, T.Cast(ACC, xb[vr, vp, vj, vl, vv]), row_max[vr, vp], row_sum[vr, vp])
                )
        for r, p, j, l, v in T.grid(rows, P, J, L, V):
            with T.sblock("store"):
                vr, vp, vj, vl, vv = T.axis.remap("SSSSS", [r, p, j, l, v])
                if ((P - 1 - vp) * J + vj) * L + vl < nvec:
                    y[rows - 1 - vr, (((P - 1 - vp) * J + vj) * L + vl) * V + vv] = yb[vr, vp, vj, vl, vv]

    return func


def vexp(value):
    """float32 ``exp`` from +, *, floor and bit shifts (the Cephes ``expf`` polynomial, ~1 ulp).

    Hand-written because LLVM scalarises ``llvm.exp`` on vectors into libm calls, and TVM's
    ``fast_exp`` clamps NaN away (a NaN row must stay NaN). Here ``exp(-inf) = 0``, ``exp(+inf) = inf``
    and NaN propagates; results below 2^-126 flush to 0.
    """
    f32 = lambda c: tirx.const(c, ACC)  # noqa: E731
    lo, hi = f32(-87.33654), f32(88.0)
    v, z, n, f = (tirx.Var(name, ACC) for name in "vznf")
    poly = f32(1.9875691500e-4)
    for c in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        poly = poly * f + f32(c)
    poly = poly * f * f + f + f32(1)
    # Select keeps NaN out of the float->int conversion (undefined for NaN); the NaN still flows via poly.
    two_n = tirx.reinterpret(ACC, tirx.shift_left(tirx.Cast("int32", tirx.Select(n > f32(-127), n, f32(-127))) + 127, 23))
    body = tirx.Select(v < lo, f32(0), tirx.Select(v > hi, f32(float("inf")), poly * two_n))
    body = tirx.Let(f, z - n * f32(0.693359375) + n * f32(2.12194440e-4), body)
    body = tirx.Let(n, tirx.floor(z * f32(1.4426950408889634) + f32(0.5)), body)
    # Clamp with Select, not max/min: LLVM's ordered compares keep a NaN operand here.
    body = tirx.Let(z, tirx.Select(v < lo, lo, tirx.Select(v > hi, hi, v)), body)
    return tirx.Let(v, value, body)


def cpu(rows: int, cols: int, dtype: str, kind: str, lanes: int):
    """Per-row blocks with ``lanes``-wide running max / sum (vectorised inner loops) and ``vexp``.

    The lane loops are written already vectorised: as reduction blocks they could not be (TVM's
    ``vectorize`` needs the reduction loop inside, ``rfactor`` does not compose with ``compute_at``).
    The ``cols % lanes`` tail folds into the first lanes.
    """
    full = cols // lanes * lanes
    tail = cols - full

    @T.prim_func(s_tir=True)
    def func(x: T.Buffer((rows, cols), dtype), y: T.Buffer((rows, cols), dtype)):
        T.func_attr({"tirx.noalias": True})
        row_max = T.sblock_alloc_buffer((rows,), ACC)
        row_sum = T.sblock_alloc_buffer((rows,), ACC)
        for r in range(rows):
            with T.sblock("row_max"):
                vr = T.axis.spatial(rows, r)
                acc = T.sblock_alloc_buffer((lanes,), ACC, scope="local")
                for l in T.vectorized(lanes):
                    acc[l] = T.min_value(ACC)
                for ko in range(full // lanes):
                    for l in T.vectorized(lanes):
                        acc[l] = T.max(acc[l], T.Cast(ACC, x[vr, ko * lanes + l]))
                for t in range(tail):
                    acc[t] = T.max(acc[t], T.Cast(ACC, x[vr, full + t]))
                for l in range(1, lanes):
                    acc[0] = T.max(acc[0], acc[l])
                row_max[vr] = acc[0]
        for r in range(rows):
            with T.sblock("row_sum"):
                vr = T.axis.spatial(rows, r)
                acc = T.sblock_alloc_buffer((lanes,), ACC, scope="local")
                for l in T.vectorized(lanes):
                    acc[l] = T.float32(0)
                for ko in range(full // lanes):
                    for l in T.vectorized(lanes):
                        acc[l] = acc[l] + vexp(T.Cast(ACC, x[vr, ko * lanes + l]) - row_max[vr])
                for t in range(tail):
                    acc[t] = acc[t] + vexp(T.Cast(ACC, x[vr, full + t]) - row_max[vr])
                for l in range(1, lanes):
                    acc[0] = acc[0] + acc[l]
                row_sum[vr] = acc[0]
        for r, k in T.grid(rows, cols):
            with T.sblock("normalize"):
                vr, vk = T.axis.remap("SS", [r, k])
                y[vr, vk] = T.Cast(dtype, _normalized(kind, T.Cast(ACC, x[vr, vk]), row_max[vr], row_sum[vr], vexp))

    return func

