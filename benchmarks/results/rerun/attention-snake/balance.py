"""The model behind ``tiles.py``: key tiles each persistent CTA computes, the most against the mean, for the causal
benchmark shapes (fp16, 16384 tokens, hidden 2048), in the kernel's launch order (``work_item``: heaviest query tiles
first within sections of ``lpt_heads`` (batch, head) pairs), dealt round robin (CTA c: items c, c + 132, ...) or in
snake rounds (``TileConfig.snake``); beside it one CTA per item as the GPU dispatches them (each item to the CTA slot
that frees first, in launch order). An item costs its key tiles plus ``--overhead`` (its prologue and epilogue).

    python3 benchmarks/results/rerun/attention-snake/balance.py [--overhead 0.5]
"""

import argparse
import heapq

SMS = 132


def item_tiles(seq: int, rows: int, pairs: int, sections: int, bn: int = 128) -> list[int]:
    """Key tiles of each work item in launch order (query tiles aligned to the sequence's end, as the rule's)."""
    nq = -(-seq // rows)
    aligned = seq % rows != 0

    def tiles(bx: int) -> int:
        q0 = seq - (bx + 1) * rows if aligned else (nq - 1 - bx) * rows
        return -(-min(q0 + rows, seq) // bn)

    def query_tile(w: int) -> int:
        sec = w // (sections * nq)
        width = sections if sec < pairs // sections else pairs % sections
        return w % (sections * nq) // width

    return [tiles(query_tile(w)) for w in range(nq * pairs)]


def spread(costs: list[float]) -> dict[str, float]:
    """The most a CTA computes against the mean: round robin, snake rounds, and the GPU's own dispatch."""
    mean = sum(costs) / SMS
    rr, snake = [0.0] * SMS, [0.0] * SMS
    for w, c in enumerate(costs):
        rr[w % SMS] += c
        r, i = divmod(w, SMS)
        snake[i if r % 2 == 0 else SMS - 1 - i] += c
    free = [(0.0, i) for i in range(SMS)]
    for c in costs:
        t, i = heapq.heappop(free)
        heapq.heappush(free, (t + c, i))
    return {"round robin": max(rr) / mean, "snake": max(snake) / mean, "dispatched": max(t for t, _ in free) / mean}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--overhead", type=float, default=0.5, help="an item's cost beyond its key tiles, in key tiles")
    args = ap.parse_args()
    shapes = {"d64": 192, "d128": 128}  # query rows per tile (3 / 2 computing warpgroups)
    for d, rows in shapes.items():
        heads = 2048 // int(d[1:])
        for seq in (512, 2048, 8192):
            for sections in (1, 2, 4, 8, 16, 32, 64):
                pairs = 16384 // seq * heads
                if sections > pairs:
                    continue
                costs = [t + args.overhead for t in item_tiles(seq, rows if seq >= 2048 else 128, pairs, sections)]
                s = spread(costs)
                print(f"{d} causal {seq:5d}, sections of {sections:2d} pairs: "
                      + ", ".join(f"{k} {v:.3f}" for k, v in s.items()))
