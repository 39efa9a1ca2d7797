"""Register blocks of the CPU attention kernel (``schedules.attention_cpu.blocks``) other than the rule's on this CPU,
float32, interleaved in 8 rounds (median (best) ms, and the rule's median over each's).

    python benchmarks/results/rerun/attention-cpu-intel/blocks.py
"""

import random
import sys
import tempfile
from pathlib import Path
from unittest import mock

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
import schedules.attention_cpu as ac  # noqa: E402
from benchmarks.attention import onnx_attention  # noqa: E402
from benchmarks.common import interleaved  # noqa: E402
from compiler import compile_model, load  # noqa: E402

VARIANTS = {"rule": None, "6x4": [(64, 6), (16, 8), (32, 8)], "2x8": [(32, 8), (16, 8)]}
for b, s, h, d in [(2, 512, 8, 64), (1, 197, 12, 64)]:
    tmp = Path(tempfile.mkdtemp())
    model, shapes = onnx_attention((b, s, s, h, h, d), "float32")
    onnx.save(model, tmp / "a.onnx")
    rng = np.random.default_rng(0)
    x = {n: rng.standard_normal(shapes[n]).astype("float32") for n in "qkv"}
    runners = {}
    for name, blk in VARIANTS.items():
        with mock.patch.object(ac, "blocks", (lambda t, blk=blk: blk) if blk else ac.blocks):
            compile_model(tmp / "a.onnx", "cpu", tmp / f"{name}.tvmpkg")
        runners[name] = load(str(tmp / f"{name}.tvmpkg"))
    ref = runners["rule"](**x)["y"]
    for name, runner in runners.items():
        err = np.abs(runner(**x)["y"] - ref).max()
        assert err < 1e-4, (name, err)
    res = interleaved({n: lambda r=r: list(r.time(x, repeat=10, warmup=5).ms) for n, r in runners.items()}, 8,
                      order=lambda i: random.Random(i).sample(list(runners), len(runners)), pause=lambda: None)
    base = np.median(res["rule"])
    print(b, s, h, d, {n: f"{np.median(v):.3f} ({np.min(v):.3f}) {base / np.median(v):.3f}x" for n, v in res.items()},
          flush=True)
