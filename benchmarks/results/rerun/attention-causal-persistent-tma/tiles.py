"""Experiment (issue #5): causal attention from 2048 rows as a persistent kernel now that it can store O with TMA
(``TileConfig.tma_store``). Without it the persistent kernel lost there (rejected/attention-causal2048-persistent/:
d64 0.98x, d128 0.95x at seq 2048); the stores it made from registers were what held the persistent kernel back at
seq 512 (rerun/attention-tma-store/). Variants of the rule's causal kernel (one CTA per query tile), all persistent
with O stored through TMA: as ``persistent_launch`` makes shorter sequences (2 computing warpgroups; d64 in ping-pong,
2 Q buffers, the next item's first S carried) in the rule's 8 MB sections or in sections capped at a quarter of the
grid's items; and with the rule's own warpgroups (d64: 3, d128: 2 in ping-pong). It ran against the rule of commit
ba8eee6; since, the rule itself takes the capped persistent kernel for d128 at seq 2048 (README beside this).

    python3 benchmarks/results/rerun/attention-causal-persistent-tma/tiles.py --build            # here
    python3 benchmarks/results/rerun/attention-causal-persistent-tma/tiles.py --run --out DIR    # GPU machine
"""

import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))

from benchmarks import attention as A  # noqa: E402

NAMES = ("bench_d64_s2048_causal", "bench_d128_s2048_causal", "bench_d64_s8192_causal", "bench_d128_s8192_causal")


def variants(chosen, spec) -> list:
    """The rule's causal configuration made persistent with O stored through TMA (see the module docstring)."""
    d64 = spec.head_dim <= 64
    own = replace(chosen, persistent=132, tma_store=True)
    short = replace(own, warps=8, pingpong=d64, q_bufs=2 if d64 else 1, carry=d64)
    cap = max(1, 132 // 4 // -(-spec.seq_q // 128)) * spec.group  # (persistent_launch's cap)
    return [short, replace(short, lpt_heads=min(cap, short.lpt_heads)), own]


if __name__ == "__main__":
    A.experiment(__file__, NAMES, variants)
