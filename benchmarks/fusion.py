"""What operator fusion buys: the same three blocks compiled at three fusion levels, timed side by side.

Levels (``compiler.passes``): ``none`` (``--no-fusion``: one kernel per op, every intermediate through
memory), ``tvm`` (TVM's stock FuseOps/FuseTIR), ``tvmpipe`` (our graph passes + FuseOps: BN folding,
transpose cancellation, attention as one op). Blocks: a Conv-BN-act stack, a MobileNetV2 inverted
residual block, a transformer encoder block (``models/fusion_blocks.py``). For each: kernels launched per
inference, intermediate bytes kept inside fused kernels (and still in scratch), latency, error vs
onnxruntime. Latencies of the three levels are measured in interleaved rounds in one run.

    python benchmarks/fusion.py                             # CPU here -> benchmarks/results/fusion-cpu.json
    python benchmarks/fusion.py --build --target cuda-sm90  # compile the GPU packages into build/gpu/fusion/
    python3 benchmarks/fusion.py --run --dir build/gpu/fusion --out DIR  # on the GPU machine -> DIR/fusion-gpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "models")]

LEVELS = ("none", "tvm", "tvmpipe")


def blocks(gpu: bool) -> dict:
    """name -> ONNX model; GPU sizes are larger but keep the packages at a few MB."""
    import fusion_blocks as fb

    if gpu:
        return {
            "conv_bn_act": fb.conv_bn_act("Relu", ch=64, hw=56, depth=4, batch=8),
            "mobilenet_block": fb.mobilenet_block(ch=32, hw=56, batch=8),
            "encoder_block": fb.encoder_block(b=8, seq=256, h=4, d=32),
        }
    return {
        "conv_bn_act": fb.conv_bn_act("Relu", ch=16, hw=32, depth=3),
        "mobilenet_block": fb.mobilenet_block(ch=24, hw=28),
        "encoder_block": fb.encoder_block(b=1, seq=128, h=4, d=32),
    }


def inputs_for(manifest: dict, seed: int) -> dict[str, np.ndarray]:
    """Gaussian inputs; attention masks (inputs named mask) of ones with the last quarter padded out."""
    rng = np.random.default_rng(seed)
    out = {}
    for spec in manifest["inputs"]:
        if spec["name"].startswith("mask"):
            m = np.ones(spec["shape"], np.float32)
            m[..., -spec["shape"][-1] // 4:] = 0
            out[spec["name"]] = m
        else:
            out[spec["name"]] = rng.standard_normal(spec["shape"]).astype(np.float32)
    return out


def machine(gpu: bool) -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "load_average_at_start": os.getloadavg()}  # other processes may share this machine's cores
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        info["cpu"] = next(ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if ln.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        info["cpu"] = platform.processor()
    if gpu:
        import tvm

        from compiler.runtime import load_cuda_runtime

        load_cuda_runtime()  # a runtime-only TVM does not load its CUDA backend by itself
        info["gpu"] = tvm.cuda(0).device_name
        info["gpu_compute"] = tvm.cuda(0).compute_version
    return info


def compile_all(target: str, out_dir: Path) -> list[dict]:
    """Compile every block at every level; return the plan: per block, per level, kernel counts and bytes."""
    import onnx

    from compiler.pipeline import Options, compile_model
    from compiler.report import inspect_model

    out_dir.mkdir(parents=True, exist_ok=True)
    plan = []
    for name, model in blocks(target != "cpu").items():
        src = out_dir / f"{name}.onnx"
        onnx.save(model, src)
        entry: dict = {"name": name, "onnx": src.name, "levels": {}}
        for level in LEVELS:
            report = inspect_model(src, target, fusion=level)
            pkg = out_dir / f"{name}-{level}.tvmpkg"
            entry["inputs"] = compile_model(src, target, pkg, options=Options(fusion=level))["inputs"]
            entry["levels"][level] = {"package": pkg.name, **report["totals"]}
            print(f"built {pkg.name}: {report['totals']['kernels']} kernels", flush=True)
        plan.append(entry)
    return plan


def measure(plan: list[dict], pkg_dir: Path, rounds: int, repeat: int) -> list[dict]:
    """Time every level of every block in interleaved rounds; check each against onnxruntime."""
    from compiler.compare import OrtSession, errors
    from compiler.runtime import load

    results = []
    for entry in plan:
        runners = {lv: load(str(pkg_dir / entry["levels"][lv]["package"])) for lv in LEVELS}
        inputs = inputs_for(runners["none"].manifest, seed=len(results))
        ref = OrtSession(str(pkg_dir / entry["onnx"]))(inputs)
        times: dict[str, list[float]] = {lv: [] for lv in LEVELS}
        for _ in range(rounds):
            for lv in LEVELS:
                times[lv] += runners[lv].time(inputs, repeat=repeat, warmup=2).ms
        row = {"name": entry["name"], "inputs": entry["inputs"], "levels": {}}
        for lv in LEVELS:
            a = np.asarray(times[lv])
            row["levels"][lv] = {
                **entry["levels"][lv],
                "median_ms": float(np.median(a)), "p90_ms": float(np.percentile(a, 90)), "min_ms": float(a.min()),
                "runs": len(a), **errors(runners[lv](**inputs), ref),
            }
        for base in ("none", "tvm"):  # the minimum is the statistic least disturbed by other load on the machine
            lv = row["levels"]
            row[f"speedup_tvmpipe_vs_{base}"] = {
                stat: lv[base][f"{stat}_ms"] / lv["tvmpipe"][f"{stat}_ms"] for stat in ("median", "min")
            }
        results.append(row)
        print_row(row)
    return results


def _size(n: int) -> str:
    return f"{n / 2**20:.2f} MB" if n >= 2**20 else f"{n / 1024:.1f} KB"


def print_row(row: dict) -> None:
    shapes = ", ".join(f"{i['name']}{i['shape']}" for i in row["inputs"])
    print(f"\n{row['name']}  ({shapes})")
    print(f"  {'level':<8} {'kernels':>7} {'saved':>10} {'scratch':>10} {'median ms':>10} {'min ms':>9} {'p90 ms':>9} "
          f"{'rel err':>9}")
    for lv, r in row["levels"].items():
        print(f"  {lv:<8} {r['kernels']:>7} {_size(r['saved_bytes']):>10} {_size(r['scratch_bytes']):>10} "
              f"{r['median_ms']:>10.3f} {r['min_ms']:>9.3f} {r['p90_ms']:>9.3f} {r['max_rel_err']:>9.1e}")
    for base in ("none", "tvm"):
        up = row[f"speedup_tvmpipe_vs_{base}"]
        print(f"  tvmpipe vs {base}: {up['median']:.2f}x (median), {up['min']:.2f}x (min)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="cpu", help="cpu (default) or cuda-sm90 / cuda-sm80 with --build")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--build", action="store_true", help="only compile the packages into --dir")
    mode.add_argument("--run", action="store_true", help="only time the packages in --dir (needs TVM's runtime only)")
    p.add_argument("--dir", help="package folder (default: build/gpu/fusion for CUDA, build/fusion-cpu for cpu)")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results"), help="folder for the result JSON")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds over the three levels")
    p.add_argument("--repeat", type=int, default=20, help="timed runs per level per round")
    args = p.parse_args()

    pkg_dir = Path(args.dir) if args.dir else REPO / "build" / ("fusion-cpu" if args.target == "cpu" else "gpu/fusion")
    if not args.run:
        from compiler.targets import resolve

        plan = {"target": args.target, "target_summary": resolve(args.target).isa_summary(),
                "blocks": compile_all(args.target, pkg_dir)}
        (pkg_dir / "plan.json").write_text(json.dumps(plan, indent=1))
        if args.build:
            shown = pkg_dir.relative_to(REPO) if pkg_dir.is_relative_to(REPO) else pkg_dir
            print(f"wrote {shown}; time them with: python3 benchmarks/fusion.py --run --dir {shown} --out DIR")
            return 0
    plan = json.loads((pkg_dir / "plan.json").read_text())
    gpu = plan["target"] != "cpu"
    result = {
        "benchmark": "fusion", "target": plan["target"], "target_summary": plan["target_summary"],
        "machine": machine(gpu),
        "command": " ".join(["python", *sys.argv]), "rounds": args.rounds, "repeat": args.repeat,
        "levels": {"none": "no fusion: one kernel per op (--no-fusion)", "tvm": "TVM's FuseOps/FuseTIR only",
                   "tvmpipe": "tvmpipe graph passes + FuseOps/FuseTIR (default)"},
        "blocks": measure(plan["blocks"], pkg_dir, args.rounds, args.repeat),
    }
    result["machine"]["load_average_at_end"] = os.getloadavg()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"fusion-{'gpu' if gpu else 'cpu'}.json"
    (out / name).write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwrote {out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
