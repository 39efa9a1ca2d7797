"""Check (issue #5, 2026-12-06 10:1x, H100): whole encoder blocks whose attention takes the persistent wgmma kernel with
the TMA store (fp16, 4 heads of 128, seq 512 and 2048, causal at 512), compiled by the pipeline and checked against
onnxruntime (float32 twin) with attention_e2e's models and tolerance; its own shapes (seq 128 / 256) take mma.sync.

    python3 benchmarks/results/rerun/attention-tma-store/e2e-check/check.py --build   # here: build/gpu/e2e-long/
    python3 benchmarks/results/rerun/attention-tma-store/e2e-check/check.py --run     # GPU machine
"""
import json, sys
from pathlib import Path
REPO = Path(__file__).resolve().parents[5]
sys.path.insert(0, str(REPO)); sys.path.insert(0, str(REPO / "benchmarks"))
import attention_e2e as E
E.HEADS, E.HEAD_DIM = 4, 128
E.CONFIGS["gpu"] = ("float16", 1, 2, {"bert512": ("bert", 2, 512), "gpt512": ("sdpa_causal", 2, 512),
                                      "bert2048": ("bert", 1, 2048)})
E.VARIANTS = ("fused",)
here = REPO / "build" / "gpu" / "e2e-long"
if sys.argv[1:] == ["--build"]:
    here.mkdir(parents=True, exist_ok=True)
    (here / "plan.json").write_text(json.dumps(E.build("gpu", here), indent=1))
else:
    from compiler.runtime import load_cuda_runtime
    load_cuda_runtime()
    E.check("gpu", here)
