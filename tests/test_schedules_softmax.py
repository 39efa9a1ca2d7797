"""Softmax / LogSoftmax: legalisation, the rule, CPU numerics vs float64, CUDA kernels' structure and definitions.

The numerics contract (``reference``, ``sample`` with special values, ``mismatches``) is shared with the GPU
check in ``benchmarks/softmax.py``, which runs the same cases on the H200.
"""

import dataclasses
import inspect
import json
import re
import zipfile

import numpy as np
import pytest
import tvm
import tvm_ffi
from onnx import TensorProto as TP
from onnx import helper
from tvm.script import tirx as T

from benchmarks.softmax import (CHECK_COLS, CHECK_ROWS, PLAN_SHAPES, compile_cases, cpu_kernel, mismatches, reference,
                                sample)
import cuda_emu
from compiler import targets
from helpers import compile_and_compare, make_model, rel_err, run_cli, save
from schedules import softmax as S
from schedules import softmax_tir
from schedules.common import LOG2E, ex2

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90", "max_threads_per_block": 1024, "thread_warp_size": 32,
                          "max_shared_memory_per_block": 49152})


def _cases(rows: int, names=("tvmpipe",)) -> list[dict]:
    cases = [{"impl": impl, "kind": k, "dtype": d, "rows": rows, "cols": c}
             for impl in names for k in S.KINDS for d in S.DTYPES for c in CHECK_COLS]
    for c in cases:
        c["name"] = f"{c['impl']}_{c['kind']}_{c['dtype']}_{c['cols']}"
    return cases


def test_cpu_numerics_odd_sizes_and_special_values(rng):
    """The pipeline's CPU kernels for every odd row length, dtype and kind, on rows holding -inf, +inf,
    NaN, +-3e38 and equal values, against float64."""
    cases = _cases(rows=9)
    exe, _ = compile_cases(cases, "cpu")
    assert {c["schedule"] for c in cases} == {"hand:Softmax"}
    for case in cases:
        x = sample(9, case["cols"], case["dtype"], rng)
        y = tvm.runtime.tensor(np.full_like(x, np.nan))
        exe[case["name"]](tvm.runtime.tensor(x), y)
        bad, err = mismatches(y.numpy(), x, case["kind"])
        assert bad == 0, f"{case['name']}: {bad} elements off (max err {err:.2e})"


@pytest.mark.parametrize("lanes, cols", [(8, 9), (8, 15), (8, 60), (16, 17), (16, 31), (32, 33)])
def test_cpu_kernel_tail_step(rng, lanes, cols):
    """The CPU kernel at a given vector step: a row of one step and a tail, or several and a tail (the overlapping last
    step, whose lanes before the tail the sum must not count twice nor the scaling apply twice), every dtype and kind,
    on the special rows, against float64."""
    target = targets.resolve("cpu").target
    for dtype in S.DTYPES:
        for kind in S.KINDS:
            kernel = cpu_kernel(softmax_tir.cpu(9, cols, dtype, kind, lanes, True, dtype != "float32"), kind, target)
            x = sample(9, cols, dtype, rng)
            y = tvm.runtime.tensor(np.full_like(x, np.nan))
            kernel(tvm.runtime.tensor(x), y)
            bad, err = mismatches(y.numpy(), x, kind)
            assert bad == 0, f"{dtype} {kind}: {bad} elements off (max err {err:.2e})"


def test_cpu_prefetch_by_cpu():
    """The exp pass prefetches the next row up to 256 KB rows on AMD Zen, 8 KB elsewhere (measured on an Intel Xeon);
    never for a single row."""
    zen, xeon, generic = (tvm.target.Target({"kind": "llvm", "mcpu": m}) for m in ("znver5", "emeraldrapids", "x86-64"))
    assert S.cpu_prefetch(64, 50257, "float32", zen) and not S.cpu_prefetch(64, 50257, "float32", xeon)
    assert not S.cpu_prefetch(8, 262144, "float32", zen)  # (1 MB)
    assert S.cpu_prefetch(512, 2048, "float32", xeon) and not S.cpu_prefetch(256, 4096, "float32", xeon)
    assert S.cpu_prefetch(256, 4096, "float16", generic)  # (8 KB of float16)
    assert not S.cpu_prefetch(1, 1024, "float32", zen)


def test_special_value_semantics():
    """What the contract means, on a handful of rows (the reference is numpy's own arithmetic)."""
    x = np.array([[1e30, 3e38, -3e38], [-np.inf, 0, 0], [np.inf, 0, 0], [np.nan, 0, 0], [-np.inf] * 3, [7, 7, 7]])
    y = reference(x, "softmax")
    np.testing.assert_array_equal(y[0], [0, 1, 0])
    np.testing.assert_array_equal(y[1], [0, 0.5, 0.5])
    assert np.isnan(y[2:5]).all()
    np.testing.assert_allclose(y[5], 1 / 3)


def _plans(cols: int, dtype: str) -> set:
    return {S.cuda_plan(rows, cols, dtype, "sm_90") for rows in CHECK_ROWS}


def _ex2_as_exp2(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """``func`` with the CUDA-only ``ex2`` (inline PTX) replaced by TIR's exp2, so that it builds for the CPU."""

    def rewrite(call, mutator):
        call = mutator.default_mutate(call)
        if call.op.name == "tirx.cuda.func_call" and call.args[0].value == "tvmpipe_ex2":
            return tvm.tirx.op.exp2(call.args[1])
        return call

    return tvm_ffi.structural_mutate(func, [(tvm.ir.expr.Call, rewrite)])


def test_cuda_warp_definition_on_cpu(rng):
    """The warp kernel's tiled definition (padding, the reductions), unscheduled, on the CPU, for every plan of
    the GPU check's shapes that takes it (the block kernel's plans are emulated below)."""
    funcs, runs = {}, []
    for dtype in S.DTYPES:
        for cols in (*CHECK_COLS, *(c for _, c in PLAN_SHAPES)):
            definitions = [p for p in _plans(cols, dtype) if p.cache == "local" and p.lanes <= 32]
            for i, plan in enumerate(sorted(definitions, key=repr)):
                for kind in S.KINDS:
                    name = f"{kind}_{dtype}_{cols}_{i}"
                    func = softmax_tir.cuda_rows(7, cols, dtype, kind, plan.lanes, plan.vec, plan.per_thread)
                    funcs[name] = _ex2_as_exp2(func).with_attr("global_symbol", name)
                    runs.append((name, cols, dtype, kind))
    assert {c for _, c, _, _ in runs} >= {1, 3, 31, 1023}
    exe = tvm.compile(tvm.IRModule(funcs), "llvm")
    for name, cols, dtype, kind in runs:
        x = sample(7, cols, dtype, rng)
        y = tvm.runtime.tensor(np.full_like(x, np.nan))
        exe[name](tvm.runtime.tensor(x), y)
        assert mismatches(y.numpy(), x, kind)[0] == 0, name


# The block kernel, emulated (rows, cols, dtype, lanes, per_thread, cached, chunks):
# - streaming, several steps per row: rows starting mid-vector, a tensor ending mid-vector (5 x 1023), blocks of
#   one and of several warps; none, some or all of a row's steps (and more than it has) kept in shared memory;
#   a last step whose later vector groups lie wholly past the row (2560 = 320 vectors: 256 + 64);
# - resident (one step): a row within one step, exactly one step, ending mid-vector, groups wholly past it (300),
#   and (8 and 7 rows) the rows of -inf and of NaN, which its per-thread exp factor must keep NaN;
# - split into chunks (the emulator runs blocks one after another, last first: a row's first block takes the partials
#   published by the others, which, finding some missing, read the whole row themselves): a last chunk wholly past the row
#   (4096 in 5), more chunks than threads (40 > 32, taken in two turns), more than a warp takes (40 > 32: two warps
#   merge theirs), rows ending mid-vector, the rows of -inf
#   and NaN (7 rows), chunks of several steps some of them cached in shared memory;
# - bfloat16 resident, streamed and split;
# on rows holding the special values.
STREAM_CASES = [(4, 1025, "float32", 64, 2, 0, 1), (4, 1025, "float32", 64, 2, 1, 1), (5, 1023, "float16", 32, 1, 2, 1),
                (12, 50, "float32", 32, 4, 5, 1), (3, 4096, "float16", 96, 2, 0, 1), (3, 3000, "float32", 64, 1, 3, 1),
                (3, 2560, "float16", 64, 4, 1, 1),
                (8, 300, "float32", 64, 4, 0, 1), (3, 4096, "float16", 128, 4, 0, 1), (4, 1025, "float32", 96, 4, 0, 1),
                (3, 4096, "float16", 32, 2, 0, 5), (2, 3000, "float32", 32, 1, 0, 40), (7, 1025, "float16", 64, 2, 0, 3),
                (3, 4096, "float16", 32, 1, 2, 4), (5, 1023, "float32", 32, 2, 1, 3), (2, 9000, "float16", 64, 1, 0, 40),
                (7, 1025, "bfloat16", 96, 4, 0, 1), (3, 3000, "bfloat16", 64, 1, 2, 1), (3, 4096, "bfloat16", 32, 2, 0, 5)]


@pytest.mark.parametrize("rows, cols, dtype, lanes, per_thread, cached, chunks", STREAM_CASES)
@pytest.mark.parametrize("kind", S.KINDS)
def test_cuda_stream_kernel_emulated(rng, rows, cols, dtype, lanes, per_thread, cached, chunks, kind):
    vec = 16 // np.dtype(dtype).itemsize
    plan = S.CudaPlan(lanes, vec, per_thread, cache="l2", cached=cached, chunks=chunks)
    func = S.schedule_cuda(rows, cols, dtype, kind, plan).mod["main"]
    x = sample(rows, cols, dtype, rng)
    arrays = {"xf": x, "yf": np.full_like(x, np.nan)}  # the kernel's flat views of x and y
    cuda_emu.run(func, targets.resolve("cuda-sm90").target, arrays)
    bad, err = mismatches(arrays["yf"], x, kind)
    assert bad == 0, f"{bad} elements off (max err {err:.2e})"


@pytest.mark.parametrize("kind", S.KINDS)
def test_cuda_stream_cluster_emulated(rng, kind):
    """A split whose row's blocks form one thread-block cluster (``CudaPlan.cluster``): launched over rows x chunks
    blocks in clusters of ``chunks`` (blockIdx.x still counts blocks, so a row's blocks stay b // chunks), with the
    same results as the split (emulated: the blocks one after another, each finding its row's partials missing but the
    first; the exchange itself is in the split cases above); the CUDA otherwise the split's."""
    rows, cols, dtype = 5, 1023, "float32"
    plan = S.CudaPlan(32, 4, 2, cache="l2", cached=1, chunks=3, cluster=True)
    func = S.schedule_cuda(rows, cols, dtype, kind, plan).mod["main"]
    target = targets.resolve("cuda-sm90").target
    grid, _, _, cluster = cuda_emu.launch_config(cuda_emu.host_script(func, target), "emu_kernel")
    assert (grid, cluster) == ((rows * 3, 1, 1), 3)
    split = S.schedule_cuda(rows, cols, dtype, kind, dataclasses.replace(plan, cluster=False)).mod["main"]
    helper = re.compile(r"__forceinline__ __device__ unsigned int tvm_builtin_cluster_ctaid_x\(\) \{.*?\n\}\n", re.S)
    src = cuda_emu.cuda_source(func, target, "k")
    assert helper.search(src) and helper.sub("", src) == cuda_emu.cuda_source(split, target, "k")  # (the rank unread)
    x = sample(rows, cols, dtype, rng)
    arrays = {"xf": x, "yf": np.full_like(x, np.nan)}
    cuda_emu.run(func, target, arrays)
    bad, err = mismatches(arrays["yf"], x, kind)
    assert bad == 0, f"{bad} elements off (max err {err:.2e})"


@pytest.mark.parametrize("rows, cols, dtype, chunks, grid", [(5, 1001, "float32", 2, 4), (4, 1025, "float16", 2, 4),
                                                          (5, 501, "float32", 1, 2)])
@pytest.mark.parametrize("kind", S.KINDS)
def test_cuda_stream_ring_emulated(rng, rows, cols, dtype, chunks, grid, kind):
    """A split over ``grid`` blocks that take their chunks in turn (``CudaPlan.grid``), pass 2 of each requesting the
    block's next chunk into the shared memory it has just written out: launched over ``grid`` blocks, and each
    turn's chunk the right one, where the turns do not divide the chunks (10 on 4 blocks; emulated: blocks one after
    another, so each finds its partner's partial missing and reads the row itself for the (max, sum), but pass 2
    writes what the turn before requested); rows ending mid-vector; and whole rows in turn (5 on 2 blocks)."""
    vec = 16 // np.dtype(dtype).itemsize
    plan = S.CudaPlan(32, vec, 2, cache="l2", cached=1, chunks=chunks, kept_exp=False, grid=grid)
    func = S.schedule_cuda(rows, cols, dtype, kind, plan).mod["main"]
    target = targets.resolve("cuda-sm90").target
    assert cuda_emu.launch_config(cuda_emu.host_script(func, target), "emu_kernel")[0] == (grid, 1, 1)
    x = sample(rows, cols, dtype, rng)
    arrays = {"xf": x, "yf": np.full_like(x, np.nan)}
    cuda_emu.run(func, target, arrays)
    bad, err = mismatches(arrays["yf"], x, kind)
    assert bad == 0, f"{bad} elements off (max err {err:.2e})"


def test_kernel_macros_expand_without_stack_inspection(monkeypatch):
    """TVMScript finds the parser expanding a macro by walking frames (``schedules._find_parser_def``), not with
    ``inspect.getouterframes``, which builds every frame's source context for each of a kernel's dozens of macro
    calls: here only the decorator's own ``inspect.stack`` calls may (twice; 16 times unpatched)."""
    calls = []
    getouterframes = inspect.getouterframes
    monkeypatch.setattr(inspect, "getouterframes", lambda *a, **k: calls.append(1) or getouterframes(*a, **k))
    func = softmax_tir.cuda_stream(3, 2560, "float16", "softmax", 32, 8, 1, cached=1)
    assert "tvmpipe_copy16" in func.script() and len(calls) <= 2, len(calls)


def test_cuda_stream_plan_choice():
    """Rows breaking 16-byte alignment, too long for one block's registers or needing a block of more than 512
    threads stream, in 16-byte vectors: two blocks per SM, each caching up to 110 KB of its row; where there are
    no more rows than SMs, or where only that holds the row on chip (201 KB), one block per SM with up to 1024
    threads and twice the cache. Rows of one step stay in registers; few long rows split into chunks; on sm_90, rows
    too long for any block's chip, and split rows whose one wave of chunks is not held on chip, split into on-chip
    chunks over a ring of blocks taking them in the fewest turns; and where the plan is one wave of 1024-thread
    blocks, into chunks half as long over a ring of 512-thread blocks, two on some SMs, none loaded more."""
    for rows, cols, dtype, lanes in ((4096, 50257, "float32", 1024), (4096, 50257, "float16", 512),
                                     (133, 16385, "float32", 512), (100, 30000, "float32", 1024),
                                     (1024, 32768, "float16", 512), (1024, 32768, "float32", 512),
                                     (132, 16385, "float32", 1024)):
        plan = S.cuda_plan(rows, cols, dtype, "sm_90")
        assert (plan.cache, plan.vec * np.dtype(dtype).itemsize, plan.chunks, plan.lanes) == ("l2", 16, 1, lanes), \
            (rows, cols, dtype, plan)
        shared = plan.cached * plan.lanes * plan.per_thread * 16
        assert 0 < shared <= (220 << 10 if lanes == 1024 else 110 << 10), plan
    for rows, cols, dtype in ((4096, 4096, "float32"), (1024, 16384, "float16"), (7, 1025, "float32")):
        plan = S.cuda_plan(rows, cols, dtype, "sm_90")
        assert plan.cache == "local" and plan.lanes > 32 and plan.chunks == 1, (rows, cols, dtype, plan)
        assert plan.lanes * plan.per_thread >= softmax_tir.stream_vectors(cols, plan.vec), plan  # one step
    for rows, cols, dtype in ((33, 131072, "float16"), (65, 131072, "float16"), (1, 1 << 20, "float32"),
                              (8, 128256, "float32")):
        plan = S.cuda_plan(rows, cols, dtype, "sm_90")  # as many blocks as SMs (all resident), 16-byte vectors
        assert 132 - rows < plan.chunks * rows <= 132 and plan.vec * np.dtype(dtype).itemsize == 16, (rows, cols, plan)
    # on sm_90, rows no block holds on chip (float32 over 290 KB) and split rows whose one wave of chunks would not
    # stay on chip: the ring, 1024-thread blocks each holding a chunk (its cached steps and the last in registers),
    # at most as many blocks as the SMs hold, a multiple of the chunks, in the fewest turns; in place of one wave of
    # 1024-thread blocks (16 x 1M, 128 x 131072 float16, 128 x 65536 float32), 512-thread blocks, two per SM, over
    # chunks half as long; not before sm_90, nor where a row needs more chunks than the SMs hold blocks (one 64 MB row)
    f32, f16 = "float32", "float16"
    for rows, cols, dtype, chunks, grid in ((128, 131072, f32, 2, 128), (257, 131073, f32, 3, 129),
                                            (66, 262144, f32, 4, 132), (4096, 80000, f32, 2, 132),
                                            (128, 524288, f32, 8, 128), (16, 1 << 20, f32, 32, 256),
                                            (16, 1 << 20, f16, 16, 256), (128, 131072, f16, 2, 256),
                                            (128, 65536, f32, 2, 256), (64, 1 << 20, f32, 32, 256),
                                            (100, 40001, f32, 2, 200)):
        plan = S.cuda_plan(rows, cols, dtype, "sm_90")
        lanes, slots = (512, 264) if grid > 132 else (1024, 132)  # (more blocks than SMs: the 512-thread ring)
        assert (plan.chunks, plan.grid, plan.lanes, plan.cluster) == (chunks, grid, lanes, False), (rows, cols, plan)
        step = plan.lanes * plan.per_thread
        assert plan.cached * step * 16 <= (220 << 10) * lanes // 1024, plan
        steps = -(-(-(-softmax_tir.stream_vectors(cols, plan.vec) // chunks)) // step)
        assert steps == plan.cached + 1, plan
        turns = -(-rows * chunks // grid)  # the fewest turns, and the fewest blocks that take them
        assert turns == -(-rows * chunks // (slots // chunks * chunks)) and turns * (grid - chunks) < rows * chunks, plan
        assert not S.cuda_plan(rows, cols, dtype, "sm_80").grid
    assert not S.cuda_plan(1, 1 << 24, "float32", "sm_90").grid
    # nor where the 512-thread ring would put more of the rows on an SM than one wave of 1024-thread blocks does:
    # 5 rows of 1M split in 26 chunks of 157 KB, one per SM (the ring: 32 chunks of 128 KB, two per SM on 28 SMs)
    plan = S.cuda_plan(5, 1 << 20, "float32", "sm_90")
    assert (plan.chunks, plan.lanes, plan.grid) == (26, 1024, 0), plan
    # a few rows of a vocabulary: 16 KB chunks, fewer than the SMs; rows of up to 64 KB are not split
    for rows, cols, dtype, chunks in ((1, 50257, "float32", 13), (5, 50257, "float16", 7), (1, 128256, "float16", 16),
                                      (1, 16384, "float32", 1), (1, 32768, "float16", 1), (1, 16385, "float32", 5)):
        plan = S.cuda_plan(rows, cols, dtype, "sm_90")
        assert plan.chunks == chunks and plan.lanes * plan.per_thread * plan.vec * plan.chunks >= cols, (rows, cols, plan)


@pytest.mark.parametrize(
    "rows, cols, dtype, regime",
    [(4096, 1024, "float32", "warp"), (65536, 128, "float16", "warp"), (4096, 1024, "bfloat16", "warp"),
     (4096, 4096, "float32", "block"), (512, 4096, "bfloat16", "block"),
     (1024, 16384, "float16", "block"), (100, 50000, "float16", "block"), (1024, 32768, "float16", "block"),
     (16, 1 << 20, "float32", "split"), (64, 131072, "float16", "split"), (16, 1 << 20, "float16", "split"),
     (128, 131072, "float16", "split")],
)
def test_cuda_source_structure(rows, cols, dtype, regime):
    """Compile for sm_90 and read the CUDA source: one kernel, 128-bit accesses, shuffles, the bare ex2 for every
    exponential, no division per element, the warp kernel's one read of the input; the block kernel's pass 1 without
    a block barrier, the exponentials of a streamed 2-byte row in one wave of blocks kept in shared memory."""
    plan = S.cuda_plan(rows, cols, dtype, "sm_90")
    assert (plan.chunks > 1, plan.lanes <= 32) == (regime == "split", regime == "warp")
    src = tvm.compile(S.schedule_cuda(rows, cols, dtype, "softmax", plan).mod, CUDA).mod.imports[0].inspect_source()
    kernels = src.count("__global__") // 2  # declaration + definition
    assert kernels == 1  # (the split too: its blocks exchange partials)
    assert ("_publish(" in src and "_take(" in src) == (regime == "split")
    assert ("__shfl_down_sync" if regime == "warp" else "__shfl_xor_sync") in src
    assert "tvmpipe_ex2(" in src and "exp2f(" not in src and "expf(" not in src
    if regime != "warp":  # (the warp kernel's per-element 1 / sum reads a register: nvcc computes it once)
        assert src.count("/*1.000000e+00*/ /") == 1  # 1 / sum once per thread, not per element
        body = src[src.rindex("__global__"):]
        # the first barrier is the block reduction's (TVM put one before the exponentials' store into shared memory
        # while it was visible to it: -22 % at 1024 x 32768 float16)
        assert body.index("__shfl_xor_sync(") < body.index("__syncthreads()")
        kept = plan.cache == "l2" and plan.cached > 0 and plan.kept_exp and dtype != "float32"
        assert ("tvmpipe_copy16(" in body) == kept
        assert plan.cache != "l2" or plan.kept_exp == (rows * plan.chunks <= 132)  # (streamed: one wave of blocks)
        if regime == "split":  # the rendezvous: 16-byte slots and no fences; one barrier from publishing to the row's
            # (max, sum) in every thread (the fallback's barriers after it)
            assert "st.relaxed.gpu.global.b128" in src and "ld.relaxed.gpu.global.b128" in src
            assert "release" not in src and "acquire" not in src
            exchange = body[body.index("_publish("):body.index("if (tick_ptr[1] == (uint64_t)0ULL)")]
            assert exchange.count("__syncthreads()") == 1 and "_take(" in exchange
    vector = "float4" if dtype == "float32" else "uint4"
    x, y = ("x", "y") if regime == "warp" else ("xf", "yf")  # (the block kernel's flat views)
    assert f"*({vector}*)({x}_ptr" in src and f"*({vector}*)({y}_ptr" in src
    if regime == "warp":  # the row is loaded once: count x_ptr loads
        assert "extern __shared__" not in src
        assert src.count("x_ptr + ") + src.count("x_ptr[") == plan.per_thread


# DLight-style Before/After: the canonical kernel of a 64 x 128 float32 softmax and its warp schedule
# (8 lanes per row, 4 float4 per lane, 32 rows per 256-thread block, exp(x - max) kept in registers, through the
# bare ex2 instruction).
@T.prim_func(s_tir=True)
def _after(x: T.Buffer((64, 128), "float32"), y: T.Buffer((64, 128), "float32")):
    T.func_attr({"tirx.noalias": True, "tvmpipe.kernel": "softmax"})
    xc_local = T.sblock_alloc_buffer((64, 4, 8, 4), scope="local")
    row_max_local = T.sblock_alloc_buffer((64,), scope="local")
    ec_local = T.sblock_alloc_buffer((64, 4, 8, 4), scope="local")
    row_sum_local = T.sblock_alloc_buffer((64,), scope="local")
    yc_local = T.sblock_alloc_buffer((64, 4, 8, 4), scope="local")
    for r_0 in T.thread_binding(2, thread="blockIdx.x"):
        for r_1 in T.thread_binding(32, thread="threadIdx.y"):
            for ax0 in range(1):
                for ax2 in T.thread_binding(8, thread="threadIdx.x"):
                    for ax1 in T.unroll(4):
                        for ax3 in T.vectorized(4):
                            with T.sblock("load"):
                                vr = T.axis.spatial(64, r_0 * 32 + r_1 + ax0)
                                vj, vl, vv = T.axis.remap("SSS", [ax1, ax2, ax3])
                                T.reads(x[vr, (vj * 8 + vl) * 4 + vv])
                                T.writes(xc_local[vr, vj, vl, vv])
                                xc_local[vr, vj, vl, vv] = T.if_then_else(
                                    vj * 8 + vl < 32, x[vr, (vj * 8 + vl) * 4 + vv],
                                    T.Cast("float32", T.float32("-inf")))
            for ax0 in range(1):
                for ax2 in T.thread_binding(8, thread="threadIdx.x"):
                    for ax1 in T.unroll(4):
                        for ax3 in T.unroll(4):
                            with T.sblock("row_max"):
                                vr = T.axis.spatial(64, r_0 * 32 + r_1 + ax0)
                                vj, vl, vv = T.axis.remap("RRR", [ax1, ax2, ax3])
                                T.reads(xc_local[vr, vj, vl, vv])
                                T.writes(row_max_local[vr])
                                with T.init():
                                    row_max_local[vr] = T.min_value("float32")
                                row_max_local[vr] = T.max(row_max_local[vr], T.Cast("float32", xc_local[vr, vj, vl, vv]))
            for ax0 in range(1):
                for ax2 in T.thread_binding(8, thread="threadIdx.x"):
                    for ax1 in T.unroll(4):
                        for ax3 in T.unroll(4):
                            with T.sblock("exp"):
                                vr = T.axis.spatial(64, r_0 * 32 + r_1 + ax0)
                                vj, vl, vv = T.axis.remap("SSS", [ax1, ax2, ax3])
                                T.reads(xc_local[vr, vj, vl, vv], row_max_local[vr])
                                T.writes(ec_local[vr, vj, vl, vv])
                                ec_local[vr, vj, vl, vv] = ex2(
                                    (T.Cast("float32", xc_local[vr, vj, vl, vv]) - row_max_local[vr]) * T.float32(LOG2E))
            for ax0 in range(1):
                for ax2 in T.thread_binding(8, thread="threadIdx.x"):
                    for ax1 in T.unroll(4):
                        for ax3 in T.unroll(4):
                            with T.sblock("row_sum"):
                                vr = T.axis.spatial(64, r_0 * 32 + r_1 + ax0)
                                vj, vl, vv = T.axis.remap("RRR", [ax1, ax2, ax3])
                                T.reads(ec_local[vr, vj, vl, vv])
                                T.writes(row_sum_local[vr])
                                with T.init():
                                    row_sum_local[vr] = T.float32(0.0)
                                row_sum_local[vr] = row_sum_local[vr] + ec_local[vr, vj, vl, vv]
            for l in T.thread_binding(8, thread="threadIdx.x"):
                for j in T.unroll(4):
                    for ax0, ax1, ax2 in T.grid(1, 1, 1):
                        for ax3 in T.unroll(4):
                            with T.sblock("normalize"):
                                vr = T.axis.spatial(64, r_0 * 32 + r_1 + ax0)
                                vj = T.axis.spatial(4, j + ax1)
                                vl = T.axis.spatial(8, l + ax2)
                                vv = T.axis.spatial(4, ax3)
                                T.reads(ec_local[vr, vj, vl, vv], row_sum_local[vr])
                                T.writes(yc_local[vr, vj, vl, vv])
                                yc_local[vr, vj, vl, vv] = T.Cast(
                                    "float32", ec_local[vr, vj, vl, vv] * (T.float32(1.0) / row_sum_local[vr]))
                    for v in T.vectorized(4):
                        with T.sblock("store"):
                            vr = T.axis.spatial(64, r_0 * 32 + r_1)
                            vj, vl, vv = T.axis.remap("SSS", [j, l, v])
                            T.reads(yc_local[vr, vj, vl, vv])
                            T.writes(y[vr, (vj * 8 + vl) * 4 + vv])
                            if vj * 8 + vl < 32:
                                y[vr, (vj * 8 + vl) * 4 + vv] = yc_local[vr, vj, vl, vv]


def test_rule_before_after():
    before = softmax_tir.canonical(64, 128, "float32", "softmax").with_attrs({S.KERNEL_ATTR: "softmax", "op_pattern": 8})
    sch = S.Softmax().apply(before, CUDA, False)
    tvm.ir.assert_structural_equal(sch.mod["main"].without_attr("global_symbol"), _after.without_attr("global_symbol"))


def test_rule_declines_other_kernels():
    tagged = softmax_tir.canonical(4, 8, "float32", "softmax").with_attr(S.KERNEL_ATTR, "softmax")
    assert S.Softmax().apply(tagged, CUDA, False) is not None
    assert S.Softmax().apply(tagged.with_attr(S.KERNEL_ATTR, "log_softmax"), CUDA, False) is None  # body differs
    assert S.Softmax().apply(softmax_tir.canonical(4, 8, "float32", "softmax"), CUDA, False) is None  # untagged
    assert S.Softmax().apply(tagged, tvm.target.Target("c"), False) is None


def test_cli_any_axis_log_softmax_and_default_schedules(capsys, tmp_path, rng):
    """Softmax over axes 0 / 1 / -1 and LogSoftmax of a 3-D float16 input through the CLI: our kernels by
    default, TVM's with --no-custom-schedules; both match onnxruntime."""
    nodes = [helper.make_node("Softmax", ["x"], ["a"], axis=0), helper.make_node("LogSoftmax", ["x"], ["b"], axis=1),
             helper.make_node("Softmax", ["x"], ["c"], axis=-1)]
    model = make_model(nodes, [("x", TP.FLOAT16, [3, 5, 33])], [(n, TP.FLOAT16, [3, 5, 33]) for n in "abc"])
    x = (rng.standard_normal((3, 5, 33)) * 4).astype(np.float16)
    # (TVM's default float16 kernel accumulates in float16: a few ulps more error than ours, in float32)
    for extra, hand, tol in (((), 3, 2e-3), (("--no-custom-schedules",), 0, 8e-3)):
        ours, ref = compile_and_compare(capsys, tmp_path, model, {"x": x}, extra_args=extra)
        for name in "abc":
            assert rel_err(ours[name], ref[name]) < tol, (extra, name)
        with zipfile.ZipFile(tmp_path / "model.tvmpkg") as zf:
            kernels = json.loads(zf.read("manifest.json"))["kernels"]
        assert sum(v == "hand:Softmax" for v in kernels.values()) == hand, kernels


def test_cuda_package_builds_every_regime(capsys, tmp_path):
    """``tvmpipe compile --target cuda-sm90`` of softmaxes of every regime and both dtypes: NVRTC accepts the
    module (float32, float16 and bfloat16 stream kernels, each with shared memory, side by side) and all of them
    are ours."""
    shapes = {"a": (4096, 1024, TP.FLOAT), "b": (4096, 4096, TP.FLOAT16), "c": (4096, 50257, TP.FLOAT),
              "d": (4096, 50257, TP.FLOAT16), "e": (16, 1 << 20, TP.FLOAT16), "f": (4096, 50257, TP.BFLOAT16),
              "g": (64, 1000, TP.BFLOAT16)}
    nodes = [helper.make_node("Softmax", [n], [n + "_y"], axis=-1) for n in shapes]
    model = make_model(nodes, [(n, t, [r, c]) for n, (r, c, t) in shapes.items()],
                       [(n + "_y", t, [r, c]) for n, (r, c, t) in shapes.items()])
    r = run_cli(capsys, "compile", save(model, tmp_path / "m.onnx"), "--target", "cuda-sm90", "-o", tmp_path / "m.tvmpkg")
    assert r.code == 0, r.err
    assert "7 kernels" in r.out and "cubin" in r.out
    with zipfile.ZipFile(tmp_path / "m.tvmpkg") as zf:
        assert set(json.loads(zf.read("manifest.json"))["kernels"].values()) == {"hand:Softmax"}


def _vexp_kernel(n: int, lanes: int):
    """y = softmax_tir.vexp(x) over n floats: lanes-wide vectors, then a scalar tail (both code paths)."""
    full = n // lanes

    @T.prim_func(s_tir=True)
    def vexp(x: T.Buffer((n,), "float32"), y: T.Buffer((n,), "float32")):
        for i in T.parallel(full):
            for l in T.vectorized(lanes):
                y[i * lanes + l] = softmax_tir.vexp(x[i * lanes + l])
        for t in range(n - full * lanes):
            y[full * lanes + t] = softmax_tir.vexp(x[full * lanes + t])

    from compiler import targets

    return tvm.compile(tvm.IRModule({"main": vexp}), targets.resolve("cpu").target)["main"]


def test_vexp_ulps_over_softmax_range():
    """The CPU kernels' exp against float64 on every 331st float32 of [-104, 0] (3.4 M values, all binades)
    and the specials: <= 2.25 ulp where exp is a normal float32, flushed to 0 below 2^-126, exp(-0) = 1,
    exp(-inf) = 0, NaN stays NaN. (Exhaustively, all 1.1e9 floats of [-104, 0]: 2.215 ulp; the Cephes polynomial before: 1.016.)"""
    lo = int(np.float32(-104).view(np.uint32))
    x = np.arange(0x80000000, lo + 1, 331, dtype=np.uint64).astype(np.uint32).view(np.float32)
    specials = np.array([-np.inf, np.nan, -0.0, 0.0, -1e-45, softmax_tir.EXP_LO, -87.34, -3.4e38], np.float32)
    x = np.concatenate([x, specials, np.float32(-1) * np.float32(2.0) ** -np.arange(1, 24, dtype=np.float32)])
    y = tvm.runtime.tensor(np.empty_like(x))
    _vexp_kernel(len(x), 16)(tvm.runtime.tensor(x), y)
    y = y.numpy()
    with np.errstate(all="ignore"):
        ref = np.exp(x.astype(np.float64))
    normal = ref >= 2.0**-126
    ulps = np.abs(y[normal] - ref[normal]) / np.spacing(ref[normal].astype(np.float32)).astype(np.float64)
    assert ulps.max() <= 2.25, (ulps.max(), x[normal][ulps.argmax()])
    tiny = ~normal & ~np.isnan(x)
    assert (np.abs(y[tiny] - ref[tiny]) <= 2.0**-126).all()
    got = y[-len(specials) - 23:-23]
    # (exp(EXP_LO) = 2^-126 (1 - 4e-6), a subnormal; just below EXP_LO: flushed to 0)
    np.testing.assert_allclose(got, [0, np.nan, 1, 1, 1, np.exp(np.float64(softmax_tir.EXP_LO)), 0, 0], rtol=1e-6, atol=0)
