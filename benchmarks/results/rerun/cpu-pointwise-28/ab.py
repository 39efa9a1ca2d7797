"""A/B of 1x1 convs over 28 x 28 pixels as GEMMs (``cpu_conv2d.POINTWISE_GEMM_PIXELS`` 56 x 56 -> 28 x 28) against the
channel-vector conv tile they ran as before, one core.

The zoo's CNNs' 1x1 stride-1 convs over 28 x 28 (+ bias + ReLU: ResNet-50's 512 -> 128 and 128 -> 512, MobileNetV2's
32 -> 192, 192 -> 32, 144 -> 32, 192 -> 64) and the two whole models (``build/zoo/``), compiled by both checkouts for
``cpu`` and timed in 7 interleaved rounds (``benchmarks/cpu_ab.py``)::

    git worktree add /tmp/wt-old <commit before>
    taskset -c 0 .venv/bin/python benchmarks/results/rerun/cpu-pointwise-28/ab.py /tmp/wt-old OUT.json
"""

import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))
from benchmarks.cpu_ab import compare, pointwise  # noqa: E402
from tests.helpers import save  # noqa: E402

CONVS = {"pw512-128-28": (512, 128, 28), "pw128-512-28": (128, 512, 28), "pw32-192-28": (32, 192, 28),
         "pw192-32-28": (192, 32, 28), "pw144-32-28": (144, 32, 28), "pw192-64-28": (192, 64, 28)}
MODELS = ("resnet50", "mobilenet_v2")


def main(old_root: Path, out: Path, work: Path = Path("/tmp/pointwise-28-ab")) -> None:
    rng = np.random.default_rng(0)
    work.mkdir(exist_ok=True)
    models = {name: save(pointwise(*shape, rng), work / f"{name}.onnx") for name, shape in CONVS.items()}
    models |= {name: REPO / "build" / "zoo" / f"{name}-b1.onnx" for name in MODELS}
    compare(models, old_root, out, work)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
