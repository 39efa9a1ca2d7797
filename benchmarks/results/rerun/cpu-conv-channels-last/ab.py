"""A/B of the CPU conv's channels-last input with 14-column tiles and of the pool rule against the commit before
(77c2dd9), on the cores this runs on (onnxruntime gets as many threads).

Layers (ResNet-50's 3x3 conv over 28 x 28, its strided 1x1, its max pool; DenseNet-121's 2x2 average pool) and four
CNNs (the zoo's ResNet-50 and MobileNetV2 from ``build/zoo/``, DenseNet-121 and GoogLeNet exported from
torchvision), each compiled by both checkouts and timed in 7 interleaved rounds (``benchmarks/cpu_ab.py``)::

    git worktree add /tmp/wt-old 77c2dd9
    taskset -c 0 .venv/bin/python benchmarks/results/rerun/cpu-conv-channels-last/ab.py /tmp/wt-old OUT.json
"""

import sys
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))
from benchmarks.common import torchvision_onnx  # noqa: E402
from benchmarks.cpu_ab import compare  # noqa: E402
from tests.helpers import make_model, save  # noqa: E402

F = TensorProto.FLOAT
# name: (op, channels in, channels out, input side, kernel, stride, padding)
LAYERS = {"conv3x3-128-28": ("Conv", 128, 128, 28, 3, 1, 1), "conv1x1-256-512-s2": ("Conv", 256, 512, 56, 1, 2, 0),
          "maxpool-64-112": ("MaxPool", 64, 64, 112, 3, 2, 1), "avgpool-128-56": ("AveragePool", 128, 128, 56, 2, 2, 0)}


def layer(op: str, ic: int, oc: int, hw: int, k: int, stride: int, pad: int, rng: np.random.Generator):
    """One conv (+ bias + ReLU) or pool, batch 1."""
    out = (hw + 2 * pad - k) // stride + 1
    attrs = {"strides": [stride] * 2, "pads": [pad] * 4}
    if op == "Conv":
        nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs), helper.make_node("Relu", ["c"], ["y"])]
        inits = {"w": (rng.standard_normal((oc, ic, k, k)) * 0.05).astype(np.float32),
                 "b": rng.standard_normal(oc).astype(np.float32)}
    else:
        nodes, inits = [helper.make_node(op, ["x"], ["y"], kernel_shape=[k, k], **attrs)], {}
    return make_model(nodes, [("x", F, [1, ic, hw, hw])], [("y", F, [1, oc, out, out])], inits)


def main(old_root: Path, out: Path, work: Path = Path("/tmp/conv-channels-last-ab")) -> None:
    rng = np.random.default_rng(0)
    work.mkdir(exist_ok=True)
    models = {name: save(layer(*spec, rng), work / f"{name}.onnx") for name, spec in LAYERS.items()}
    models |= {name: REPO / "build" / "zoo" / f"{name}-b1.onnx" for name in ("resnet50", "mobilenet_v2")}
    models |= {name: torchvision_onnx(name, work / f"{name}.onnx") for name in ("densenet121", "googlenet")}
    compare(models, old_root, out, work)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
