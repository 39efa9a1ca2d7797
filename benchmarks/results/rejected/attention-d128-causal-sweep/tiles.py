"""Experiment (issue #5): causal d128 at seq 512 and 2048, the persistent kernel (2 computing warpgroups in ping-pong,
one Q buffer, O staged in the item's last K/V stage and stored with TMA), behind cuDNN on the H100 (0.94-0.96 at 512
in three runs, 0.98-1.00 at 2048): its L2 sections of half and twice the rule's (batch, head) pairs, the next item's
first S carried (with one Q buffer it had lost 4-17 % at seq 512 before O went through TMA), and without ping-pong.

    python3 benchmarks/results/rejected/attention-d128-causal-sweep/tiles.py --build            # here
    python3 benchmarks/results/rejected/attention-d128-causal-sweep/tiles.py --run --out DIR    # GPU machine
"""

import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))

from benchmarks import attention as A  # noqa: E402

NAMES = ("bench_d128_s512_causal", "bench_d128_s2048_causal")


def variants(chosen, spec) -> list:
    """See the module docstring."""
    return [replace(chosen, lpt_heads=max(1, chosen.lpt_heads // 2)), replace(chosen, lpt_heads=chosen.lpt_heads * 2),
            replace(chosen, carry=True), replace(chosen, pingpong=False)]


if __name__ == "__main__":
    A.experiment(__file__, NAMES, variants)
