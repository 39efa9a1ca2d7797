"""Experiment (issue #5): the persistent kernel's epilogue through shared memory and TMA (``TileConfig.tma_store``)
against the stores from registers, on every benchmark shape whose rule kernel is persistent (all without a mask,
causal at seq 512): the rule's kernel beside the same configuration with ``tma_store`` toggled (the rule takes it
below 4096 rows since this experiment; when it ran, the rule had none). Built and timed by ``benchmarks/attention.py``'s
own ``build`` / ``run`` (torch's backends beside them, 9 rounds; the H200 run here took ``--rounds 15``).

    python3 benchmarks/results/rerun/attention-tma-store/tma_store.py --build            # here
    python3 benchmarks/results/rerun/attention-tma-store/tma_store.py --run --out DIR    # GPU machine
"""

import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))

from benchmarks import attention as A  # noqa: E402

NAMES = tuple(f"bench_d{d}_s{s}_{m}" for d in (64, 128) for s, m in
              ((512, "full"), (512, "causal"), (2048, "full"), (8192, "full")))


def variants(chosen, spec) -> list:
    """The rule's persistent configuration with ``tma_store`` toggled."""
    return [replace(chosen, tma_store=not chosen.tma_store)] if chosen.persistent else []


if __name__ == "__main__":
    A.experiment(__file__, NAMES, variants)
