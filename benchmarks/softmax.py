"""Softmax benchmark and numerics check (issue #4): tvmpipe's hand-written schedules against TVM's default
(``--no-custom-schedules``: DLight on CUDA), torch.softmax, a device copy and the seed's naive kernel on the
GPU; against numpy and onnxruntime on the CPU.

GPU, in two steps (the GPU machine has TVM's runtime only, so everything is compiled here first):
    python3 benchmarks/softmax.py --build            # here: all kernels -> build/gpu/softmax/ (one library)
    python3 benchmarks/softmax.py --run --out DIR    # GPU machine: DIR/softmax-<device>.json, .png and
                                                     #   DIR/softmax-check-<device>.json (odd sizes, special values)
    python3 benchmarks/softmax.py --profile --out DIR  # GPU machine with ncu: DIR/softmax-ncu-<device>.json
CPU, here:          python3 benchmarks/softmax.py --cpu --out benchmarks/results
Chart / table of a result:  python3 benchmarks/softmax.py --plot (or --table) benchmarks/results/softmax-h200.json
                            (--table also prints the few-long-rows layouts from the variants file beside it)

``tbps`` counts one read and one write of the tensor; ``copy_tbps`` is a copy of the same bytes timed in the
same run. Every timed output is checked against float64 (``max_err``, ``ok``), so a fast wrong kernel shows.
On the GPU each implementation is timed in ``ROUNDS`` rounds interleaved with the others, each round in a random
order (the median round kept, all in ``ms_rounds``); ``--baseline`` adds another build's kernels (A/B of a change).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import re
import statistics
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.common import gpu_slug, interleaved, ncu_line, ncu_profile  # noqa: E402

BUILD = REPO / "build" / "gpu" / "softmax"
GPU_SHAPES = [(4096, 4096), (32768, 1024), (65536, 128), (1024, 32768), (128, 131072), (16, 1048576), (4096, 50257)]
# Profiled with Nsight Compute (``--profile``): the shapes short of 0.9 of copy bandwidth, and one at it
PROFILED_SHAPES = [(128, 131072), (16, 1048576), (4096, 4096)]
CPU_SHAPES = [(1024, 1024), (8192, 128), (128, 16384), (8, 262144), (64, 50257)]
DTYPES = ("float32", "float16")  # timed (the cases); checked: these and bfloat16 (CUDA)
CHECK_DTYPES = (*DTYPES, "bfloat16")
KINDS = ("softmax", "log_softmax")
CHECK_COLS = (1, 3, 31, 1023, 1025, 4097, 50257, 131073)
CHECK_ROWS = (5, 257)  # few rows and many
# Every CHECK_COLS length above 1023 breaks 16-byte alignment, so those rows all take the block kernel (one step
# in registers up to 4097, streamed beyond); these aligned shapes reach the other plans: a block per row in
# registers, and the split.
PLAN_SHAPES = ((257, 8192), (5, 1 << 20))
# Other CUDA layouts (schedules.softmax.CudaPlan fields) timed beside the chosen one, to tune cuda_plan by.
VARIANTS = [
    # a 1024-thread block per row holding the row in registers, instead of two 512-thread blocks per SM streaming
    (1024, 32768, "float32", {"lanes": 1024, "vec": 4, "per_thread": 8}),
    (1024, 32768, "float16", {"lanes": 1024, "vec": 8, "per_thread": 4}),
    # the row split over two 512-thread blocks (two per SM, exchanging partials) instead of one 1024-thread block
    (128, 131072, "float32", {"lanes": 512, "vec": 4, "per_thread": 4, "cache": "l2", "chunks": 2, "cached": 3}),
    (128, 131072, "float16", {"lanes": 512, "vec": 8, "per_thread": 4, "cache": "l2", "chunks": 2, "cached": 3}),
    # float32 rows no block holds on chip: one 1024-thread block per row, streamed (the rule's before the cluster
    # split); the cluster split in 4 x 128 KB chunks of 512 threads (the rule's before 2 of 1024); float16 split too
    (128, 131072, "float32", {"lanes": 1024, "vec": 4, "per_thread": 4, "cache": "l2", "cached": 3}),
    (128, 131072, "float32", {"lanes": 512, "vec": 4, "per_thread": 4, "cache": "l2", "chunks": 4, "cached": 3,
                              "kept_exp": False, "cluster": True}),
    (128, 131072, "float16", {"lanes": 512, "vec": 8, "per_thread": 4, "cache": "l2", "chunks": 4, "cached": 1,
                              "kept_exp": False, "cluster": True}),
    # the same for the split rows: 16 chunks of 512 threads, two per SM, instead of 8 of 1024 threads
    (16, 1 << 20, "float32", {"lanes": 512, "vec": 4, "per_thread": 4, "cache": "l2", "chunks": 16, "cached": 3}),
    (16, 1 << 20, "float16", {"lanes": 512, "vec": 8, "per_thread": 4, "cache": "l2", "chunks": 16, "cached": 3}),
    # no shared-memory cache: pass 2 re-reads all but the last step from L2
    (4096, 50257, "float32", {"lanes": 1024, "vec": 4, "per_thread": 4, "cache": "l2"}),
    (4096, 50257, "float16", {"lanes": 512, "vec": 8, "per_thread": 4, "cache": "l2"}),
    # the other block size: two 512-thread blocks per SM (float32: 73 KB of each row from L2), one of 1024 threads
    (4096, 50257, "float32", {"lanes": 512, "vec": 4, "per_thread": 4, "cache": "l2", "cached": 3}),
    (4096, 50257, "float16", {"lanes": 1024, "vec": 8, "per_thread": 4, "cache": "l2", "cached": 1}),
]
# Few long rows (a language model's next-token softmax over its vocabulary, batch 1 or 8; and one row of 32-64 KB,
# which the rule leaves to one block): timed like GPU_SHAPES, beside one block per row and the split into other chunk
# counts (as many blocks as SMs; 64 KB and 16 KB chunks), all recorded in the variants file (not the table),
# to place the split by.
FEW_ROWS_SHAPES = [(1, 50257), (1, 128256), (8, 128256), (1, 262144), (1, 8192), (1, 16384)]
FEW_ROWS_LAYOUTS = ("one block per row", "64 KB chunks", "16 KB chunks", "a block per SM")
# Checked on the GPU only: a split whose blocks cannot all be resident (384 of 1024 threads), so that the first ones
# wait in vain and take the fallback (each reads its whole row).
OVERSUBSCRIBED = (16, 1 << 20, "float32", {"lanes": 1024, "vec": 4, "per_thread": 4, "cache": "l2", "chunks": 24})
# GPU timing: rounds per implementation, interleaved, each round in its own (seeded) random order, the median round
# kept. Rounds that rotated one order alternated between two speeds by an implementation's place in the order (its
# parity; not the flush buffer's allocation, tried), so a 5-round median of identical kernels was off by up to 6 %
# at the few-microsecond shapes. A random order breaks that tie to the place, and an even count of rounds takes the
# mean of the middle two.
ROUNDS = 8
# Normwise tolerance of a timed output: max |y - ref| / max |ref|.
BENCH_TOL = {"float32": 2e-5, "float16": 2e-3}
# The seed's kernel, verbatim: one block per row, one thread per column, O(cols^2) work per row.
SEED_KERNEL = r"""
extern "C" __global__ void softmax_kernel(float *input, float *output, int rows, int cols) {
    int row = blockIdx.x;
    int col = threadIdx.x;
    if (row < rows && col < cols) {
        float max_val = -FLT_MAX;
        for (int i = 0; i < cols; i++) {
            if (input[row * cols + i] > max_val) {
                max_val = input[row * cols + i];
            }
        }
        float sum = 0.0;
        for (int i = 0; i < cols; i++) {
            sum += exp(input[row * cols + i] - max_val);
        }
        output[row * cols + col] = exp(input[row * cols + col] - max_val) / sum;
    }
}
"""


# ---------------------------------------------------------------- numerics (shared with the tests)


def reference(x: np.ndarray, kind: str) -> np.ndarray:
    """ONNX (Log)Softmax over the last axis in float64: x - max, exp, sum (NaN / inf propagate as in onnxruntime)."""
    x = x.astype(np.float64)
    with np.errstate(all="ignore"):
        z = x - x.max(axis=-1, keepdims=True)
        s = np.exp(z).sum(axis=-1, keepdims=True)
        return z - np.log(s) if kind == "log_softmax" else np.exp(z) / s


def sample(rows: int, cols: int, dtype: str, rng: np.random.Generator) -> np.ndarray:
    """Random rows of mixed scale, the first (as many as there are rows) special: equal values, half -inf,
    huge magnitudes (+-3e38 and 1e30; +-6e4 and 1e4 in float16), one NaN, one +inf, all -inf, all NaN."""
    big, large = (6e4, 1e4) if dtype == "float16" else (3e38, 1e30)
    x = rng.standard_normal((rows, cols)) * rng.choice([1.0, 8.0], (rows, 1))
    a = int(rng.integers(cols))
    b = (a + 1) % cols
    for i, row in enumerate(x[:7]):
        if i == 0:
            row[:] = 3.0
        elif i == 1:
            row[rng.random(cols) < 0.5] = -np.inf
        elif i == 2:
            row[:], row[a], row[b] = -big, big, large
        else:
            row[a if i < 5 else slice(None)] = (np.nan, np.inf, -np.inf, np.nan)[i - 3]
    return x.astype(dtype)


def mismatches(ours: np.ndarray, x: np.ndarray, kind: str) -> tuple[int, float]:
    """(elements outside tolerance, max abs error over finite references) of ``ours`` vs ``reference``.

    The reference is rounded to the output dtype first (so -6e38 is -inf in float32, like ours);
    NaN and inf must match exactly.
    """
    dtype = ours.dtype
    with np.errstate(all="ignore"):
        ref = reference(x, kind).astype(dtype).astype(np.float64)
    got = ours.astype(np.float64)
    rtol, atol = {np.float32: (1e-5, 1e-6), np.float16: (2e-3, 1e-4)}.get(dtype.type, (8e-3, 1e-3))  # bfloat16: 2^-8
    if kind == "log_softmax":  # its error is absolute, log(sum)'s: ~sqrt(cols) float32 roundings of the sum
        atol = max(atol, 1e-4)
    bad = ~np.isclose(got, ref, rtol=rtol, atol=atol, equal_nan=True)
    finite = np.isfinite(ref) & np.isfinite(got)
    return int(bad.sum()), float(np.abs(got[finite] - ref[finite]).max(initial=0.0))


# ---------------------------------------------------------------- compiling (here)


def pipeline_kernel(rows: int, cols: int, dtype: str, kind: str, target, custom: bool):
    """The one kernel that ``tvmpipe compile`` (``custom=False``: ``--no-custom-schedules``) makes of a
    [rows, cols] (log)softmax over the last axis, and where its schedule came from."""
    from tvm import relax, tirx

    from compiler import passes, schedules, tuning

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((rows, cols), dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            gv = bb.emit_output(getattr(relax.op.nn, kind)(x, axis=-1))
        bb.emit_func_output(gv)
    mod, _ = passes.optimize(bb.get(), target, legalize=schedules.legalizations() if custom else {})
    mod, hand = schedules.apply(mod, target, enabled=custom)
    mod, provenance, _ = tuning.apply(mod, target)
    ((gvar, func),) = [(g, f) for g, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)]
    name = gvar.name_hint
    return func, f"hand:{hand[name]}" if name in hand else provenance[name]


def _plan(rows: int, cols: int, dtype: str, target) -> str:
    from schedules.softmax import cuda_plan

    return repr(cuda_plan(rows, cols, dtype, target.arch)) if target.is_gpu else "cpu"


def compile_cases(cases: list[dict], target_name: str):
    """Compile the kernel of every case (``impl`` tvmpipe / default) into one module; annotate the cases."""
    import tvm

    from compiler import targets

    from schedules.softmax import CudaPlan, schedule_cuda

    target = targets.resolve(target_name)
    funcs = {}
    for case in cases:
        shape = (case["rows"], case["cols"], case["dtype"], case["kind"])
        if case["impl"] == "variant":
            func = schedule_cuda(*shape, CudaPlan(**case["variant"])).mod["main"]
            case["plan"] = repr(CudaPlan(**case["variant"]))
        else:
            func, case["schedule"] = pipeline_kernel(*shape, target, case["impl"] == "tvmpipe")
        if case["impl"] == "tvmpipe":
            case["plan"] = _plan(case["rows"], case["cols"], case["dtype"], target)
        funcs[case["name"]] = func.with_attr("global_symbol", case["name"])
    exe = tvm.compile(tvm.IRModule(funcs), target.target)
    return exe, target


def _name(impl: str, kind: str, dtype: str, rows: int, cols: int) -> str:
    return f"{impl}_{kind}_{dtype}_{rows}x{cols}"


def few_rows_chunks(rows: int, cols: int, dtype: str) -> tuple[int, ...]:
    """Chunks per row of each of FEW_ROWS_LAYOUTS for a [rows, cols] softmax (sm_90's SMs; not capped at them)."""
    from schedules.common import SMS

    nbytes = cols * np.dtype(dtype).itemsize
    return 1, -(-nbytes // (64 << 10)), -(-nbytes // (16 << 10)), SMS["sm_90"] // rows


def _few_rows_variants() -> list[tuple]:
    """FEW_ROWS_SHAPES in each of FEW_ROWS_LAYOUTS (a split at most as many blocks as SMs) that is not the rule's
    plan."""
    from schedules.common import SMS
    from schedules.softmax import cuda_plan, split_plan

    sms, variants = SMS["sm_90"], []
    for (r, c), dt in ((shape, dt) for shape in FEW_ROWS_SHAPES for dt in DTYPES):
        chosen = cuda_plan(r, c, dt, "sm_90")
        counts = {min(k, sms // r) for k in few_rows_chunks(r, c, dt)} - {1}
        plans = [cuda_plan(r, c, dt, "sm_90", split=False)] + [split_plan(r, c, dt, sms, k) for k in sorted(counts)]
        variants += [(r, c, dt, dataclasses.asdict(p)) for p in plans if p != chosen]
    return variants


def build(out: Path) -> None:
    from compiler.build import Built

    cases = [
        {"impl": impl, "kind": "softmax", "dtype": dt, "rows": r, "cols": c, "check": False}
        for r, c in GPU_SHAPES for dt in DTYPES for impl in ("tvmpipe", "dlight")
    ] + [
        {"impl": "tvmpipe", "kind": kind, "dtype": dt, "rows": r, "cols": c, "check": True}
        for kind in KINDS for dt in CHECK_DTYPES for r, c in [(r, c) for r in CHECK_ROWS for c in CHECK_COLS] + list(PLAN_SHAPES)
    ] + [
        {"impl": "tvmpipe", "kind": "softmax", "dtype": dt, "rows": r, "cols": c, "check": False}
        for r, c in FEW_ROWS_SHAPES for dt in DTYPES
    ] + [
        {"impl": "variant", "kind": "softmax", "dtype": dt, "rows": r, "cols": c, "check": check, "variant": plan}
        for (r, c, dt, plan), check in [(v, False) for v in VARIANTS + _few_rows_variants()] + [(OVERSUBSCRIBED, True)]
    ]
    for i, case in enumerate(cases):
        case["name"] = _name(case["impl"], case["kind"], case["dtype"], case["rows"], case["cols"])
        case["name"] += f"_{i}" if case["impl"] == "variant" else ""
    t0 = time.perf_counter()
    exe, target = compile_cases(cases, "cuda-sm90")
    out.mkdir(parents=True, exist_ok=True)
    Built(exe, target).export(out / "kernels.so")
    (out / "cases.json").write_text(json.dumps(cases, indent=1))
    size = (out / "kernels.so").stat().st_size
    print(f"built {len(cases)} kernels -> {out}/kernels.so ({size / 2**20:.1f} MiB) in {time.perf_counter() - t0:.0f} s")


# ---------------------------------------------------------------- GPU run (TVM runtime + torch only)


def bf16(x: np.ndarray) -> bool:
    """Whether ``x`` is bfloat16, which torch takes from numpy (ml_dtypes) only as its 16 bits."""
    return x.dtype == ml_dtypes.bfloat16


def gpu_bench(fn, reps: int) -> float:
    """Median ms of ``fn`` on the current stream, L2 flushed before each call (triton's do_bench method)."""
    import torch

    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    for _ in range(3):
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


def _seed_kernel():
    """The seed kernel through CuPy (compiled by NVRTC on the GPU machine), or None without CuPy."""
    try:
        import cupy
    except ImportError:
        return None
    kernel = cupy.RawKernel("#define FLT_MAX 3.402823466e+38f\n" + SEED_KERNEL, "softmax_kernel")

    def launch(x, y):
        rows, cols = x.shape
        import torch

        with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            kernel((rows,), (cols,), (cupy.asarray(x), cupy.asarray(y), np.int32(rows), np.int32(cols)))

    return launch


def graph_replays(fn, case: dict, device: str, rng: np.random.Generator, replays: int = 4) -> list[dict]:
    """Kernel ``fn`` (a float32 ``case``) captured in a CUDA graph and replayed on fresh inputs, each output checked: a
    split kernel's blocks must tell its launches apart where ``%gridid`` repeats (every replay)."""
    import torch
    import tvm
    import tvm_ffi

    x = torch.empty(case["rows"], case["cols"], device="cuda")
    y = torch.empty_like(x)
    xt, yt = tvm.runtime.from_dlpack(x), tvm.runtime.from_dlpack(y)
    fn(xt, yt)
    graph = torch.cuda.CUDAGraph()
    with tvm_ffi.use_torch_stream(torch.cuda.graph(graph)):
        fn(xt, yt)
    records = []
    for i in range(replays):
        xs = sample(case["rows"], case["cols"], "float32", rng)
        x.copy_(torch.from_numpy(xs))
        y.fill_(float("nan"))
        graph.replay()
        bad, err = mismatches(y.cpu().numpy(), xs, case["kind"])
        records.append({k: case[k] for k in ("kind", "dtype", "rows", "cols", "plan")} | {
            "device": device, "graph_replay": i, "mismatches": bad, "max_err": err, "ok": bad == 0})
        print(f"check {case['name']} CUDA graph replay {i}: {'ok' if bad == 0 else f'{bad} MISMATCHES'}", flush=True)
    return records


def run(out: Path, baselines: list[Path] = (), shapes: list[tuple[int, int]] | None = None) -> None:
    """Check and time every GPU case; ``baselines``: other builds' tvmpipe kernels (say, the previous commit's)
    timed beside them, recorded as impl "tvmpipe-baseline" (and the folder's name) with the variants; ``shapes``:
    time only these (rows, cols) and skip the odd-size checks (a re-run of some shapes' variants)."""
    import torch
    import tvm
    import tvm_ffi

    from compiler.runtime import load_cuda_runtime

    load_cuda_runtime()  # a runtime-only TVM does not load its CUDA backend by itself

    cases = json.loads((BUILD / "cases.json").read_text())
    lib = tvm.runtime.load_module(str(BUILD / "kernels.so"))
    for folder in baselines:
        base_lib = tvm.runtime.load_module(str(folder / "kernels.so"))
        cases += [c | {"impl": "baseline", "lib": base_lib, "baseline": folder.name}
                  for c in json.loads((folder / "cases.json").read_text()) if c["impl"] == "tvmpipe" and not c["check"]]
    device = gpu_slug()
    seed = _seed_kernel()
    tdt = {"float32": torch.float32, "float16": torch.float16}
    impl_names = {"variant": "tvmpipe-variant", "baseline": "tvmpipe-baseline"}
    records, variants, checks = [], [], []
    shuffle = random.Random(0).shuffle
    with tvm_ffi.use_torch_stream():
        for rows, cols in [s for s in GPU_SHAPES + FEW_ROWS_SHAPES if shapes is None or s in shapes]:
            for dt in DTYPES:
                x = torch.randn(rows, cols, dtype=tdt[dt], device="cuda") * 4
                y = torch.empty_like(x)
                ref = torch.softmax(x.double(), dim=-1)
                xt, yt = tvm.runtime.from_dlpack(x), tvm.runtime.from_dlpack(y)
                nbytes = 2 * x.numel() * x.element_size()
                reps = max(5, min(100, int(2e10 / nbytes)))
                timed = [  # (impl, schedule, fn returning the output, extra fields)
                    (c["impl"], c.get("plan") or c.get("schedule", "?"),
                     lambda f=c.get("lib", lib)[c["name"]]: (f(xt, yt), y)[1],
                     {"baseline": c["baseline"]} if "baseline" in c else {})
                    for c in cases if not c["check"] and (c["rows"], c["cols"], c["dtype"]) == (rows, cols, dt)
                ]
                timed.append(("torch", "torch.softmax", lambda: torch.softmax(x, dim=-1), {}))
                if seed is not None and dt == "float32" and cols <= 1024:
                    timed.append(("seed-naive", "one block per row", lambda: (seed(x, y), y)[1], {}))
                base = {"dtype": dt, "rows": rows, "cols": cols, "device": device}
                shape_records = []
                for impl, schedule, fn, extra in list(timed):  # checked first
                    y.fill_(float("nan"))
                    try:
                        err = float(((fn().double() - ref).abs().max() / ref.abs().max()).item())
                    except Exception as e:  # (a variant the GPU refuses to launch: recorded, not timed)
                        if impl != "variant":
                            raise
                        print(f"variant {schedule} failed: {e}", flush=True)
                        variants.append({"impl": impl_names[impl], **base, "ok": False, "schedule": schedule,
                                         "error": str(e).splitlines()[0] if str(e) else type(e).__name__})
                        timed.remove((impl, schedule, fn, extra))
                        continue
                    shape_records.append({"impl": impl_names.get(impl, impl), **base, "max_err": err,
                                          "ok": err <= BENCH_TOL[dt], "schedule": schedule, **extra})
                # then timed with the copy in interleaved rounds, each in its own random order (see ROUNDS), each
                # round's median kept in ms_rounds
                fns = [lambda: y.copy_(x)] + [fn for _, _, fn, _ in timed]
                rounds = [[] for _ in fns]
                order = list(range(len(fns)))
                for _ in range(ROUNDS):
                    shuffle(order)
                    for i in order:
                        rounds[i].append(gpu_bench(fns[i], 5 if i and timed[i - 1][0] == "seed-naive" else reps))
                copy_tbps = nbytes / statistics.median(rounds[0]) / 1e9
                for record, ms_rounds in zip(shape_records, rounds[1:]):
                    ms = statistics.median(ms_rounds)
                    record.update(ms=ms, tbps=nbytes / ms / 1e9, copy_tbps=copy_tbps, ms_rounds=ms_rounds)
                    few = (rows, cols) in FEW_ROWS_SHAPES  # (recorded as variants: not the table)
                    (variants if record["impl"] in impl_names.values() or few else records).append(record)
                    print(f"{record['impl']:>16} {dt} {rows}x{cols}: {ms:.4f} ms {record['tbps']:.2f} TB/s "
                          f"(copy {copy_tbps:.2f}) err {record['max_err']:.1e} {record['schedule']}", flush=True)
                del x, y, ref, timed, fns
        rng = np.random.default_rng(0)
        for case in (c for c in cases if c["check"] and shapes is None):
            x = sample(case["rows"], case["cols"], case["dtype"], rng)
            xg = torch.from_numpy(x.view(np.int16)).cuda().view(torch.bfloat16) if bf16(x) else torch.from_numpy(x).cuda()
            yg = torch.full_like(xg, float("nan"))
            lib[case["name"]](tvm.runtime.from_dlpack(xg), tvm.runtime.from_dlpack(yg))
            y = yg.view(torch.int16).cpu().numpy().view(ml_dtypes.bfloat16) if bf16(x) else yg.cpu().numpy()
            bad, err = mismatches(y, x, case["kind"])
            checks.append({k: case[k] for k in ("kind", "dtype", "rows", "cols", "plan")} | {
                "device": device, "mismatches": bad, "max_err": err, "ok": bad == 0})
            print(f"check {case['name']}: {'ok' if bad == 0 else f'{bad} MISMATCHES'} (max err {err:.1e})", flush=True)
        split = next(c for c in cases if c["check"] and c["impl"] == "tvmpipe" and c["kind"] == "softmax"
                     and c["dtype"] == "float32" and c["rows"] * c["cols"] >= 1 << 20 and "chunks=1," not in c["plan"])
        checks += graph_replays(lib[split["name"]], split, device, rng) if shapes is None else []
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"softmax-{device}.json"
    path.write_text(json.dumps(records, indent=1))
    (out / f"softmax-variants-{device}.json").write_text(json.dumps(variants, indent=1))
    (out / f"softmax-check-{device}.json").write_text(json.dumps(checks, indent=1))
    failed = [r for r in records + variants + checks if not r["ok"]]
    others = sum(not r.get("impl", "tvmpipe").startswith("tvmpipe") for r in failed)  # (checks: ours, no impl)
    print(f"wrote {path} (+ -variants, -check); numerics failures: {len(failed) - others} of tvmpipe's kernels, "
          f"{others} of the others'")
    plot(path)


def profile_launch() -> None:
    """(what ``profile`` watches) Per PROFILED_SHAPES and dtype, 3 calls of our kernel, then 3 of torch's elementwise
    ``x + 0`` into the same output (a kernel moving the same bytes: torch's copy is a memcpy, which ncu does not
    profile)."""
    import torch
    import tvm

    from compiler.runtime import load_cuda_runtime

    load_cuda_runtime()
    lib = tvm.runtime.load_module(str(BUILD / "kernels.so"))
    tdt = {"float32": torch.float32, "float16": torch.float16}
    for (rows, cols), dt in ((shape, dt) for shape in PROFILED_SHAPES for dt in DTYPES):
        x = torch.randn(rows, cols, dtype=tdt[dt], device="cuda")
        y = torch.empty_like(x)
        kernel = lib[_name("tvmpipe", "softmax", dt, rows, cols)]
        for _ in range(3):
            kernel(tvm.runtime.from_dlpack(x), tvm.runtime.from_dlpack(y))
        torch.cuda.synchronize()
        for _ in range(3):
            torch.add(x, 0, out=y)
        torch.cuda.synchronize()


def profile(out: Path) -> None:
    """Nsight Compute on our kernels of PROFILED_SHAPES and on an elementwise kernel of the same bytes
    (``benchmarks.common.ncu_profile``), the last of each 3 calls -> ``softmax-ncu-<device>.json``."""
    launches = ncu_profile("regex:tvmpipe_softmax_|vectorized_elementwise", [__file__, "--profile-launch"])
    cases = [(shape, dt, impl) for shape in PROFILED_SHAPES for dt in DTYPES for impl in ("tvmpipe", "torch-add0")]
    assert len(launches) == 3 * len(cases), f"{len(launches)} kernels profiled"
    device = gpu_slug()
    records = [{"impl": impl, "dtype": dt, "rows": rows, "cols": cols, "device": device, **got}
               for ((rows, cols), dt, impl), got in zip(cases, launches[2::3])]
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"softmax-ncu-{device}.json"
    path.write_text(json.dumps(records, indent=1))
    for r in records:
        print(f"{r['impl']:>10} {r['dtype']} {r['rows']}x{r['cols']}: {ncu_line(r)}")
    print(f"wrote {path}")


# ---------------------------------------------------------------- CPU (here)


def _timed(fn) -> float:
    """ms of one call."""
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def _cpu_bench(fn, reps: int) -> float:
    """Best-of-``reps`` ms, after warm-up calls."""
    for _ in range(3):
        fn()
    return min(_timed(fn) for _ in range(reps))


CPU_ROUNDS = 6


def _cpu_bench_interleaved(fns: dict, reps: dict) -> dict:
    """Best-of-``reps[name]`` ms of each function, the calls spread over ``CPU_ROUNDS`` rounds that visit the
    functions in turn (alternating order), so that each sees the same load from the other jobs on this
    shared machine (one function timed after another, a burst of load decided the comparison). Best, not
    median: only the quietest moments are comparable. A pause (``settle``) and a warm-up call before each
    function's turn: thread pools (TVM's, onnxruntime's) spin after a call and would slow whatever ran next."""
    done = dict.fromkeys(fns, 0)

    def turn(name: str) -> list[float]:
        n = min(reps[name] - done[name], -(-reps[name] // CPU_ROUNDS))
        if n <= 0:
            return []
        fns[name]()  # (warm-up)
        done[name] += n
        return [_timed(fns[name]) for _ in range(n)]

    times = interleaved({name: lambda n=name: turn(n) for name in fns}, CPU_ROUNDS,
                        order=lambda r: list(fns) if r % 2 == 0 else list(fns)[::-1])
    return {name: min(t) for name, t in times.items()}


def ort_softmax(x: np.ndarray, y: np.ndarray, threads: int):
    """onnxruntime's CPU softmax over the last axis of 2-D ``x`` into ``y`` (both bound in place, no copies): a
    function of no arguments."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    (rows, cols), dtype = x.shape, str(x.dtype)
    elem = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}[dtype]
    graph = helper.make_graph(
        [helper.make_node("Softmax", ["x"], ["y"], axis=-1)], "softmax",
        [helper.make_tensor_value_info("x", elem, [rows, cols])], [helper.make_tensor_value_info("y", elem, [rows, cols])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    binding = sess.io_binding()
    binding.bind_cpu_input("x", x)
    binding.bind_output("y", "cpu", 0, x.dtype, y.shape, y.ctypes.data)
    return lambda: sess.run_with_iobinding(binding)


def cpu_kernel(func, kind: str, target):
    """A CPU kernel written by (some version of) ``softmax_tir.cpu``, rows in parallel as the rule schedules them,
    compiled for ``target``: the function the benchmarks' side-by-side comparisons call."""
    import tvm

    from schedules.softmax import parallel_rows

    mod = tvm.IRModule({"main": parallel_rows(func, kind).mod["main"].with_attr("global_symbol", "main")})
    return tvm.compile(mod, target=target)["main"]


def run_cpu(out: Path) -> None:
    import tvm

    cases = [
        {"impl": impl, "kind": "softmax", "dtype": dt, "rows": r, "cols": c, "name": _name(impl, "softmax", dt, r, c)}
        for r, c in CPU_SHAPES for dt in DTYPES for impl in ("tvmpipe", "tvm-default")
    ]
    exe, target = compile_cases(cases, "cpu")
    threads = target.cores
    records = []
    rng = np.random.default_rng(0)
    for rows, cols in CPU_SHAPES:
        for dt in DTYPES:
            # one input and one output for every implementation (TVM's arrays, seen by NumPy and onnxruntime as
            # views), so that none finds its data in cache where another left it: with a copy each, TVM's kernels ran
            # after the others had filled L3 with their own arrays
            xt = tvm.runtime.tensor((rng.standard_normal((rows, cols)) * 4).astype(dt))
            yt = tvm.runtime.empty((rows, cols), dt)
            x, y = np.from_dlpack(xt), np.from_dlpack(yt)
            ref = reference(x, "softmax")
            nbytes = 2 * x.nbytes
            copy_tbps = nbytes / _cpu_bench(lambda: np.copyto(y, x), 30) / 1e9

            def numpy_softmax():
                e = np.exp(x - x.max(axis=-1, keepdims=True))
                np.divide(e, e.sum(axis=-1, keepdims=True), out=y)

            impls = {
                # (functions looked up here, not in the call: ``exe[name]`` costs 0.05-0.1 ms a call on a 2-core Xeon,
                # which the CPU tables up to 2026-12-05 counted in tvmpipe's and tvm-default's times)
                "tvmpipe": lambda f=exe[_name("tvmpipe", "softmax", dt, rows, cols)]: f(xt, yt),
                "tvm-default": lambda f=exe[_name("tvm-default", "softmax", dt, rows, cols)]: f(xt, yt),
                "numpy": numpy_softmax,
                "onnxruntime": ort_softmax(x, y, threads),
            }
            errs = {}
            for impl, fn in impls.items():
                y.fill(np.nan)
                fn()
                errs[impl] = float(np.abs(y.astype(np.float64) - ref).max() / np.abs(ref).max())
            reps = {impl: 2 if impl in ("tvm-default", "numpy") and dt == "float16" else 30 for impl in impls}
            times = _cpu_bench_interleaved(impls, reps)
            for impl in impls:
                ms, err = times[impl], errs[impl]
                records.append({
                    "impl": impl, "dtype": dt, "rows": rows, "cols": cols, "ms": ms, "tbps": nbytes / ms / 1e9,
                    "copy_tbps": copy_tbps, "device": "cpu", "threads": threads, "cpu": target.isa_summary(),
                    "timing": f"best of 30 (2 for slow float16 baselines), interleaved in {CPU_ROUNDS} rounds",
                    "max_err": err, "ok": err <= BENCH_TOL[dt],
                })
                print(f"{impl:>12} {dt} {rows}x{cols}: {ms:.3f} ms {records[-1]['tbps'] * 1e3:.1f} GB/s err {err:.1e}",
                      flush=True)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "softmax-cpu.json"
    path.write_text(json.dumps(records, indent=1))
    print(f"wrote {path}")
    plot(path)


# ---------------------------------------------------------------- chart


def plot(path: Path) -> None:
    """Grouped bars of TB/s per case and implementation, copy bandwidth as a black tick; PNG beside the JSON."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no chart (run --plot FILE elsewhere)")
        return
    records = json.loads(Path(path).read_text())
    cases = list(dict.fromkeys((r["rows"], r["cols"], r["dtype"]) for r in records))
    impls = list(dict.fromkeys(r["impl"] for r in records))
    width = 0.8 / len(impls)
    fig, ax = plt.subplots(figsize=(max(8, 1.1 * len(cases)), 4.5))
    for i, impl in enumerate(impls):
        for j, case in enumerate(cases):
            rec = next((r for r in records if (r["rows"], r["cols"], r["dtype"]) == case and r["impl"] == impl), None)
            if rec:
                ax.bar(j + (i - (len(impls) - 1) / 2) * width, rec["tbps"], width, color=f"C{i}",
                       hatch="" if rec["ok"] else "xx", label=impl if j == 0 else None)
    for j, case in enumerate(cases):
        copy = next(r["copy_tbps"] for r in records if (r["rows"], r["cols"], r["dtype"]) == case)
        ax.hlines(copy, j - 0.45, j + 0.45, color="black", label="copy" if j == 0 else None)
    unit = "TB/s" if records[0]["device"] != "cpu" else "TB/s (1 read + 1 write)"
    ax.set_xticks(range(len(cases)), [f"{r}x{c}\n{d.replace('float', 'f')}" for r, c, d in cases], fontsize=7)
    ax.set_ylabel(unit)
    ax.set_title(f"softmax on {records[0]['device']} (hatched: numerics check failed)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(Path(path).with_suffix(".png"), dpi=110)
    print(f"wrote {Path(path).with_suffix('.png')}")


def table(path: Path) -> str:
    """Markdown table of a results file: bandwidth per implementation and ours against copy and the rest."""
    records = json.loads(Path(path).read_text())
    impls = list(dict.fromkeys(r["impl"] for r in records))
    unit = 1e3 if records[0]["device"] == "cpu" else 1.0
    name = "GB/s" if unit > 1 else "TB/s"
    rows = [f"| rows x cols | dtype | {' | '.join(f'{i} {name}' for i in impls)} | copy {name} | ours / copy | ours / best other |",
            "|" + "---|" * (len(impls) + 5)]
    for case in dict.fromkeys((r["rows"], r["cols"], r["dtype"]) for r in records):
        got = {r["impl"]: r for r in records if (r["rows"], r["cols"], r["dtype"]) == case}
        ours = got["tvmpipe"]["tbps"]
        best = max(r["tbps"] for i, r in got.items() if i != "tvmpipe")
        cells = [f"{got[i]['tbps'] * unit:.2f}{'' if got[i]['ok'] else ' (inexact)'}" if i in got else "-" for i in impls]
        copy = got["tvmpipe"]["copy_tbps"]
        rows.append(f"| {case[0]} x {case[1]} | {case[2]} | {' | '.join(cells)} | {copy * unit:.2f} | "
                    f"{ours / copy:.2f} | {ours / best:.2f} |")
    return "\n".join(rows)


def few_rows_table(path: Path) -> str:
    """Markdown table of FEW_ROWS_SHAPES in a variants file: microseconds of the rule's plan (marked *) and of each
    of FEW_ROWS_LAYOUTS timed beside it, told apart by chunk count ("-": not timed, the same count as a column to its
    left, or more blocks than SMs); another build's kernels (``--baseline``) left out."""
    records = [r for r in json.loads(Path(path).read_text())
               if (r["rows"], r["cols"]) in FEW_ROWS_SHAPES and r["impl"] != "tvmpipe-baseline"]
    rows = [f"| rows x cols | dtype | {' us | '.join(FEW_ROWS_LAYOUTS)} us | torch us |",
            "|" + "---|" * (len(FEW_ROWS_LAYOUTS) + 3)]
    for r, c, dt in dict.fromkeys((x["rows"], x["cols"], x["dtype"]) for x in records):
        counts = few_rows_chunks(r, c, dt)
        cells, torch_ms = {}, "-"
        for x in (x for x in records if (x["rows"], x["cols"], x["dtype"]) == (r, c, dt)):
            if x["impl"] == "torch":
                torch_ms = f"{x['ms'] * 1e3:.1f}"
                continue
            chunks = int(re.search(r"chunks=(\d+)", x["schedule"]).group(1))
            for i, k in enumerate(counts):  # the first layout of that chunk count
                if k == chunks and i not in cells:
                    cells[i] = f"{x['ms'] * 1e3:.1f}" + ("*" if x["impl"] == "tvmpipe" else "")
                    break
        rows.append(f"| {r} x {c} | {dt} | {' | '.join(cells.get(i, '-') for i in range(len(FEW_ROWS_LAYOUTS)))} | {torch_ms} |")
    return "\n".join(rows)


def experiment(script: str, shapes: list[tuple[int, int]], variants: list[tuple[int, int, str, dict]]) -> int:
    """An experiment script's command line: ``main`` on ``shapes`` alone (no few-rows shapes, no odd-size checks but a
    split's, which ``run`` takes even where it skips checks) with ``variants`` (rows, cols, dtype, CudaPlan fields) in
    place of VARIANTS, built into build/gpu/<the script's folder>."""
    global BUILD, GPU_SHAPES, FEW_ROWS_SHAPES, CHECK_COLS, PLAN_SHAPES, VARIANTS
    BUILD = REPO / "build" / "gpu" / Path(script).resolve().parent.name
    GPU_SHAPES, FEW_ROWS_SHAPES, VARIANTS = list(shapes), [], list(variants)
    CHECK_COLS, PLAN_SHAPES = (), ((5, 1 << 20),)
    return main()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--build", action="store_true", help="compile the GPU kernels here (needs TVM's compiler)")
    mode.add_argument("--run", action="store_true", help="time and check them on the GPU (TVM runtime + torch)")
    mode.add_argument("--profile", action="store_true", help="Nsight Compute on the GPU kernels (GPU machine, ncu)")
    mode.add_argument("--profile-launch", action="store_true", help="(what --profile watches)")
    mode.add_argument("--cpu", action="store_true", help="compile, time and check on this CPU")
    mode.add_argument("--plot", metavar="JSON", help="draw the chart of a results file")
    mode.add_argument("--table", metavar="JSON", help="print a results file as a markdown table")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument("--baseline", type=Path, nargs="+", default=[],
                   help="--run: also time the tvmpipe kernels of these other --build folders")
    p.add_argument("--shapes", nargs="+", metavar="ROWSxCOLS",
                   help="--run: time only these shapes, no odd-size checks (e.g. 128x131072)")
    args = p.parse_args(argv)
    if args.build:
        build(BUILD)
    elif args.run:
        run(args.out, args.baseline, [tuple(map(int, v.split("x"))) for v in args.shapes] if args.shapes else None)
    elif args.profile:
        profile(args.out)
    elif args.profile_launch:
        profile_launch()
    elif args.cpu:
        run_cpu(args.out)
    elif args.plot:
        plot(Path(args.plot))
    else:
        print(table(Path(args.table)))
        variants = Path(args.table).with_name(Path(args.table).name.replace("softmax-", "softmax-variants-"))
        if variants.exists() and not Path(args.table).name.startswith("softmax-cpu"):
            print("\nFew long rows (" + variants.name + "):\n\n" + few_rows_table(variants))
    return 0


if __name__ == "__main__":
    sys.exit(main())
