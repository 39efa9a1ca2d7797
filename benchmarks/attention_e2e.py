"""End to end: a BERT-style encoder and a GPT-style causal prefill compiled with and without the fused attention
kernel, checked against onnxruntime and timed side by side. Variants:

* ``fused``: tvmpipe's default (the recognised attention is one hand-written kernel);
* ``tvm-attention``: the same, except the attention op is lowered by TVM's own legalisation (what tvmpipe
  would give without the fused kernel: every other kernel keeps its custom schedule);
* ``no-custom``: ``--no-custom-schedules``: TVM's default lowering and schedules for every kernel.

    python benchmarks/attention_e2e.py                   # CPU here -> benchmarks/results/attention-e2e-cpu.json
    python benchmarks/attention_e2e.py --build           # GPU packages (fp16, cuda-sm90) -> build/gpu/attention-e2e/
    python3 benchmarks/attention_e2e.py --run --out DIR  # GPU machine (TVM runtime) -> DIR/attention-e2e-gpu.json

Models (``models/fusion_blocks.encoder_block``, attention as exporters write it): "bert" = HF BERT's
attention export with a ``[batch, seq]`` padding mask input (the last quarter of the keys padded out);
"gpt" = ``F.scaled_dot_product_attention(is_causal=True)`` through the dynamo exporter (Trilu/Where causal
mask); pre-norm blocks, hidden 256 = 4 heads x 64, erf GELU MLP, seeded random weights. CPU: float32,
batch 1, 4 layers, MLP 4x. GPU: float16 (the tensor-core kernel; the ONNX model is what ``model.half()``
exports), 2 layers, MLP 2x, batch 8 (bert) / 4 (gpt), so the four packages stay at ~8 MB together; its
reference is onnxruntime on the float32 twin with the same (float16-rounded) weights and inputs.
Latencies of the variants (and of onnxruntime on the CPU, for scale) are measured in interleaved rounds.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import sys
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "models")]
from benchmarks.common import interleaved, settle  # noqa: E402

BUILD = REPO / "build" / "gpu" / "attention-e2e"
VARIANTS = {"fused": "tvmpipe default: attention is one hand-written kernel",
            "tvm-attention": "tvmpipe default except the attention op, lowered by TVM's legalisation",
            "no-custom": "--no-custom-schedules: TVM's default lowering and schedules for every kernel"}
HEADS, HEAD_DIM = 4, 64
CONFIGS = {  # per device: dtype, layers, MLP ratio, per model (layout, batch, seq)
    "cpu": ("float32", 4, 4, {"bert": ("bert", 1, 128), "gpt": ("sdpa_causal", 1, 256)}),
    "gpu": ("float16", 2, 2, {"bert": ("bert", 8, 128), "gpt": ("sdpa_causal", 4, 256)}),
}
TOL = {"float32": 1e-3, "float16": 2e-2}  # normwise relative error vs onnxruntime


def models(device: str) -> dict:
    """name -> (ONNX model as run, float32 reference model): the same model on the CPU; on the GPU the float16
    export and its float32 twin. Both are rebuilt from seeded weights, so the GPU machine need not get them."""
    import fusion_blocks as fb

    dtype, layers, mlp, shapes = CONFIGS[device]
    out = {}
    for name, (layout, batch, seq) in shapes.items():
        model = fb.encoder_block(b=batch, seq=seq, h=HEADS, d=HEAD_DIM, layout=layout, layers=layers, mlp=mlp)
        out[name] = half(model) if dtype == "float16" else (model, model)
    return out


def half(model):
    """(the float16 model ``model.half()`` exports, its float32 twin with the same float16-rounded weights)."""
    import onnx
    from onnx import TensorProto, numpy_helper

    m16, m32 = copy.deepcopy(model), copy.deepcopy(model)
    for i16, i32 in zip(m16.graph.initializer, m32.graph.initializer):
        if i16.data_type == TensorProto.FLOAT:
            w = numpy_helper.to_array(i16).astype(np.float16)
            i16.CopyFrom(numpy_helper.from_array(w, i16.name))
            i32.CopyFrom(numpy_helper.from_array(w.astype(np.float32), i32.name))
    for v in [*m16.graph.input, *m16.graph.output]:
        if v.type.tensor_type.elem_type == TensorProto.FLOAT:
            v.type.tensor_type.elem_type = TensorProto.FLOAT16
    del m16.graph.value_info[:]
    m16 = onnx.shape_inference.infer_shapes(m16)
    onnx.checker.check_model(m16)
    return m16, m32


def inputs_for(manifest: dict, seed: int) -> dict[str, np.ndarray]:
    """Gaussian activations; the padding mask keeps the first three quarters of the keys of each sequence."""
    rng = np.random.default_rng(seed)
    out = {}
    for spec in manifest["inputs"]:
        shape, dt = spec["shape"], np.dtype(spec["dtype"])
        if spec["name"] == "mask":
            out["mask"] = (np.arange(shape[-1]) < shape[-1] * 3 // 4).astype(dt) * np.ones(shape, dt)
        else:
            out[spec["name"]] = rng.standard_normal(shape).astype(dt)
    return out


@contextmanager
def tvm_attention():
    """Leave the attention op to TVM's legalisation: our custom legalisations without the attention entries.
    (A benchmark-only switch: the CLI offers the fused kernel with every other custom schedule, or none.)"""
    from schedules import LEGALIZE

    saved = {op: LEGALIZE.pop(op) for op in ("relax.nn.attention", "relax.nn.attention_bias")}
    try:
        yield
    finally:
        LEGALIZE.update(saved)


def build(device: str, out_dir: Path) -> list[dict]:
    """Compile both variants of both models; the plan records shapes and each package's attention kernels."""
    import onnx

    from compiler.pipeline import Options, compile_model

    target = "cpu" if device == "cpu" else "cuda-sm90"
    out_dir.mkdir(parents=True, exist_ok=True)
    plan = []
    for name, (model, _) in models(device).items():
        src = out_dir / f"{name}.onnx"
        onnx.save(model, src)
        entry = {"name": name, "variants": {}}
        for variant in VARIANTS:
            pkg = out_dir / f"{name}-{variant}.tvmpkg"
            with tvm_attention() if variant == "tvm-attention" else nullcontext():
                manifest = compile_model(src, target, pkg, options=Options(custom_schedules=variant != "no-custom"))
            attention = {k: v for k, v in manifest["kernels"].items() if "attention" in k}
            entry["inputs"] = manifest["inputs"]
            entry["variants"][variant] = {"package": pkg.name, "kernels": len(manifest["kernels"]),
                                          "attention_kernels": attention, "bytes": pkg.stat().st_size}
            print(f"built {pkg.name} ({pkg.stat().st_size / 2**20:.1f} MB): {len(manifest['kernels'])} kernels, "
                  f"attention {attention}", flush=True)
        src.unlink()  # rebuilt from the seed where it is needed (the float32 reference, in measure())
        plan.append(entry)
    return plan


def reference(model, path: Path, inputs: dict[str, np.ndarray]) -> tuple:
    """onnxruntime on ``model``, the float32 twin (saved at ``path``): its session, the inputs it takes (float32) and
    its outputs, against which every variant is checked."""
    import onnx

    from compiler.compare import OrtSession

    onnx.save(model, path)
    ort = OrtSession(str(path))
    ort_inputs = {k: v.astype(np.float32) for k, v in inputs.items()}
    return ort, ort_inputs, ort(ort_inputs)


def check(device: str, pkg_dir: Path) -> None:
    """Each model's fused package in ``pkg_dir`` (its plan.json) against onnxruntime, untimed: the rerun folders'
    checks of the kernels other shapes take."""
    from compiler.compare import errors
    from compiler.runtime import load

    refs = models(device)
    for i, entry in enumerate(json.loads((pkg_dir / "plan.json").read_text())):
        fused = entry["variants"]["fused"]
        runner = load(str(pkg_dir / fused["package"]))
        inputs = inputs_for(runner.manifest, seed=i)
        ref = reference(refs[entry["name"]][1], pkg_dir / f"{entry['name']}-reference.onnx", inputs)[2]
        err = errors(runner(**inputs), ref)
        print(entry["name"], fused["attention_kernels"], err, "correct", err["max_rel_err"] <= TOL[CONFIGS[device][0]],
              flush=True)


def measure(device: str, plan: list[dict], pkg_dir: Path, rounds: int, repeat: int) -> list[dict]:
    """Check every package against onnxruntime, then time the variants (and onnxruntime) in interleaved rounds."""
    from compiler.compare import errors
    from compiler.runtime import load

    dtype = CONFIGS[device][0]
    refs = models(device)
    results = []
    for entry in plan:
        runners = {v: load(str(pkg_dir / entry["variants"][v]["package"])) for v in VARIANTS}
        inputs = inputs_for(runners["fused"].manifest, seed=len(results))
        ort, ort_inputs, ref = reference(refs[entry["name"]][1], pkg_dir / f"{entry['name']}-reference.onnx", inputs)
        turns = {v: lambda r=runners[v]: r.time(inputs, repeat=repeat, warmup=2).ms for v in VARIANTS}
        turns["onnxruntime-cpu"] = lambda: ort.time(ort_inputs, repeat=repeat, warmup=2)
        # (on the CPU the previous one's thread pool stops spinning first)
        times = interleaved(turns, rounds, pause=settle if device == "cpu" else lambda: None)
        row = {"name": entry["name"], "dtype": dtype, "inputs": entry["inputs"], "variants": {}}
        for v in (*VARIANTS, "onnxruntime-cpu"):
            a = np.asarray(times[v])
            stats = {"median_ms": float(np.median(a)), "min_ms": float(a.min()), "p90_ms": float(np.percentile(a, 90)),
                     "runs": len(a)}
            if v in VARIANTS:
                err = errors(runners[v](**inputs), ref)
                stats.update(entry["variants"][v], **err, correct=err["max_rel_err"] <= TOL[dtype])
            row["variants"][v] = stats
        lv = row["variants"]
        row["speedup_fused"] = {base: {s: lv[base][f"{s}_ms"] / lv["fused"][f"{s}_ms"] for s in ("median", "min")}
                                for base in ("tvm-attention", "no-custom", "onnxruntime-cpu")}
        results.append(row)
        print_row(row)
    return results


def print_row(row: dict) -> None:
    shapes = ", ".join(f"{i['name']}{i['shape']}" for i in row["inputs"])
    print(f"\n{row['name']} ({row['dtype']}; {shapes})")
    for v, r in row["variants"].items():
        extra = f"{r['kernels']:4} kernels  rel err {r['max_rel_err']:.1e}" if v in VARIANTS else ""
        print(f"  {v:15} median {r['median_ms']:8.3f} ms  min {r['min_ms']:8.3f} ms  {extra}")
    for base, up in row["speedup_fused"].items():
        print(f"  fused vs {base}: {up['median']:.2f}x (median), {up['min']:.2f}x (min)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--build", action="store_true", help="compile the GPU packages (here, with the TVM compiler)")
    mode.add_argument("--run", action="store_true", help="check and time the GPU packages (GPU machine, TVM runtime)")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results"), help="folder for the result JSON")
    p.add_argument("--rounds", type=int, help="interleaved rounds over the variants (default: 3 on the CPU, 5 on the GPU)")
    p.add_argument("--repeat", type=int, help="timed runs per variant per round (default: 5 on the CPU, 20 on the GPU)")
    args = p.parse_args()

    device = "gpu" if args.build or args.run else "cpu"
    args.rounds = args.rounds or (5 if device == "gpu" else 3)  # the CPU's no-custom variant takes ~1 s a run
    args.repeat = args.repeat or (20 if device == "gpu" else 5)
    pkg_dir = BUILD if device == "gpu" else REPO / "build" / "attention-e2e-cpu"
    if not args.run:
        (pkg_dir / "plan.json").parent.mkdir(parents=True, exist_ok=True)
        (pkg_dir / "plan.json").write_text(json.dumps(build(device, pkg_dir), indent=1))
        if args.build:
            print(f"wrote {pkg_dir.relative_to(REPO)}; on the GPU: python3 benchmarks/attention_e2e.py --run --out DIR")
            return 0
    if device == "gpu":
        from compiler.runtime import load_cuda_runtime

        load_cuda_runtime()  # a runtime-only TVM does not load its CUDA backend by itself
    result = {
        "benchmark": "attention-e2e", "device": device, "variants": VARIANTS,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_average_at_start": os.getloadavg()},
        "command": " ".join(["python", *sys.argv]), "rounds": args.rounds, "repeat": args.repeat,
        "models": measure(device, json.loads((pkg_dir / "plan.json").read_text()), pkg_dir, args.rounds, args.repeat),
    }
    result["machine"]["load_average_at_end"] = os.getloadavg()
    if device == "gpu":
        import tvm

        result["machine"]["gpu"] = tvm.cuda(0).device_name
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"attention-e2e-{device}.json"
    (out / name).write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwrote {out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
