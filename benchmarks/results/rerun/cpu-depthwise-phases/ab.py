"""A/B of the CPU depthwise rule's phased copy (a6cfd57) against the rule before it (0cd9438), one core.

MobileNetV2's four stride-2 depthwise layers (+ bias + ReLU6) and one stride-1 layer as single-conv ONNX models,
and the whole model (``build/zoo/mobilenet_v2-b1.onnx`` from ``benchmarks/models.py``), compiled by both checkouts
for ``cpu``, checked against onnxruntime and timed in 7 interleaved rounds (new, old, onnxruntime; 30 calls each)::

    git worktree add /tmp/wt-old 0cd9438
    taskset -c 0 .venv/bin/python benchmarks/results/rerun/cpu-depthwise-phases/ab.py /tmp/wt-old OUT.json
"""

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))
from benchmarks.cpu_ab import compare  # noqa: E402
from tests.helpers import make_model, save  # noqa: E402

LAYERS = {"dw96-112-s2": (96, 112, 2), "dw144-56-s2": (144, 56, 2), "dw192-28-s2": (192, 28, 2),
          "dw576-14-s2": (576, 14, 2), "dw144-56-s1": (144, 56, 1)}


def depthwise(c: int, hw: int, stride: int, rng: np.random.Generator) -> onnx.ModelProto:
    out = (hw - 1) // stride + 1
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["d"], group=c, strides=[stride] * 2, pads=[1] * 4),
             helper.make_node("Clip", ["d", "lo", "hi"], ["y"])]
    inits = {"w": rng.standard_normal((c, 1, 3, 3)).astype(np.float32), "b": rng.standard_normal(c).astype(np.float32),
             "lo": np.array(0, np.float32), "hi": np.array(6, np.float32)}
    return make_model(nodes, [("x", TensorProto.FLOAT, [1, c, hw, hw])], [("y", TensorProto.FLOAT, [1, c, out, out])], inits)


def main(old_root: Path, out: Path, work: Path = Path("/tmp/depthwise-ab")) -> None:
    rng = np.random.default_rng(0)
    work.mkdir(exist_ok=True)
    models = {name: save(depthwise(*shape, rng), work / f"{name}.onnx") for name, shape in LAYERS.items()}
    models["mobilenet_v2"] = REPO / "build" / "zoo" / "mobilenet_v2-b1.onnx"
    compare(models, old_root, out, work)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
