"""Experiment (issue #4): the long-row splits in several waves WITHOUT a thread-block cluster. The cluster split of
16 x 1M float32 (rejected/softmax-cluster16/) ran 0.92x the rule in clusters of 16 but 0.84x with the rule's own 8
chunks in clusters of 8: the cluster alone costs ~16 % there, so 16 on-chip chunks without it might beat the rule's
one wave of 8 chunks (half of each 512 KB chunk re-read from L2). Without a cluster a row's blocks are resident
together only if the GPU dispatches blocks in order (then a row's blocks wait at most one wave for their partners);
if it does not, a block waits SPLIT_WAIT_NS and reads its whole row itself (correct, slow: the times would show it).
Variants, each checked against float64 and timed with the copy and the rule's kernels in the benchmark's rounds:
16 x 1M float32 in 16 chunks of 1024 threads (two waves, all on chip), 32 of 512 threads (two per SM, two waves), 32
of 1024 threads (four waves); float16 in 16 chunks of 1024 threads; 128 x 131072 float32 as the rule's cluster split
without the cluster (2 chunks of 1024 threads) and in 4 chunks of 512; float16 in 2 chunks of 1024 threads. And
the same splits of 1024-thread blocks as a persistent ring (``grid``: 128 or 132 blocks, all resident, each taking its
chunks in turn and reading the next while it writes the current one; no reliance on the dispatch order).
Added after the three runs: the ring of 512-thread blocks, two per SM (32 chunks of 128 KB, 256 blocks), which the
waves of such blocks (1.078x) suggest. Run 4 (H100, `tvmpipe` now the ring rule; runs 1-3 timed the rule before it):
that ring 1.030x the ring rule (0.90 -> 0.93 of copy), the ring rule's own chunks as a variant 0.998x / 0.999x; taken
further in rerun/softmax-ring512/.

    python3 benchmarks/results/rerun/softmax-waves/experiment.py --build                                        # here
    python3 benchmarks/results/rerun/softmax-waves/experiment.py --run --shapes 16x1048576 128x131072 --out DIR  # GPU
"""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))

from benchmarks import softmax as S  # noqa: E402

_SPLIT = {"vec": 4, "per_thread": 4, "cache": "l2", "kept_exp": False}
_H, _F = {"vec": 8}, {"lanes": 1024}  # float16 vectors; 1024-thread blocks
VARIANTS = [
    (16, 1 << 20, "float32", _SPLIT | _F | {"chunks": 16, "cached": 3}),
    (16, 1 << 20, "float32", _SPLIT | {"lanes": 512, "chunks": 32, "cached": 3}),
    (16, 1 << 20, "float32", _SPLIT | _F | {"chunks": 32, "cached": 1}),
    (16, 1 << 20, "float16", _SPLIT | _F | _H | {"chunks": 16, "cached": 1}),
    (128, 131072, "float32", _SPLIT | _F | {"chunks": 2, "cached": 3}),
    (128, 131072, "float32", _SPLIT | {"lanes": 512, "chunks": 4, "cached": 3}),
    (128, 131072, "float16", _SPLIT | _F | _H | {"chunks": 2, "cached": 1}),
    (16, 1 << 20, "float32", _SPLIT | _F | {"chunks": 16, "cached": 3, "grid": 128}),
    (16, 1 << 20, "float32", _SPLIT | _F | {"chunks": 32, "cached": 1, "grid": 128}),
    (16, 1 << 20, "float32", _SPLIT | {"lanes": 512, "chunks": 32, "cached": 3, "grid": 256}),  # (added after the runs)
    (16, 1 << 20, "float16", _SPLIT | _F | _H | {"chunks": 16, "cached": 1, "grid": 128}),
    (128, 131072, "float32", _SPLIT | _F | {"chunks": 2, "cached": 3, "grid": 128}),
    (128, 131072, "float32", _SPLIT | _F | {"chunks": 2, "cached": 3, "grid": 132}),
    (128, 131072, "float16", _SPLIT | _F | _H | {"chunks": 2, "cached": 1, "grid": 132}),
]

if __name__ == "__main__":
    S.experiment(__file__, [(128, 131072), (16, 1 << 20)], VARIANTS)
