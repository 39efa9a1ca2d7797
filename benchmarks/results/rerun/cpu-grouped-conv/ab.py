"""CPU A/B of the grouped-conv and sigmoid changes (913116d, 8389427) against main before them (533a350): RegNetY-400MF's
grouped 3x3 convs (groups of 8; 3 x 3, padded, + bias + ReLU) and a ResNeXt-like group of 4 as single-conv models, then
torchvision's RegNetY-400MF, EfficientNet-B0 and ResNeXt50-32x4d at 224 x 224 (seeded random weights, exported as
``benchmarks/models.py`` does), each timed by ``benchmarks/cpu_ab.py`` in interleaved rounds with onnxruntime.

    git archive 533a350 compiler schedules targets tuning_logs pyproject.toml | tar -x -C build/old9
    .venv/bin/python benchmarks/results/rerun/cpu-grouped-conv/ab.py build/old9 OUT_DIR
"""

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))
from benchmarks.common import torchvision_onnx  # noqa: E402

LAYERS = [(48, 56, 2, 8), (104, 28, 1, 8), (208, 14, 1, 8), (440, 7, 1, 8), (128, 56, 1, 4)]  # channels, side, stride, width
MODELS = ["regnet_y_400mf", "efficientnet_b0", "resnext50_32x4d"]


def layer(c: int, hw: int, stride: int, width: int, path: Path) -> Path:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((c, width, 3, 3)) * 0.2).astype("float32"), "w")
    b = numpy_helper.from_array(rng.standard_normal(c).astype("float32"), "b")
    out = (hw - 1) // stride + 1
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=c // width, pads=[1] * 4, strides=[stride] * 2),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, path.stem, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, out, out])], [w, b])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def main(old: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    work = Path("/tmp/cpu-grouped-conv")
    work.mkdir(exist_ok=True)
    layers = [layer(*spec, work / f"group_conv_{'_'.join(map(str, spec))}.onnx") for spec in LAYERS]
    models = [torchvision_onnx(name, work / f"{name}.onnx") for name in MODELS]
    for what, files in (("layers", layers), ("models", models)):
        subprocess.run([sys.executable, str(REPO / "benchmarks" / "cpu_ab.py"), str(old), str(out / f"cpu-ab-{what}.json"),
                        *map(str, files)], check=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
