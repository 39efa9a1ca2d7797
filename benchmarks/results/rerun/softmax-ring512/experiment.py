"""Experiment (issue #4): the ring of 512-thread blocks, two per SM. The ring rule's blocks are of 1024 threads, one per
SM: while a block exchanges partials with its row's other chunks or waits at a barrier, its SM streams nothing. The
waves experiment's last variant (``rerun/softmax-waves/``, run 4, H100), a ring of 512-thread blocks (32 chunks of
128 KB, 256 blocks), ran 1.03x the ring rule on 16 x 1M float32 (0.90 -> 0.93 of copy). Here that variant again and
the same form on the other split shapes: 128 x 131072 float32 (4 chunks of 128 KB; 256 or 264 blocks), and float16,
which the 1024-thread ring lost on (its rows then fit one wave of blocks): 16 x 1M (16 chunks of 128 KB in one turn of
256 blocks, or 32 of 64 KB in two), 128 x 131072 (2 chunks, one turn; 4, two turns). Each checked against float64
and timed with the copy and the rule's kernels in the benchmark's rounds.

    python3 benchmarks/results/rerun/softmax-ring512/experiment.py --build                                        # here
    python3 benchmarks/results/rerun/softmax-ring512/experiment.py --run --shapes 16x1048576 128x131072 --out DIR  # GPU
"""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))

from benchmarks import softmax as S  # noqa: E402

_R = {"lanes": 512, "per_thread": 4, "cache": "l2", "kept_exp": False, "cached": 3}  # chunks of 4 steps of 32 KB
_F, _H = {"vec": 4}, {"vec": 8}
_H2 = _H | {"per_thread": 2, "cached": 3}  # float16 chunks of 4 steps of 16 KB
VARIANTS = [
    (16, 1 << 20, "float32", _R | _F | {"chunks": 32, "grid": 256}),
    (128, 131072, "float32", _R | _F | {"chunks": 4, "grid": 256}),
    (128, 131072, "float32", _R | _F | {"chunks": 4, "grid": 264}),
    (16, 1 << 20, "float16", _R | _H | {"chunks": 16, "grid": 256}),
    (16, 1 << 20, "float16", _R | _H2 | {"chunks": 32, "grid": 256}),
    (128, 131072, "float16", _R | _H | {"chunks": 2, "grid": 256}),
    (128, 131072, "float16", _R | _H2 | {"chunks": 4, "grid": 256}),
]

if __name__ == "__main__":
    S.experiment(__file__, [(128, 131072), (16, 1 << 20)], VARIANTS)
