"""Experiment (issue #5): d64 from 2048 rows with the persistent kernel's 4 K/V stages (rerun/attention-d64-stages/).
Without a mask: a second Q buffer (the next item's Q loaded under this item's tiles; with 3 stages it had lost 1-5 %
at seq 2048), with 4 and 5 stages. Causal at seq 2048 (one CTA per 192-row query tile): the persistent kernel of
shorter causal sequences (2 computing warpgroups in ping-pong, 2 Q buffers, the next item's first S carried, O stored
with TMA, sections capped at a quarter of the grid's items) in 4 stages (with 3 it had run level with the rule before
the query tiles were aligned to the sequence's end: rerun/attention-causal-persistent-tma/).

    python3 benchmarks/results/rejected/attention-d64-qbufs/tiles.py --build            # here
    python3 benchmarks/results/rejected/attention-d64-qbufs/tiles.py --run --out DIR    # GPU machine
"""

import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))

from benchmarks import attention as A  # noqa: E402

NAMES = ("bench_d64_s2048_full", "bench_d64_s8192_full", "bench_d64_s2048_causal")


def variants(chosen, spec) -> list:
    """See the module docstring."""
    if spec.causal == "none":
        return [replace(chosen, q_bufs=2), replace(chosen, q_bufs=2, stages=5)]
    cap = max(1, 132 // 4 // -(-spec.seq_q // 128)) * spec.group  # (persistent_launch's cap)
    return [replace(chosen, warps=8, persistent=132, pingpong=True, q_bufs=2, carry=True, tma_store=True, stages=4,
                    lpt_heads=min(cap, chosen.lpt_heads))]


if __name__ == "__main__":
    A.experiment(__file__, NAMES, variants)
