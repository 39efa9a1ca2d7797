"""Experiment (issue #4): float16's split shapes in 512-thread blocks, two per SM, with their exponentials kept. The rule
takes them as the ring of 512-thread blocks (``rerun/softmax-ring512/``: 16 x 1M float16 1.014-1.031x the one wave of
1024-thread blocks with kept exponentials, but 0.898-0.899 of copy on the H100), which computes every exponential
twice; the ring cannot keep them (``kept16`` excludes ``grid``). Variants: the same 256 blocks as a plain split (one
wave of two blocks per SM, ``grid`` 0) with the exponentials kept in shared memory over x, and without them; 16 x 1M
(16 chunks of 128 KB) and 128 x 131072 (2 chunks). Each checked against float64 and timed with the copy and the rule's
kernels in the benchmark's rounds.

    python3 benchmarks/results/rejected/softmax-f16-kept-pairs/experiment.py --build                                  # here
    python3 benchmarks/results/rejected/softmax-f16-kept-pairs/experiment.py --run --shapes 16x1048576 128x131072 --out DIR
"""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))

from benchmarks import softmax as S  # noqa: E402

_P = {"lanes": 512, "vec": 8, "per_thread": 4, "cache": "l2", "cached": 3}  # chunks of 4 steps of 32 KB
VARIANTS = [(r, c, "float16", _P | {"chunks": k, "kept_exp": kept}) for r, c, k in ((16, 1 << 20, 16), (128, 131072, 2))
            for kept in (True, False)]

if __name__ == "__main__":
    S.experiment(__file__, [(128, 131072), (16, 1 << 20)], VARIANTS)
