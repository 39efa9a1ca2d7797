"""Experiment (issue #5): causal attention on the TMA kernel with each computing warpgroup stopping at its own rows'
diagonal (``TileConfig.group_diag``; before, only the cp.async kernel could): the key tiles past it are released to
the producer as they come in, uncomputed. For d64's 192-row query tiles (3 warpgroups) the first warpgroup skips up
to two of the last tile's 128 keys. Variants of the rule's causal kernels (ping-pong, which a stopped warpgroup could
not keep taking turns in, and the carried S, turned off where the rule has them).

    python3 benchmarks/results/rejected/attention-tma-group-diag/tiles.py --build            # here
    python3 benchmarks/results/rejected/attention-tma-group-diag/tiles.py --run --out DIR    # GPU machine
"""

import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))

from benchmarks import attention as A  # noqa: E402

NAMES = tuple(f"bench_d{d}_s{s}_causal" for d in (64, 128) for s in (512, 2048, 8192))


def variants(chosen, spec) -> list:
    """The rule's causal configuration with per-warpgroup diagonals (without ping-pong and carry)."""
    return [replace(chosen, group_diag=True, pingpong=False, carry=False)]


if __name__ == "__main__":
    A.experiment(__file__, NAMES, variants)
