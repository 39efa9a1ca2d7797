"""Check (issue #5, 2026-12-06): whole causal encoder blocks (fp16, GPT-style causal prefill) at lengths that the
query tiles do not divide, compiled by the pipeline and checked against onnxruntime (float32 twin) with
attention_e2e's models and tolerance. Each takes a path of the query tiles aligned to the sequence's end
(``TileConfig.end_aligned``): d64 at 1000 rows the persistent kernel whose first warpgroup's rows start before the
sequence (stored from registers, O's own buffer) and at 2500 the 192-row tiles (the first starting 188 rows before
it); d128 at 1000 the persistent kernel staging O in a K/V stage (released without a TMA store), at 5000 one CTA per
128-row tile.

    python3 benchmarks/results/rerun/attention-end-aligned/e2e-check/check.py --build   # here: build/gpu/e2e-aligned/
    python3 benchmarks/results/rerun/attention-end-aligned/e2e-check/check.py --run     # GPU machine
"""
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[5]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
import attention_e2e as E  # noqa: E402

SETS = {64: (8, {"gpt1000_d64": ("sdpa_causal", 1, 1000), "gpt2500_d64": ("sdpa_causal", 1, 2500)}),
        128: (4, {"gpt1000_d128": ("sdpa_causal", 1, 1000), "gpt5000_d128": ("sdpa_causal", 1, 5000)})}
E.VARIANTS = ("fused",)
BUILD = REPO / "build" / "gpu" / "e2e-aligned"


def configure(d: int) -> Path:
    """attention_e2e's GPU models for head dim ``d``; their build folder."""
    E.HEADS, E.HEAD_DIM = SETS[d][0], d
    E.CONFIGS["gpu"] = ("float16", 1, 2, SETS[d][1])
    return BUILD / f"d{d}"


if sys.argv[1:] == ["--build"]:
    for d in SETS:
        here = configure(d)
        here.mkdir(parents=True, exist_ok=True)
        (here / "plan.json").write_text(json.dumps(E.build("gpu", here), indent=1))
else:
    from compiler.runtime import load_cuda_runtime

    load_cuda_runtime()
    for d in SETS:
        E.check("gpu", configure(d))
