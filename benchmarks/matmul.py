#!/usr/bin/env python3
"""GEMM benchmark: tvmpipe's tensor-core kernel (``schedules/gpu_matmul.py``) against TVM's default (DLight,
what ``--no-custom-schedules`` gives) and ``torch.matmul`` (cuBLAS), side by side in one run on the GPU machine.

    python benchmarks/matmul.py --build [--dir DIR]        # here: every kernel into DIR/kernels.so (build/gpu/matmul)
    python3 benchmarks/matmul.py --run [--dir DIR] --out OUT [--baseline DIR2]  # GPU machine (TVM runtime + torch):
                                                            # OUT/matmul-<device>.json; DIR2: another build's rule
    python benchmarks/matmul.py --table JSON               # a results file as a markdown table

The shapes are the GEMMs of the model zoo (GPT-2 at batch 32, BERT / ViT at batch 1, ResNet-50's convs at batch
32 as ``schedules/gpu_conv2d.py`` writes them, ``--shapes conv``) plus a square one, in fp16
and in fp32 (3xTF32 on the tensor cores; torch's fp32 matmul is cuBLAS's FP32 SGEMM, TF32 off by default);
``VARIANTS`` times other tile configurations beside the chosen one, which is how ``gpu_matmul.choose`` was
picked; on sm_90a every fp16 shape also times the mma.sync kernel the rule takes without wgmma (``mma.sync
rule``), and where the rule's kernel is mma.sync, the same storing its output straight from the accumulators.
Every timed output is checked against torch's float64 matmul of the same operands (``max_rel_err``: max |ours -
ref| / max |ref|), and ``CHECKS`` runs odd shapes (ragged tiles, M = 1, batch axes) for correctness.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.common import gpu_slug  # noqa: E402

BUILD = REPO / "build" / "gpu" / "matmul"

# (batch, m, n, k, layout, what): layout "nn" = B stored [k, n]; "nt" = B stored [n, k] (ResNet's convs' patches until
# 2026-12-07); "conv" = a conv's GEMM as ``schedules/gpu_conv2d.py`` writes it: the weight [m, k] shared by the batch,
# its patches [batch, k, n rounded up to 8] (n the pixels of a square image), the output [batch, m, side, side]
SHAPES = [
    ((), 4096, 4096, 4096, "nn", "square"),
    ((), 8192, 2304, 768, "nn", "gpt2 b32 qkv"),
    ((), 8192, 768, 768, "nn", "gpt2 b32 attn proj"),
    ((), 8192, 3072, 768, "nn", "gpt2 b32 mlp up"),
    ((), 8192, 768, 3072, "nn", "gpt2 b32 mlp down"),
    ((), 8192, 50264, 768, "nn", "gpt2 b32 lm head"),
    ((384,), 256, 256, 64, "nn", "gpt2 b32 q.k^T"),
    ((384,), 256, 64, 256, "nn", "gpt2 b32 p.v"),
    ((), 128, 768, 768, "nn", "bert b1"),
    ((), 128, 3072, 768, "nn", "bert b1 mlp up"),
    ((), 197, 768, 3072, "nn", "vit b1 mlp down"),
    ((32,), 256, 784, 1152, "nt", "resnet50 b32 conv3x3 28x28"),
    ((32,), 512, 49, 4608, "nt", "resnet50 b32 conv3x3 7x7"),
    # ResNet-50's conv GEMMs over 56 x 56 ... 7 x 7 pixels whose tile the rule's column padding picks (and 64 channels)
    *(((32,), m, side * side, k, "conv", f"resnet50 b32 conv {m}x{k} {side}x{side}") for m, k, side in (
        (64, 576, 56), (128, 1152, 28), (128, 512, 28), (256, 2304, 14), (256, 1024, 14), (512, 1024, 14),
        (1024, 256, 14), (512, 4608, 7), (2048, 512, 7), (2048, 1024, 7), (512, 2048, 7))),
]
# fp32 (3xTF32 on the tensor cores against cuBLAS's FP32 SGEMM: torch leaves TF32 off for matmuls by default)
SHAPES_FP32 = [s for s in SHAPES if s[-1] in ("square", "gpt2 b32 mlp up", "bert b1", "bert b1 mlp up", "vit b1 mlp down")]
SHAPES_FP32 += [((), 256, 2304, 768, "nn", "gpt2 b1 qkv"), ((1,), 256, 784, 1152, "nt", "resnet50 b1 conv3x3 28x28")]
CHECKS = [((), 1, 8, 8, "nn"), ((), 4001, 1032, 1000, "nt"), ((2, 5), 100, 136, 72, "nn"), ((3,), 33, 40, 24, "nt"),
          ((), 77, 1000, 1504, "nn")]
# tile configurations (GemmConfig fields) timed beside the chosen one on these shapes
BIG = [dict(), dict(warps_m=2, warps_n=2, m_tiles=4, n_tiles=8, bk=64, stages=3),
       dict(warps_m=2, warps_n=2, m_tiles=4, n_tiles=8, stages=5), dict(warps_m=2, warps_n=2, m_tiles=4, n_tiles=8, stages=3),
       dict(warps_m=2, warps_n=4, m_tiles=4, n_tiles=8), dict(warps_m=4, warps_n=2, m_tiles=4, n_tiles=8, stages=3),
       dict(warps_m=2, warps_n=4, m_tiles=4, n_tiles=4)]
SMALL = [dict(), dict(warps_m=2, warps_n=2, m_tiles=2, n_tiles=4, bk=64, stages=3),
         dict(warps_m=1, warps_n=2, m_tiles=4, n_tiles=4), dict(warps_m=2, warps_n=2, m_tiles=1, n_tiles=4),
         dict(warps_m=2, warps_n=2, m_tiles=2, n_tiles=2), dict(warps_m=1, warps_n=4, m_tiles=4, n_tiles=4)]
# wgmma (sm_90a): the rule's two tiles, 128 x 128 in 3 or 6 stages (3: two CTAs an SM), persistent CTAs (one or two an
# SM), and the rule's tile without the staged output
WGMMA = [dict(warps_m=8, warps_n=1, m_tiles=1, n_tiles=n, bk=64, stages=st, wgmma=True, persistent=p)
         for n, st, p in ((32, 4, 0), (16, 4, 0), (16, 3, 0), (16, 6, 0), (16, 4, 132), (16, 6, 132), (16, 3, 264))]
WGMMA += [{**WGMMA[0], "staged": False}]  # the output stored straight from the accumulators
# warp-specialised with a TMA producer (one tile a CTA): 128 x 256 / 128 x 128 / 128 x 64 tiles, stages as fit
TMA = [{**WGMMA[1], "n_tiles": nt, "stages": st, "tma": True} for nt, st in ((32, 4), (16, 4), (16, 6), (8, 8))]
VARIANTS = {"square": BIG + WGMMA + TMA, "gpt2 b32 mlp up": BIG + WGMMA + TMA, "gpt2 b32 attn proj": BIG + WGMMA + TMA,
            "bert b1": SMALL, "vit b1 mlp down": SMALL, "resnet50 b32 conv3x3 7x7": SMALL, "gpt2 b32 q.k^T": SMALL + WGMMA,
            "gpt2 b32 qkv": WGMMA + TMA, "gpt2 b32 mlp down": WGMMA + TMA, "resnet50 b32 conv3x3 28x28": WGMMA,
            # wgmma tiles of two warpgroups (128 x 256 / 128 / 64) and one (64 x 256 / 128 / 64)
            **{what: [{**WGMMA[1], "warps_m": w, "n_tiles": nt} for w in (8, 4) for nt in (32, 16, 8)] + TMA
               for *_, layout, what in SHAPES if layout == "conv"},
            # (the rule: column by column)
            "gpt2 b32 lm head": WGMMA + [{**WGMMA[0], "group_m": g} for g in (8, 16)] + [{**TMA[0], "group_m": 64}],
            # N = 64: the rule's 64 x 256 tiles compute 4x the columns there are; 64 x 64 tiles (not yet timed)
            "gpt2 b32 p.v": WGMMA + [{**WGMMA[1], "n_tiles": 8, "stages": st, "persistent": p} for st, p in ((4, 0), (6, 132))]}
VARIANTS_FP32 = {
    "square": [dict(n_tiles=4, stages=3), dict(n_tiles=4, stages=4), dict(m_tiles=2, n_tiles=8, stages=3),
               dict(warps_m=2, warps_n=4, n_tiles=4, stages=3)],
    "bert b1": [dict(m_tiles=1, n_tiles=4, stages=3), dict(m_tiles=2, n_tiles=4, stages=3), dict(m_tiles=1, n_tiles=2, stages=3)],
}
TOLERANCE = {"float16": 2e-3, "float32": 1e-4}  # fp16: output rounding (2^-11); fp32: 3xTF32 measured up to 3.4e-5


def fused_gemm(batch: tuple, m: int, n: int, k: int, layout: str, dtype: str):
    """The fused PrimFunc of out = (A @ B) in ``dtype`` with fp32 accumulation: for "nn" what tvmpipe's passes
    make of a Relax matmul; for "nt" (B stored [n, k], as tvmpipe wrote a conv's patches until 2026-12-07) written in TE;
    for "conv" the GEMM of ``gpu_conv2d`` over patches."""
    from tvm import relax, te, tirx

    from compiler import passes, schedules, targets
    from schedules import gpu_conv2d

    target = targets.resolve("cuda-sm90")
    if layout == "conv":
        side = math.isqrt(n)
        w = te.placeholder((m, k), dtype, "a")
        col = te.placeholder((*batch, k, gpu_conv2d._round_up(n)), dtype, "b")
        acc = gpu_conv2d._gemm(w, col, side, side, "float32")
        out = te.compute(acc.shape, lambda *i: acc(*i).astype(dtype))
        return te.create_prim_func([w, col, out]), target
    if layout == "nt":
        a = te.placeholder((*batch, m, k), dtype, "a")
        b = te.placeholder((*batch, n, k), dtype, "b")
        r = te.reduce_axis((0, k), "r")
        acc = te.compute((*batch, m, n), lambda *i: te.sum(a[(*i[:-1], r)].astype("float32")
                                                           * b[(*i[:-2], i[-1], r)].astype("float32"), axis=r))
        out = te.compute(acc.shape, lambda *i: acc(*i).astype(dtype))
        return te.create_prim_func([a, b, out]), target
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType((*batch, m, k), dtype))
    b = relax.Var("b", relax.TensorType((*batch, k, n), dtype))
    with bb.function("main", [a, b]):
        with bb.dataflow():
            gv = bb.emit_output(relax.op.astype(bb.emit(relax.op.matmul(a, b, out_dtype="float32")), dtype))
        bb.emit_func_output(gv)
    mod, _ = passes.optimize(bb.get(), target, legalize=schedules.legalizations())
    ((func,),) = [[f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]]
    return func, target


RUNS = ([("float16", s) for s in SHAPES] + [("float32", s) for s in SHAPES_FP32]
        + [(dt, (*c, "check")) for dt in ("float16", "float32") for c in CHECKS])


def runs(only: list[str] | None) -> list:
    """``RUNS`` whose name (``what``) contains one of ``only`` (all if None; the odd-shape checks are named "check")."""
    return [r for r in RUNS if only is None or any(text in r[1][-1] for text in only)]


def build(folder: Path, only: list[str] | None = None) -> None:
    """One CUDA module with every case's kernel (tvmpipe's: the rule; DLight's; tile variants; on sm_90a the mma.sync
    rule beside wgmma) -> ``folder``/kernels.so and its cases.json."""
    import dataclasses

    import tvm

    from compiler import cuda_binary, tuning
    from compiler.build import Built
    from schedules import gpu_matmul
    from schedules.common import has_wgmma

    t0 = time.perf_counter()
    cases, funcs = [], {}
    for dtype, (batch, m, n, k, layout, what) in runs(only):
        func, target = fused_gemm(batch, m, n, k, layout, dtype)
        spec, wgmma = gpu_matmul.match(func), has_wgmma(target.target)
        shape = {"dtype": dtype, "batch": list(batch), "m": m, "n": n, "k": k, "layout": layout, "what": what}
        kernels = [("tvmpipe", gpu_matmul.choose(spec, wgmma))]
        kernels += [("mma.sync rule", gpu_matmul.choose(spec))] if wgmma and dtype != "float32" else []
        if what != "check":
            mod, provenance, _ = tuning.apply(tvm.IRModule({"main": func}), target)
            kernels += [("dlight", (mod["main"], provenance["main"]))]
            kernels += [("variant", gpu_matmul.GemmConfig(**v))
                        for v in (VARIANTS if dtype == "float16" else VARIANTS_FP32).get(what, [])]
            if not kernels[0][1].wgmma:  # the rule's mma.sync tile storing straight from its accumulators
                kernels += [("variant", dataclasses.replace(kernels[0][1], staged=False))]
        for impl, how in kernels:
            name = f"{impl.split()[0].replace('.', '_')}_{len(cases)}"
            if impl == "dlight":
                kfunc, schedule = how
            else:
                kfunc, schedule = gpu_matmul.kernel(spec, how), how.name
            case = {**shape, "impl": impl, "name": name, "schedule": schedule}
            if impl == "variant":
                case["variant"] = dataclasses.asdict(how)
            cases.append(case)
            funcs[name] = kfunc.with_attr("global_symbol", name)
    with cuda_binary.exact_math():
        exe = tvm.compile(tvm.IRModule(funcs), target.target)
    folder.mkdir(parents=True, exist_ok=True)
    Built(exe, target).export(folder / "kernels.so")
    (folder / "cases.json").write_text(json.dumps(cases, indent=1))
    print(f"built {len(cases)} kernels -> {folder}/kernels.so in {time.perf_counter() - t0:.0f} s")


def operands(batch: tuple, m: int, n: int, k: int, layout: str, tdt):
    """(A, B as the kernel reads it, B as [.., k, n] for torch.matmul, the float64 reference, the output) of a case;
    a conv's padded pixel columns are zero, as its patches."""
    import torch

    conv = layout == "conv"
    a = torch.randn(*(() if conv else batch), m, k, dtype=tdt, device="cuda")
    b = torch.randn(*batch, *((k, n) if layout == "nn" else (n, k) if layout == "nt" else (k, -(-n // 8) * 8)),
                    dtype=tdt, device="cuda")
    if conv:  # (the pixels padded to 8 as gpu_conv2d._round_up does: not imported, the GPU side has TVM's runtime only)
        b[..., n:] = 0
    rhs = b.transpose(-1, -2) if layout == "nt" else b[..., :n]  # (cuBLAS reads a conv's pixels in place)
    ref = torch.matmul(a.double(), rhs.double())
    if conv:
        ref = ref.view(*batch, m, math.isqrt(n), math.isqrt(n))
    return a, b, rhs, ref, torch.empty(ref.shape, dtype=tdt, device="cuda")


def run(folder: Path, out: Path, baseline: Path | None = None, only: list[str] | None = None) -> None:
    """Check and time ``folder``'s kernels with cuBLAS beside them (GPU machine); ``baseline``: another build's rule
    kernels too ("tvmpipe-baseline")."""
    import torch
    import tvm
    import tvm_ffi

    from benchmarks.softmax import gpu_bench
    from compiler.runtime import load_cuda_runtime

    load_cuda_runtime()  # a runtime-only TVM does not load its CUDA backend by itself
    cases = json.loads((folder / "cases.json").read_text())
    lib = tvm.runtime.load_module(str(folder / "kernels.so"))
    if baseline:
        base_lib = tvm.runtime.load_module(str(baseline / "kernels.so"))
        cases += [{**c, "impl": "tvmpipe-baseline", "lib": base_lib}
                  for c in json.loads((baseline / "cases.json").read_text()) if c["impl"] == "tvmpipe"]
    device = gpu_slug()
    records = []
    torch.manual_seed(0)
    with tvm_ffi.use_torch_stream():
        for dtype, (batch, m, n, k, layout, what) in runs(only):
            tdt = getattr(torch, dtype)
            a, b, rhs, ref, y = operands(batch, m, n, k, layout, tdt)
            at, bt, yt = (tvm.runtime.from_dlpack(t) for t in (a, b, y))
            flops = 2 * m * n * k * math.prod(batch)
            reps = max(10, min(200, int(2e13 / flops)))
            timed = [(c["impl"], c["schedule"], lambda f=c.get("lib", lib)[c["name"]]: (f(at, bt, yt), y)[1])
                     for c in cases if (c["dtype"], tuple(c["batch"]), c["m"], c["n"], c["k"], c["layout"], c["what"])
                     == (dtype, batch, m, n, k, layout, what)]
            if what != "check":
                timed.append(("torch", f"torch.matmul (cuBLAS, allow_tf32={torch.backends.cuda.matmul.allow_tf32})",
                              lambda: torch.matmul(a, rhs).view(ref.shape)))
            for impl, schedule, fn in timed:
                y.fill_(float("nan"))
                try:
                    got = fn()
                except RuntimeError as e:  # a variant that cannot launch here (its shared memory, say)
                    print(f"{impl:>8} {dtype} {what:>18} {schedule}: not run: {str(e).splitlines()[-1]}", flush=True)
                    continue
                err = float(((got.double() - ref).abs().max() / ref.abs().max()).item())
                ms = gpu_bench(fn, reps) if what != "check" else None
                record = {"impl": impl, "dtype": dtype, "what": what, "batch": list(batch), "m": m, "n": n, "k": k, "layout": layout,
                          "schedule": schedule, "ms": ms, "tflops": flops / ms / 1e9 if ms else None,
                          "max_rel_err": err, "ok": err <= TOLERANCE[dtype], "device": device}
                records.append(record)
                timing = "" if ms is None else f"{ms:.4f} ms {record['tflops']:.0f} TFLOP/s "
                print(f"{impl:>8} {dtype} {what:>18} {batch} {m}x{n}x{k} {layout}: {timing}err {err:.1e} {schedule}", flush=True)
            del a, b, ref, y, timed
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"matmul-{device}.json"
    path.write_text(json.dumps(records, indent=1))
    print(f"wrote {path}; {sum(not r['ok'] for r in records)} numerics failures")


def table(path: Path) -> str:
    """Chosen kernel, DLight and cuBLAS per shape (TFLOP/s), the ratio to cuBLAS and tvmpipe's error (checked
    against ``TOLERANCE`` here, so a file from a run with another tolerance reads the same)."""
    records = json.loads(path.read_text())
    mma = any(r["impl"] == "mma.sync rule" for r in records)  # an sm_90a run: the rule's kernel without wgmma too
    rows = [f"| GEMM | dtype | batch x M x N x K | tvmpipe | {'mma.sync | ' if mma else ''}DLight | cuBLAS | "
            "tvmpipe / cuBLAS | tvmpipe max rel err |", "|---" * (9 if mma else 8) + "|"]
    for r in (r for r in records if r["impl"] == "tvmpipe" and r["ms"]):
        same = {x["impl"]: x for x in records if (x["what"], x["dtype"]) == (r["what"], r["dtype"]) and x["ms"]}
        shape = f"{'x'.join(map(str, r['batch'])) or 1} x {r['m']} x {r['n']} x {r['k']} ({r['layout']})"
        sync = f"{same['mma.sync rule']['tflops']:.0f}" if "mma.sync rule" in same else "(same)"
        rows.append(f"| {r['what']} | {r['dtype']} | {shape} | {r['tflops']:.0f} | {sync + ' | ' if mma else ''}"
                    f"{same['dlight']['tflops']:.0f} | {same['torch']['tflops']:.0f} | {r['tflops'] / same['torch']['tflops']:.2f} | "
                    f"{r['max_rel_err']:.1e}{'' if r['max_rel_err'] <= TOLERANCE[r['dtype']] else ' (over tolerance)'} |")
    checks = [r for r in records if r["what"] == "check"]
    bad = [r for r in checks if r["max_rel_err"] > TOLERANCE[r["dtype"]]]
    rows.append(f"\nOdd-shape checks: {len(checks) - len(bad)} of {len(checks)} within tolerance "
                f"(max rel err {max(r['max_rel_err'] for r in checks):.1e}).")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--build", action="store_true", help="compile the GEMM kernels here (needs TVM's compiler)")
    mode.add_argument("--run", action="store_true", help="check and time them on the GPU (TVM runtime + torch)")
    mode.add_argument("--table", type=Path, metavar="JSON", help="print a results file as a markdown table")
    p.add_argument("--dir", type=Path, default=BUILD, help="--build / --run: the kernels' folder")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results", help="--run: where the JSON goes")
    p.add_argument("--baseline", type=Path, metavar="DIR", help="--run: another build's rule kernels beside them")
    p.add_argument("--shapes", metavar="TEXT", nargs="+", help="--build / --run: only the shapes whose name contains a TEXT")
    args = p.parse_args(argv)
    if args.build:
        build(args.dir, args.shapes)
    elif args.run:
        run(args.dir, args.out, args.baseline, args.shapes)
    else:
        print(table(args.table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
