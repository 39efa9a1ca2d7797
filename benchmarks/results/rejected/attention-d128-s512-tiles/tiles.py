"""Experiment (issue #5): d128 at seq 512, where the rule's kernel is furthest behind cuDNN, in tile shapes the
benchmark's variants do not cover: 64-key tiles, whose 32 KB stages leave room for a second Q buffer beside 3-4 of
them, so that the next item's Q loads under this item and its first Q·Kᵀ is carried behind the last P·V
(``TileConfig.carry``; d128's 128-key tiles fit one Q buffer beside 3 stages), and 96-key tiles likewise. Built and
timed by ``benchmarks/attention.py``'s own ``build`` / ``run`` on those two cases, with these configurations as the
variants (the rule's kernel beside them, and torch's backends).

    python3 benchmarks/results/rejected/attention-d128-s512-tiles/tiles.py --build            # here
    python3 benchmarks/results/rejected/attention-d128-s512-tiles/tiles.py --run --out DIR    # GPU machine
"""

import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))

from benchmarks import attention as A  # noqa: E402

NAMES = ("bench_d128_s512_full", "bench_d128_s512_causal")


def variants(chosen, spec) -> list:
    """The rule's configuration with 64-key tiles (3 or 4 stages, 1 or 2 Q buffers, carried or not) or 96-key tiles."""
    return [replace(chosen, bn=64, stages=4, q_bufs=2, carry=True), replace(chosen, bn=64, stages=3, q_bufs=2, carry=True),
            replace(chosen, bn=64, stages=4, q_bufs=2), replace(chosen, bn=64, stages=4),
            replace(chosen, bn=96, stages=3, q_bufs=2, carry=True), replace(chosen, bn=96, stages=3)]


if __name__ == "__main__":
    A.experiment(__file__, NAMES, variants)
