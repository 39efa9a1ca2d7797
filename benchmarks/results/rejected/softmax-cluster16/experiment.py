"""Experiment (issue #4): 16 x 1M float32 as a cluster split of 16 chunks. The rule splits each row over 8 blocks of
1024 threads (one wave: 128 blocks for 132 SMs), 512 KB a block, of which 256 KB stays on chip and pass 2 re-reads the
rest from L2 (32 MB in all). A row's 4 MB fits 16 such blocks on chip, but 256 blocks are two waves, and a row's
blocks exchange their (max, sum), so they must be resident together: a thread-block cluster of 16 (non-portable,
above CUDA's portable 8), as the rule's cluster split of 128 x 131072 float32 (2 a cluster, two waves, 0.91 of copy on
the H100 where 16 x 1M is at 0.83). Beside it: the rule's 8 chunks in clusters of 8 (the cluster alone), and float16
in clusters of 16 chunks (128 KB each, two waves, against the rule's one wave of 256 KB chunks). Checked against
float64 and timed with the copy and the rule's kernels in the benchmark's rounds (``softmax.run``).

    python3 benchmarks/results/rejected/softmax-cluster16/experiment.py --build                              # here
    python3 benchmarks/results/rejected/softmax-cluster16/experiment.py --run --shapes 16x1048576 --out DIR  # GPU
"""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))

from benchmarks import softmax as S  # noqa: E402

_F32 = {"lanes": 1024, "vec": 4, "per_thread": 4, "cache": "l2", "cached": 3, "kept_exp": False, "cluster": True}
VARIANTS = [(16, 1 << 20, "float32", _F32 | {"chunks": 16}), (16, 1 << 20, "float32", _F32 | {"chunks": 8}),
            (16, 1 << 20, "float16", _F32 | {"vec": 8, "chunks": 16, "cached": 1})]

if __name__ == "__main__":
    S.experiment(__file__, [(16, 1 << 20)], VARIANTS)
