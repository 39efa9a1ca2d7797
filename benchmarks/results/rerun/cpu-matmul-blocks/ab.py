"""A/B of the CPU GEMM rule's blocks of J tiles (``cpu_matmul.B_BLOCK_BYTES``) against the rule before them, one core.

The zoo's CNNs' 1x1 convs over >= 56 x 56 pixels (+ bias + ReLU; GEMMs with vectors along the pixels), three
transformer GEMMs (+ bias; one J tile per block, as before) and whole models from ``benchmarks/models.py``
(``build/zoo/``), compiled by both checkouts for ``cpu`` and timed in 7 interleaved rounds (``benchmarks/cpu_ab.py``)::

    git worktree add /tmp/wt-old <commit before>
    taskset -c 0 .venv/bin/python benchmarks/results/rerun/cpu-matmul-blocks/ab.py /tmp/wt-old OUT.json
"""

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))
from benchmarks.cpu_ab import compare, pointwise  # noqa: E402
from tests.helpers import make_model, save  # noqa: E402

F = TensorProto.FLOAT
CONVS = {"pw64-256-56": (64, 256, 56), "pw256-64-56": (256, 64, 56), "pw64-64-56": (64, 64, 56),
         "pw16-96-112": (16, 96, 112), "pw32-16-112": (32, 16, 112), "pw24-144-56": (24, 144, 56),
         "pw144-24-56": (144, 24, 56)}
GEMMS = {"mm128-768-3072": (128, 768, 3072), "mm128-3072-768": (128, 3072, 768), "mm197-768-768": (197, 768, 768)}
MODELS = ("resnet50", "mobilenet_v2", "vit_b_16")


def dense(m: int, k: int, n: int, rng: np.random.Generator) -> onnx.ModelProto:
    nodes = [helper.make_node("MatMul", ["x", "w"], ["d"]), helper.make_node("Add", ["d", "b"], ["y"])]
    inits = {"w": rng.standard_normal((k, n)).astype(np.float32), "b": rng.standard_normal(n).astype(np.float32)}
    return make_model(nodes, [("x", F, [1, m, k])], [("y", F, [1, m, n])], inits)


def main(old_root: Path, out: Path, work: Path = Path("/tmp/matmul-blocks-ab")) -> None:
    rng = np.random.default_rng(0)
    work.mkdir(exist_ok=True)
    models = {name: save(pointwise(*shape, rng), work / f"{name}.onnx") for name, shape in CONVS.items()}
    models |= {name: save(dense(*shape, rng), work / f"{name}.onnx") for name, shape in GEMMS.items()}
    models |= {name: REPO / "build" / "zoo" / f"{name}-b1.onnx" for name in MODELS}
    compare(models, old_root, out, work)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
