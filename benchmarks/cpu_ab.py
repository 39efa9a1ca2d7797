"""A/B of a CPU schedule change: ONNX models compiled for ``cpu`` by this checkout ("new") and another ("old", a
``git worktree`` of the commit before), checked against onnxruntime and timed side by side in interleaved rounds
(new, old, onnxruntime on as many threads as the cores this process may run on). Run it on the cores it should
measure, e.g. one::

    git worktree add /tmp/wt-old HEAD~1
    taskset -c 0 .venv/bin/python benchmarks/cpu_ab.py /tmp/wt-old OUT.json build/zoo/resnet50-b1.onnx ...

Rule-specific layers (single-op models such as ``pointwise``) are made by the scripts under
``results/rerun/*/ab.py``, which call ``compare``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.common import compile_with, interleaved  # noqa: E402
from compiler.compare import OrtSession  # noqa: E402
from compiler.runtime import load  # noqa: E402
from tests.helpers import make_model, rel_err  # noqa: E402


def pointwise(ic: int, oc: int, hw: int, rng: np.random.Generator) -> onnx.ModelProto:
    """A 1x1 conv ``ic`` -> ``oc`` channels over ``hw`` x ``hw`` pixels, + bias + ReLU (batch 1)."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["d"]), helper.make_node("Relu", ["d"], ["y"])]
    inits = {"w": rng.standard_normal((oc, ic, 1, 1)).astype(np.float32), "b": rng.standard_normal(oc).astype(np.float32)}
    f = TensorProto.FLOAT
    return make_model(nodes, [("x", f, [1, ic, hw, hw])], [("y", f, [1, oc, hw, hw])], inits)


def compare(models: dict[str, Path], old_root: Path, out: Path, work: Path, rounds: int = 7, calls: int = 30) -> list[dict]:
    """Per model: both packages' relative error against onnxruntime and the median ms of each over ``rounds``
    interleaved rounds of ``calls`` calls; printed as it goes and written to ``out`` (JSON)."""
    rng = np.random.default_rng(0)
    work.mkdir(parents=True, exist_ok=True)
    records = []
    for name, path in models.items():
        for tag, root in (("new", REPO), ("old", old_root)):
            compile_with(root, path, work / f"{name}-{tag}.tvmpkg")
        new, old, ort = load(work / f"{name}-new.tvmpkg"), load(work / f"{name}-old.tvmpkg"), OrtSession(str(path), len(os.sched_getaffinity(0)))
        graph = onnx.load(path, load_external_data=False).graph
        x = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in graph.input}
        y = graph.output[0].name
        ref = ort(x)[y]
        err = {tag: rel_err(r(**x)[y], ref) for tag, r in (("new", new), ("old", old))}
        ms = interleaved({"new": lambda: new.time(x, repeat=calls, warmup=3).ms,
                          "old": lambda: old.time(x, repeat=calls, warmup=3).ms,
                          "onnxruntime": lambda: ort.time(x, repeat=calls, warmup=3)}, rounds, pause=lambda: None)
        med = {k: float(np.median(v)) for k, v in ms.items()}
        rec = {"case": name, "ms": med, "new_vs_old": med["old"] / med["new"], "new_vs_ort": med["onnxruntime"] / med["new"],
               "old_vs_ort": med["onnxruntime"] / med["old"], "rel_err": err}
        print(f"{name:16s} new {med['new']:.4f} ms  old {med['old']:.4f}  onnxruntime {med['onnxruntime']:.4f}  "
              f"new/old {rec['new_vs_old']:.2f}x  vs onnxruntime {rec['new_vs_ort']:.2f}x (old {rec['old_vs_ort']:.2f}x)",
              flush=True)
        records.append(rec)
        out.write_text(json.dumps(records, indent=1))  # after each model: a long run keeps what it measured
    return records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old_root", type=Path, help="the other checkout (a git worktree)")
    ap.add_argument("out", type=Path, help="JSON records")
    ap.add_argument("models", type=Path, nargs="+", help="ONNX files (float32 inputs of static shape)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--work", type=Path, default=Path("/tmp/cpu-ab"))
    args = ap.parse_args()
    compare({m.stem: m for m in args.models}, args.old_root, args.out, args.work, args.rounds)


if __name__ == "__main__":
    main()
