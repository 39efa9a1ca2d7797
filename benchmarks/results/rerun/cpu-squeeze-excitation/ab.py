"""CPU A/B of the squeeze-and-excitation change against main before it (83a9bc6): a global average pool as one
vectorised row reduction over the plane, a 1x1 conv whose gate multiplies the feature map kept on the conv rule
(the broadcast multiply a parallel vector loop after it), elementwise loops in vectors within rows. Single SE blocks
(global average pool, 1x1 conv + Relu, 1x1 conv + gate, gate times the map) of MobileNetV3-Large (HardSigmoid) and
EfficientNet-B0 (Sigmoid), a residual add and a per-channel multiply over 72 x 28 x 28 alone (``CpuElementwise``),
then torchvision's MobileNetV3-Large, EfficientNet-B0 and RegNetY-400MF at 224 x 224 (seeded random weights), each
timed by ``benchmarks/cpu_ab.py`` in interleaved rounds with onnxruntime.

    git archive 83a9bc6 compiler schedules targets tuning_logs pyproject.toml | tar -x -C build/old10
    .venv/bin/python benchmarks/results/rerun/cpu-squeeze-excitation/ab.py build/old10 OUT_DIR
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
# channels, side, squeezed channels, gate: MobileNetV3-Large's 28 x 28 / 7 x 7 blocks, EfficientNet-B0's 14 x 14 one
BLOCKS = [(72, 28, 24, "HardSigmoid"), (960, 7, 240, "HardSigmoid"), (480, 14, 20, "Sigmoid")]
MODELS = ["mobilenet_v3_large", "efficientnet_b0", "regnet_y_400mf"]


def block(c: int, hw: int, r: int, gate: str, path: Path) -> Path:
    rng = np.random.default_rng(0)
    inits = {"w1": rng.standard_normal((r, c, 1, 1)) * 0.1, "b1": rng.standard_normal(r),
             "w2": rng.standard_normal((c, r, 1, 1)) * 0.1, "b2": rng.standard_normal(c)}
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["p"]), helper.make_node("Conv", ["p", "w1", "b1"], ["c1"]),
             helper.make_node("Relu", ["c1"], ["h"]), helper.make_node("Conv", ["h", "w2", "b2"], ["c2"]),
             helper.make_node(gate, ["c2"], ["g"]), helper.make_node("Mul", ["x", "g"], ["y"])]
    shape = [1, c, hw, hw]
    return save(make_model(nodes, [("x", F, shape)], [("y", F, shape)], {k: v.astype("float32") for k, v in inits.items()}), path)


def elementwise(op: str, path: Path) -> Path:
    """x + z (both [1, 72, 28, 28]) or x * z (z [1, 72, 1, 1])."""
    x, z = [1, 72, 28, 28], [1, 72, 28, 28] if op == "Add" else [1, 72, 1, 1]
    return save(make_model([helper.make_node(op, ["x", "z"], ["y"])], [("x", F, x), ("z", F, z)], [("y", F, x)]), path)


def main(old: Path, out: Path) -> None:
    work = Path("/tmp/cpu-squeeze-excitation")
    work.mkdir(exist_ok=True)
    blocks = [block(*spec, work / f"se_{'_'.join(map(str, spec))}.onnx") for spec in BLOCKS]
    blocks += [elementwise(op, work / f"{op.lower()}_72_28.onnx") for op in ("Add", "Mul")]
    out.mkdir(parents=True, exist_ok=True)
    for what, files in (("blocks", blocks), ("models", [torchvision_onnx(n, work / f"{n}.onnx") for n in MODELS])):
        compare({f.stem: f for f in files}, old, out / f"cpu-ab-{what}.json", Path("/tmp/cpu-ab"))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
