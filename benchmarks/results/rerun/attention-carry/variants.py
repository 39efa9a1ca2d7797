"""Builds the extra tile configurations of runs 4-8 in this folder (``TileConfig.carry`` against its neighbours).

Runs 1-3 are the benchmark's own variants (``benchmarks/attention.py``: the rule's persistent kernels with the next
item's first S carried or not). Runs 4-8 timed these instead, built here and run on the GPU machine with

    python3 benchmarks/results/rerun/attention-carry/variants.py seq512 --dir build/gpu/attention-x
    python3 benchmarks/attention.py --run --dir build/gpu/attention-x --cases <the cases> --rounds 9 --out DIR

- ``seq512`` (runs 4 and 5, before the rule took ``carry``): d64 without a mask in 2 computing warpgroups, in
  ping-pong or not, with 2 Q buffers carried or not; d64 causal carried without ping-pong; d128 in ping-pong,
  carried or not (one Q buffer: two do not fit beside 3 stages). (Built now, d64 causal "carried" is the rule itself.)
- ``causal-long`` (run 6, after): d64 causal at 2048 and 8192 rows as the persistent kernel of seq 512 (2 computing
  warpgroups in ping-pong), with 1 or 2 Q buffers, carried or not.
- ``d128-two-stages`` (runs 7 and 8): d128 at seq 512 with 2 K/V stages, which leave room for 2 Q buffers, carried, in
  ping-pong or not, against the same with 1 Q buffer not carried.
- Run 9 (``run9-carry-late.json``, 2026-12-05) was built by this script as of commit ``65cdc3d`` (its ``carry-late``
  set): the rule's persistent kernels at seq 512 and without a mask at 2048, not carried, carried, and carried late
  (a ``TileConfig.carry_late`` option: the S issued once the last P·V is done), whichever the rule is not. The rule's
  kernel was ahead on all six shapes (carried late 0.90-0.97 of it, within 3 % of carried), so the option was removed.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))

import benchmarks.attention as bench  # noqa: E402
from schedules.attention_cuda import TileConfig, choose  # noqa: E402


def seq512(case: bench.Case, chosen: TileConfig) -> list[TileConfig]:
    if case.head_dim == 64 and not case.causal:
        return [replace(chosen, warps=8, pingpong=True, q_bufs=2, carry=True),
                replace(chosen, warps=8, pingpong=True, q_bufs=2),
                replace(chosen, warps=8, q_bufs=2, carry=True), replace(chosen, warps=8, q_bufs=1)]
    if case.head_dim == 64:
        return [replace(chosen, carry=True), replace(chosen, pingpong=False, carry=True), replace(chosen, q_bufs=1)]
    return [replace(chosen, pingpong=True), replace(chosen, pingpong=True, carry=True)]


def causal_long(case: bench.Case, chosen: TileConfig) -> list[TileConfig]:
    persistent = replace(chosen, warps=8, persistent=132, pingpong=True, q_bufs=2)
    return [persistent, replace(persistent, carry=True), replace(persistent, q_bufs=1)]


def d128_two_stages(case: bench.Case, chosen: TileConfig) -> list[TileConfig]:
    two = replace(chosen, stages=2, carry=False, q_bufs=1)
    return [two, replace(two, q_bufs=2, carry=True), replace(two, q_bufs=2, carry=True, pingpong=not chosen.pingpong)]


SETS = {"seq512": (seq512, ("bench_d64_s512_full", "bench_d64_s512_causal", "bench_d128_s512_full",
                            "bench_d128_s512_causal")),
        "causal-long": (causal_long, ("bench_d64_s2048_causal", "bench_d64_s8192_causal")),
        "d128-two-stages": (d128_two_stages, ("bench_d128_s512_full", "bench_d128_s512_causal"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("set", choices=SETS)
    ap.add_argument("--dir", type=Path, default=REPO / "build" / "gpu" / "attention-x")
    a = ap.parse_args()
    configs, names = SETS[a.set]

    def variants(case: bench.Case, spec) -> list[TileConfig]:
        chosen = choose(spec, wgmma=True)
        return [c for c in configs(case, chosen) if c != chosen]

    bench.Case.variants = variants  # the benchmark builds each case's rule kernel plus these configurations
    bench.build([c for c in bench.CASES if c.name in names], a.dir / bench.LIB.name)


if __name__ == "__main__":
    main()
