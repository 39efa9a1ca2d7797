"""Experiment (issue #5): persistent CTAs taking their work items in boustrophedon rounds (``TileConfig.snake``).

The causal launch order is heaviest first within L2 sections; a persistent CTA c took items c, c + 132, ..., whose
weights then depend on where the sections' boundaries fall: modelled (key tiles a CTA computes, the most against the
mean), d64 causal 2048 in the rule's 16-pair sections ends 1.22x the mean, which is where its persistent variant lost
to one CTA per query tile (306.6 against 338.4 TFLOP/s on the H200). In snake rounds (round r: CTA c takes item
r * 132 + c, odd rounds r * 132 + 131 - c) the same sections end 1.04x, 64 pairs 1.02x (``balance.py``, the model).
Variants: the persistent kernels in snake rounds over sections of several sizes, beside the rule (one CTA per query
tile from 2048 rows, or the round-robin persistent kernel below).

    python3 benchmarks/results/rerun/attention-snake/tiles.py --build            # here
    python3 benchmarks/results/rerun/attention-snake/tiles.py --run --out DIR    # GPU machine
"""

import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))

from benchmarks import attention as A  # noqa: E402

NAMES = tuple(f"bench_d{d}_s{s}_causal" for d in (64, 128) for s in (512, 2048, 8192))


def variants(chosen, spec) -> list:
    """The rule's kernel persistent (132 CTAs, the H200's SMs) in snake rounds over L2 sections of several sizes."""
    snake = replace(chosen, persistent=132, snake=True)
    if spec.seq_q < 2048:  # (persistent already: the same sections, the order alone)
        return [snake]
    if spec.head_dim == 64 and spec.seq_q == 2048:
        return [replace(chosen, persistent=132)] + [replace(snake, lpt_heads=n) for n in (16, 32, 64)] + [
            replace(snake, lpt_heads=64, stages=4), replace(snake, lpt_heads=64, stages=4, q_bufs=2),
            replace(snake, lpt_heads=64, stages=4, q_bufs=2, carry=True)]
    if spec.head_dim == 64:
        return [replace(snake, lpt_heads=n) for n in (16, 64)] + [replace(chosen, persistent=132, lpt_heads=64)]
    if spec.seq_q == 2048:  # (persistent in ping-pong already, sections of 2 pairs)
        return [replace(snake, lpt_heads=n) for n in (2, 4)]
    return [replace(snake, lpt_heads=n) for n in (1, 32)] + [replace(chosen, persistent=132, lpt_heads=32)]


if __name__ == "__main__":
    A.experiment(__file__, NAMES, variants)
