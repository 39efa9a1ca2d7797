"""Experiment (issue #5): part of the softmax's exponentials on the FMA pipe (``TileConfig.soft_exp``,
``common.ex2_fma``: FlashAttention-4's emulation, a degree-3 polynomial and the exponent's bits) against the rule's
kernel, which takes all of them on the special-function unit. That unit issues 16 ex2 a clock per SM; a d64 tile's
two GEMMs take about as many tensor-core clocks as its exponentials take there (256 FLOP a score against the H100's
989 / 3.9 TFLOP/s), d128's twice as many. Nsight Compute had cuDNN issue more FMA-pipe work than ours (0.62-0.92x).
Variants: of every 8 n-tiles of S, 2, 3 or 4 on the FMA pipe for d64, 1 or 2 for d128.

    python3 benchmarks/results/rejected/attention-fma-exp/tiles.py --build            # here
    python3 benchmarks/results/rejected/attention-fma-exp/tiles.py --run --out DIR    # GPU machine
"""

import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))

from benchmarks import attention as A  # noqa: E402

NAMES = tuple(c.name for c in A.CASES if c.bench)  # the benchmark's 12 shapes


def variants(chosen, spec) -> list:
    """The rule's configuration with some of its exponentials on the FMA pipe."""
    return [replace(chosen, soft_exp=k) for k in ((2, 3, 4) if spec.head_dim <= 64 else (1, 2))]


if __name__ == "__main__":
    A.experiment(__file__, NAMES, variants)
