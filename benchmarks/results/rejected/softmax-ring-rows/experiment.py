"""Experiment (issue #4, queued): the ring (``CudaPlan.grid``) for rows that one block holds, in several waves. A
streamed row's block reads its row, merges, writes, and exits; the next block on its SM starts reading only then
(two per SM overlap a little). In the ring, as many blocks as the SMs hold each take rows ``blockIdx.x + k * grid`` in
turn, pass 2 requesting the next row's cached steps into the shared memory it has just written out, as the split's
ring does for chunks (16 x 1M float32 1.08x on the H100, ``rerun/softmax-waves/``). No exchange between blocks, so
residency does not matter here. Variants: the rule's plans of the H200's shapes short of 0.95 of copy that stream
(1024 x 32768 float16 / float32, 4096 x 50257 float32 / float16) with ``grid`` = the blocks the SMs hold; checked
against float64 and timed with the copy and the rule's kernels in the benchmark's rounds.

    python3 benchmarks/results/rejected/softmax-ring-rows/experiment.py --build                                  # here
    python3 benchmarks/results/rejected/softmax-ring-rows/experiment.py --run --shapes 1024x32768 4096x50257 --out DIR
"""

import dataclasses
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))

from benchmarks import softmax as S  # noqa: E402

SHAPES = [(1024, 32768), (4096, 50257)]


def _ring(rows: int, cols: int, dtype: str) -> dict:
    from schedules.softmax import cuda_plan  # (--build only: the GPU machine has TVM's runtime alone)

    plan = cuda_plan(rows, cols, dtype, "sm_90")
    return dataclasses.asdict(plan) | {"grid": 132 * 1024 // plan.lanes}  # (one 1024-thread block or two of 512 an SM)


if __name__ == "__main__":
    build = "--build" in sys.argv
    S.experiment(__file__, SHAPES, [(r, c, dt, _ring(r, c, dt)) for r, c in SHAPES for dt in ("float32", "float16")
                                    if build])
