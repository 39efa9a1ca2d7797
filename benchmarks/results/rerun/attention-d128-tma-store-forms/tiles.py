"""Experiment (issue #5): d128 with O stored through TMA (``TileConfig.tma_store``) in other forms than the rule's
(3 stages, 1 Q buffer, O staged in the last stage's K tile): 2 stages, whose freed 64 KB hold O in a buffer of its own
and a second Q buffer, with and without the next item's first S carried (``carry``: with one Q buffer it had lost,
the next Q loading only once the last S was in), with one Q buffer; and the rule's form in ping-pong. On the benchmark
shapes where d128 runs persistent and stores through TMA. It ran against the rule of commit 888c3ab (no ping-pong for
causal d128); since, the rule takes ping-pong there (README beside this), so the last variant now toggles it off.

    python3 benchmarks/results/rerun/attention-d128-tma-store-forms/tiles.py --build            # here
    python3 benchmarks/results/rerun/attention-d128-tma-store-forms/tiles.py --run --out DIR    # GPU machine
"""

import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))

from benchmarks import attention as A  # noqa: E402

NAMES = ("bench_d128_s512_full", "bench_d128_s512_causal", "bench_d128_s2048_full", "bench_d128_s2048_causal")


def variants(chosen, spec) -> list:
    """The rule's d128 configuration in 2 stages (O in its own buffer; 2 Q buffers, carried or not; 1) or ping-pong."""
    two = replace(chosen, stages=2)
    return [replace(two, q_bufs=2, carry=True), replace(two, q_bufs=2), two,
            replace(chosen, pingpong=not chosen.pingpong)]


if __name__ == "__main__":
    A.experiment(__file__, NAMES, variants)
