"""Probe (issue #5, 2026-12-06 08:2x, H100): what the persistent kernel's epilogue costs. The rule's kernel against
itself storing O only where 1 / row sum < 0 (never: the computation stays, the stores go). Needs a temporary edit of
schedules/attention_cuda.py, not committed: a field ``store: bool = True`` in ``TileConfig`` (name suffix ``X`` when
False) and, in ``store_o``, ``if row < sq and (cfg.store or lsum[r] < T.float32(0)):``. A first build with the stores
simply removed let the compiler drop the whole computation (1574 TFLOP/s).

    python3 benchmarks/results/rerun/attention-tma-store/no-store-probe-h100/no_store.py --build   # here, edited
    python3 benchmarks/results/rerun/attention-tma-store/no-store-probe-h100/no_store.py --run --out DIR

The rule then (commit f3e73ee) stored O from the registers; `store_o` is `store_o_direct` since.
"""
import sys
from dataclasses import replace
from pathlib import Path
REPO = Path(__file__).resolve().parents[5]
sys.path.insert(0, str(REPO))
from benchmarks import attention as A  # noqa: E402
NAMES = ("bench_d128_s512_full", "bench_d128_s512_causal", "bench_d64_s512_full", "bench_d64_s512_causal", "bench_d128_s2048_full")
def variants(chosen, spec):
    return [replace(chosen, store=False)]
if __name__ == "__main__":
    A.experiment(__file__, NAMES, variants)
