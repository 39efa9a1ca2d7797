"""The RMSNorm plug-in example on a GPU: build here, run on the GPU machine.

    python3 examples/plugins/run_gpu.py --build               # here: two cuda-sm90 packages in build/gpu/plugins/
    python3 examples/plugins/run_gpu.py --run --out DIR       # GPU machine (TVM runtime only): DIR/plugins_gpu.json

The two packages differ only in who schedules the plug-in kernel: the plug-in's own CUDA schedule
("plugin") or DLight (``--no-custom-schedules``, "dlight"). ``--run`` checks both against NumPy float64
and times, side by side, the whole model (``Runner.time``) and the plug-in kernel alone (TVM's
time_evaluator on ``plugin_RMSNorm``, which synchronises the device).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path[:0] = [str(REPO), str(HERE)]

import make_model  # noqa: E402

OUT_DIR = REPO / "build" / "gpu" / "plugins"
SHAPE = (16, 256, make_model.IN)  # 4096 rows of width 200
VARIANTS = {"plugin": [], "dlight": ["--no-custom-schedules"]}
KERNEL = "plugin_RMSNorm"


def build() -> None:
    from compiler.cli import main

    for name, flags in VARIANTS.items():
        args = ["compile", str(make_model.MODEL), "--target", "cuda-sm90", "--plugin", str(HERE / "rmsnorm.py"),
                "--input-shape", "x:" + "x".join(map(str, SHAPE)), "-o", str(OUT_DIR / f"{name}.tvmpkg"), *flags]
        if main(args) != 0:
            raise SystemExit(f"build of {name} failed")


def run(out: Path) -> int:
    import onnx
    import tvm

    from compiler import load, package
    from compiler.runtime import load_cuda_runtime

    load_cuda_runtime()  # a runtime-only TVM does not load its CUDA backend by itself

    model = onnx.load(make_model.MODEL)
    x = np.random.default_rng().standard_normal(SHAPE).astype(np.float32)
    ref = make_model.reference(model, x)
    dev = tvm.cuda(0)
    result: dict = {"device": dev.device_name, "input_shape": list(SHAPE), "variants": {}}
    for name in VARIANTS:
        path = OUT_DIR / f"{name}.tvmpkg"
        runner = load(str(path))
        y = runner(x=x)["y"]
        err = float(np.abs(y - ref).max() / np.abs(ref).max())
        model_ms = runner.time({"x": x}, repeat=200, warmup=20).summary()["median_ms"]
        with tempfile.TemporaryDirectory() as tmp:  # the plug-in kernel alone, on the same input shapes
            lib = tvm.runtime.load_module(str(package.extract_library(path, tmp)))
        host = lib.imports[0]
        h = tvm.runtime.tensor(ref.astype(np.float32), dev)  # any [16, 256, 200] float32 array will do
        scale = tvm.runtime.tensor(np.ones(make_model.HIDDEN, np.float32), dev)
        o = tvm.runtime.tensor(np.empty(h.shape, np.float32), dev)
        timer = host.time_evaluator(KERNEL, dev, number=50, repeat=20)
        kernel_ms = float(np.median(timer(h, scale, o).results) * 1e3)
        result["variants"][name] = {
            "kernel_provenance": runner.manifest["kernels"][KERNEL], "max_rel_err_vs_numpy_f64": err,
            "model_median_ms": model_ms, "kernel_median_ms": kernel_ms, "ok": err <= 1e-5,
        }
        print(f"{name:7s} {runner.manifest['kernels'][KERNEL]:20s} rel err {err:.2e}  model {model_ms:.4f} ms  "
              f"{KERNEL} {kernel_ms * 1e3:.2f} us")
    v = result["variants"]
    result["kernel_speedup_plugin_vs_dlight"] = v["dlight"]["kernel_median_ms"] / v["plugin"]["kernel_median_ms"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "plugins_gpu.json").write_text(json.dumps(result, indent=2))
    print(f"plug-in kernel {result['kernel_speedup_plugin_vs_dlight']:.2f}x DLight's; wrote {out / 'plugins_gpu.json'}")
    return 0 if all(r["ok"] for r in v.values()) else 1


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", action="store_true", help="compile the packages (needs the TVM compiler)")
    p.add_argument("--run", action="store_true", help="run and time them (needs a CUDA GPU)")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    a = p.parse_args()
    if not (a.build or a.run):
        p.error("give --build and/or --run")
    if a.build:
        build()
    sys.exit(run(a.out) if a.run else 0)
