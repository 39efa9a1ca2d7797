"""Check that a cuda-sm90 package built on a machine without a GPU loads and runs on one with TVM's
runtime only, with no CUDA compiler involved, and matches onnxruntime, also recorded into one CUDA graph
(``Runner.capture``); and that a package planned for another
SM count (a target file saying ``"sms": 114``, an H100 PCIe's) warns at load and still computes right.

    python benchmarks/gpu_package_check.py --build            # here: build/gpu/demo-cuda-sm90.tvmpkg, softmax-114sm
    python benchmarks/gpu_package_check.py --run --out DIR    # GPU machine (runtime pack only)

``--run`` replaces TVM's load-time CUDA compile hook with one that fails, so a package that still held
CUDA source would fail to load: passing proves the package carries compiled GPU code.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
BUILD = REPO / "build" / "gpu"
PKG = BUILD / "demo-cuda-sm90.tvmpkg"
MODEL = REPO / "models" / "demo.onnx"
# A softmax of 8 rows of 256K, split over blocks that must all be resident, planned for 114 SMs
SM_PKG, SM_SHAPE, SM_PLANNED = BUILD / "softmax-114sm.tvmpkg", (8, 1 << 18), 114


def build() -> None:
    from onnx import TensorProto, helper, save

    from compiler.pipeline import compile_model

    manifest = compile_model(MODEL, "cuda-sm90", PKG, {"image": (2, 3, 32, 32)})
    print(f"built {PKG} ({PKG.stat().st_size} bytes): {manifest['gpu_code']}")
    target, model = BUILD / f"cuda-sm90-{SM_PLANNED}sm.json", BUILD / "softmax.onnx"
    target.write_text(json.dumps({**json.loads((REPO / "targets" / "cuda-sm90.json").read_text()), "sms": SM_PLANNED}))
    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, SM_SHAPE) for n in "xy")
    save(helper.make_model(helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=1)], "softmax", [x], [y]),
                           opset_imports=[helper.make_opsetid("", 17)]), model)
    manifest = compile_model(model, str(target), SM_PKG)
    print(f"built {SM_PKG} for {manifest['target']['summary']}")


def run(out: Path) -> None:
    import onnxruntime as ort
    import torch
    import tvm
    import tvm_ffi

    def no_compile(*_args):
        raise RuntimeError("the package asked TVM to compile CUDA source at load time")

    tvm_ffi.register_global_func("tvm_callback_cuda_compile", no_compile, override=True)

    from benchmarks.common import gpu_slug
    from compiler import load
    from compiler.compare import errors

    runner = load(str(PKG))
    rng = np.random.default_rng()
    results = []
    for trial in range(3):
        inputs = runner.random_inputs(seed=int(rng.integers(1 << 31)))
        ours = runner(**inputs)
        sess = ort.InferenceSession(str(MODEL), providers=["CPUExecutionProvider"])
        ref = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, inputs)))
        results.append(errors(ours, ref))
    timing = runner.time(runner.random_inputs(), repeat=200).summary()
    record = {
        "check": "cuda-sm90 package built without a GPU, loaded with the TVM runtime only",
        "device": torch.cuda.get_device_name(0),
        "driver_cuda": torch.version.cuda,
        "tvm": tvm.__version__,
        "tvm_runtime_only": bool(tvm.base._RUNTIME_ONLY),
        "python": platform.python_version(),
        "gpu_code": runner.manifest.get("gpu_code"),
        "max_rel_err_vs_onnxruntime": max(r["max_rel_err"] for r in results),
        "max_abs_err_vs_onnxruntime": max(r["max_abs_err"] for r in results),
        "correct": all(r["max_rel_err"] <= 1e-4 for r in results),
        "latency": timing,
        "sm_count": sm_count_check(load, rng, torch.cuda.get_device_properties(0).multi_processor_count),
        "cuda_graph": capture_check(runner, rng),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / f"package-check-{gpu_slug()}.json").write_text(json.dumps(record, indent=2))
    print(json.dumps(record, indent=2))


def capture_check(runner, rng: np.random.Generator) -> dict:
    """``Runner.capture`` on the demo package (all its kernels in one CUDA graph): the replayed outputs against the VM's
    on the inputs it was recorded with, on fresh inputs copied in, and the latency of each way."""
    first, fresh = (runner.random_inputs(seed=int(rng.integers(1 << 31))) for _ in range(2))
    graph = runner.capture(first)

    def exact(a: dict, b: dict) -> bool:
        return all(np.array_equal(a[n], b[n]) for n in b)
    return {"kernels": len(runner.manifest["kernels"]), "bit_exact_recorded_inputs": exact(graph(), runner(**first)),
            "bit_exact_fresh_inputs": exact(graph(**fresh), runner(**fresh)),
            "vm_median_ms": runner.time(fresh, repeat=200).summary()["median_ms"],
            "graph_median_ms": graph.time(repeat=200).summary()["median_ms"]}


def sm_count_check(load, rng: np.random.Generator, device_sms: int) -> dict:
    """The package planned for SM_PLANNED SMs: the warnings its load gives, and its error against float64."""
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        runner = load(str(SM_PKG))
    from benchmarks.softmax import reference

    x = rng.standard_normal(SM_SHAPE).astype(np.float32) * 4
    err = float(np.abs(runner(x=x)["y"] - reference(x, "softmax")).max())
    return {"planned_sms": SM_PLANNED, "device_sms": device_sms, "warnings": [str(w.message) for w in got],
            "max_abs_err_vs_float64": err, "correct": err <= 1e-6}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", action="store_true")
    ap.add_argument("--run", action="store_true")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    a = ap.parse_args()
    if a.build:
        build()
    if a.run:
        run(a.out)
