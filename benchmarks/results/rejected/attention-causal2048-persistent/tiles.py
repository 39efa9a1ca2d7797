"""Experiment (issue #5): causal attention at seq 2048 (the H200 had d64 at 0.89 of cuDNN) as the persistent kernel
the rule takes below 2048 rows: 2 computing warpgroups, for d64 in ping-pong with 2 Q buffers and the next item's
first Q·Kᵀ carried (``persistent_launch``'s causal branch), in L2 sections of at most a quarter of the grid's items or
of the rule's 8 MB. The benchmark's own variants had only the 3-warpgroup persistent kernel there (H200: 0.94x).
Built and timed by ``benchmarks/attention.py``'s ``build`` / ``run`` on the two causal seq-2048 cases.

    python3 benchmarks/results/rejected/attention-causal2048-persistent/tiles.py --build            # here
    python3 benchmarks/results/rejected/attention-causal2048-persistent/tiles.py --run --out DIR    # GPU machine
"""

import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))

from benchmarks import attention as A  # noqa: E402

NAMES = ("bench_d64_s2048_causal", "bench_d128_s2048_causal")


def variants(chosen, spec) -> list:
    """The rule's causal configuration made persistent as below 2048 rows, in capped sections and in the rule's."""
    d64 = spec.head_dim <= 64
    short = replace(chosen, persistent=132, warps=8, pingpong=d64, q_bufs=2 if d64 else 1, carry=d64)
    cap = 132 // 4 // -(-spec.seq_q // 128) * spec.group  # (persistent_launch's cap: 2 pairs at 2048 rows)
    out = [replace(short, lpt_heads=cap), short]
    if d64:  # without ping-pong / without the carry
        out += [replace(short, pingpong=False), replace(short, carry=False)]
    return out


if __name__ == "__main__":
    A.experiment(__file__, NAMES, variants)
