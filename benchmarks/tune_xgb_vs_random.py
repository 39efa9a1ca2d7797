"""XGBoost vs random cost model: best latency against trials, same budget, same workloads, same seeds.

    python benchmarks/tune_xgb_vs_random.py --trials 96 --seeds 1 2

Two single-kernel workloads (a dense layer and a 3x3 convolution, as ONNX models), each tuned by
``tuning_job.tune`` with ``--cost-model xgb`` and ``random`` (tvmpipe's settings: no XGBoost warm-up,
budget / 4 per batch). The random model still runs MetaSchedule's evolutionary search, only with random scores,
so the difference is what the XGBoost model contributes. Writes benchmarks/results/tuning-xgb-vs-random-TARGET.json
and .png.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
WORK = REPO / "build" / "xgb-vs-random"


def workloads() -> dict[str, onnx.ModelProto]:
    """name -> single-kernel model (random weights: tuning does not depend on their values)."""
    rng = np.random.default_rng(0)

    def model(name: str, node: onnx.NodeProto, x: list[int], y: list[int], w: np.ndarray) -> onnx.ModelProto:
        graph = helper.make_graph([node], name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x)],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, y)],
                                  [numpy_helper.from_array(w.astype(np.float32), "w")])
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        return m

    return {
        "dense 128x512 @ 512x512": model("dense", helper.make_node("MatMul", ["x", "w"], ["y"]),
                                         [128, 512], [128, 512], rng.standard_normal((512, 512))),
        "conv2d 1x64x28x28, 64 3x3": model("conv", helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
                                          [1, 64, 28, 28], [1, 64, 28, 28], rng.standard_normal((64, 64, 3, 3))),
    }


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(result["workloads"]), figsize=(11, 4.2))
    for ax, (name, runs) in zip(axes, result["workloads"].items()):
        for run in runs:
            xs, ys = zip(*run["curve_us"], (result["trials"], run["best_us"]))
            ax.step(xs, ys, where="post", color="C0" if run["cost_model"] == "xgb" else "C1",
                    alpha=0.9, label=f"{run['cost_model']} (seed {run['seed']})")
        ax.set_title(name)
        ax.set_xlabel("trials")
        ax.set_ylabel("best latency (us)")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"MetaSchedule on {result['target']['summary']}: XGBoost vs random cost model, {result['trials']} trials")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="cpu")
    ap.add_argument("--trials", type=int, default=96)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1])
    args = ap.parse_args()

    from compiler import pipeline, tuning_job

    result: dict = {"benchmark": "best latency vs trials, XGBoost vs random cost model",
                    "command": "python benchmarks/tune_xgb_vs_random.py " + " ".join(sys.argv[1:]),
                    "trials": args.trials, "host": {"processor": platform.processor(), "machine": platform.machine()},
                    "workloads": {}}
    for name, m in workloads().items():
        WORK.mkdir(parents=True, exist_ok=True)
        path = WORK / f"{m.graph.name}.onnx"
        onnx.save(m, path)
        prep = pipeline.prepare(path, args.target)
        info = prep.target
        result["target"] = {"name": info.name, "summary": info.isa_summary(), "spec": info.spec}
        runs = []
        for seed in args.seeds:
            for cost_model in tuning_job.COST_MODELS:
                log = WORK / f"{m.graph.name}-{cost_model}-{seed}"
                shutil.rmtree(log, ignore_errors=True)
                t0 = time.time()
                report = tuning_job.tune(prep, trials=args.trials, log_dir=log, cost_model=cost_model, seed=seed)
                (task,) = report["tasks"]
                runs.append({"cost_model": cost_model, "seed": seed, "best_us": task["best_us"],
                             "gflops": task["gflops"], "errors": task["errors"], "wall_s": round(time.time() - t0, 1),
                             "curve_us": task["curve_us"]})
        result["workloads"][name] = runs
    out = REPO / "benchmarks" / "results" / f"tuning-xgb-vs-random-{args.target}"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, out.with_suffix(".png"))
    for name, runs in result["workloads"].items():
        for run in runs:
            print(f"{name:<28} {run['cost_model']:<7} seed {run['seed']}: best {run['best_us']:.1f} us "
                  f"({run['gflops']:.1f} GFLOPS) in {run['wall_s']:.0f} s")
    print(f"wrote {out.with_suffix('.json')} and .png")


if __name__ == "__main__":
    main()
