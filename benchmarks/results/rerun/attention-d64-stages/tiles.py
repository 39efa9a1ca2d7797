"""Experiment (issue #5): d64 with 4, 5 or 6 K/V stages of 128-key tiles instead of 3 (32 KB a stage; never timed
before: 2 stages ran 13-32 % behind 3): from 2048 rows 3 computing warpgroups of 192 query rows and one Q buffer (24
KB), up to 6 stages; at seq 512 the persistent kernel's 2 Q buffers and O's own buffer leave room for 4 (5 causal,
whose 2 warpgroups have 128-row tiles); causal also in L2 sections of half and twice as many (batch, head) pairs,
re-timed since the query tiles are aligned to the sequence's end.

    python3 benchmarks/results/rerun/attention-d64-stages/tiles.py --build            # here
    python3 benchmarks/results/rerun/attention-d64-stages/tiles.py --run --out DIR    # GPU machine
"""

import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))

from benchmarks import attention as A  # noqa: E402

NAMES = tuple(f"bench_d64_s{s}_{m}" for s in (512, 2048, 8192) for m in ("full", "causal"))


def variants(chosen, spec) -> list:
    """The rule's configuration with 4-6 stages; causal: L2 sections of half and twice the rule's pairs."""
    # (seq 512 persistent, 2 Q buffers and O's own buffer: 200 KB at 4 stages without a mask, 208 KB at 5 causal)
    fits = (4,) if spec.seq_q < 2048 and spec.causal == "none" else (4, 5) if spec.seq_q < 2048 else (4, 5, 6)
    out = [replace(chosen, stages=s) for s in fits]
    if chosen.lpt_heads:
        out += [replace(chosen, lpt_heads=chosen.lpt_heads // 2), replace(chosen, lpt_heads=chosen.lpt_heads * 2)]
    return out


if __name__ == "__main__":
    A.experiment(__file__, NAMES, variants)
