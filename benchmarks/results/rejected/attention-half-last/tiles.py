"""Experiment (issue #5): an item's last key tile on half its keys (``TileConfig.half_last``) against the rule's
kernel. d64's causal query tiles of 192 rows, aligned to the sequence's end, end at 64 mod 128 every other tile:
their last 128-key tile holds 64 keys that no row sees, and S = Q Kᵀ (m64n128), its softmax and P·V (128 keys) ran
on all of it. With the option such a tile runs m64n64, a softmax of 64 keys and P·V on 64 (seq 2048: 2.5 of the 96 key
tiles computed per head, 2.6 %; 8192: 0.8 %).

    python3 benchmarks/results/rejected/attention-half-last/tiles.py --build            # here
    python3 benchmarks/results/rejected/attention-half-last/tiles.py --run --out DIR    # GPU machine
"""

import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))

from benchmarks import attention as A  # noqa: E402

NAMES = tuple(f"bench_d64_s{s}_causal" for s in (2048, 8192))


def variants(chosen, spec) -> list:
    """The rule's configuration with each item's last key tile on half its keys where no row sees more."""
    return [replace(chosen, half_last=1), replace(chosen, half_last=2)]


if __name__ == "__main__":
    A.experiment(__file__, NAMES, variants)
