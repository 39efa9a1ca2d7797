"""A/B of the depthwise convs' small planes copied in groups (``cpu_depthwise.COPY_BYTES``) against the commit before
(71df764), on the cores this runs on (onnxruntime gets as many threads).

MobileNetV2's depthwise 3x3 layers over 28 x 28, 14 x 14 and 7 x 7 planes (+ bias + ReLU6, stride 1 and 2) and three
models with depthwise convs (the zoo's MobileNetV2 from ``build/zoo/``, MobileNetV3-Large and EfficientNet-B0 exported
from torchvision), each compiled by both checkouts and timed in 7 interleaved rounds (``benchmarks/cpu_ab.py``)::

    git worktree add /tmp/wt-head 71df764
    .venv/bin/python benchmarks/results/rerun/cpu-depthwise-groups/ab.py /tmp/wt-head OUT.json
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
LAYERS = {f"dw-{c}-{hw}-s{s}": (c, hw, s) for c, hw, s in [(192, 28, 1), (192, 28, 2), (576, 14, 1), (576, 14, 2), (960, 7, 1)]}


def depthwise(c: int, hw: int, stride: int, rng: np.random.Generator):
    """A depthwise 3x3 conv (padding 1) + bias + ReLU6, batch 1."""
    out = (hw - 1) // stride + 1
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["d"], group=c, strides=[stride] * 2, pads=[1] * 4),
             helper.make_node("Clip", ["d", "lo", "hi"], ["y"])]
    inits = {"w": rng.standard_normal((c, 1, 3, 3)).astype(np.float32), "b": rng.standard_normal(c).astype(np.float32),
             "lo": np.array(0, np.float32), "hi": np.array(6, np.float32)}
    return make_model(nodes, [("x", F, [1, c, hw, hw])], [("y", F, [1, c, out, out])], inits)


def main(old_root: Path, out: Path, work: Path = Path("/tmp/depthwise-groups-ab")) -> None:
    rng = np.random.default_rng(0)
    work.mkdir(exist_ok=True)
    models = {name: save(depthwise(*spec, rng), work / f"{name}.onnx") for name, spec in LAYERS.items()}
    models["mobilenet_v2"] = REPO / "build" / "zoo" / "mobilenet_v2-b1.onnx"
    models |= {name: torchvision_onnx(name, work / f"{name}.onnx") for name in ("mobilenet_v3_large", "efficientnet_b0")}
    compare(models, old_root, out, work)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
