"""Experiment (issue #5): each row's softmax sum on the tensor cores (``TileConfig.sum_mma``): P times a 16 x 8 tile of
ones, one m64n8 wgmma per 16 keys in P·V's commit group, accumulated beside O and rescaled with it, instead of one
float add per score (64 a thread and key tile, a fifth of the softmax's instructions). The exponentials on the FMA pipe
(rejected/attention-fma-exp/) lost the more the more instructions they added: the softmax between the GEMMs is short
of issue slots. The variant: the rule's configuration with it, on every benchmark shape.

    python3 benchmarks/results/rejected/attention-sum-mma/tiles.py --build            # here
    python3 benchmarks/results/rejected/attention-sum-mma/tiles.py --run --out DIR    # GPU machine
"""

import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))

from benchmarks import attention as A  # noqa: E402

NAMES = tuple(c.name for c in A.CASES if c.bench)  # the benchmark's 12 shapes


def variants(chosen, spec) -> list:
    """The rule's configuration with the row sums on the tensor cores."""
    return [replace(chosen, sum_mma=True)]


if __name__ == "__main__":
    A.experiment(__file__, NAMES, variants)
