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
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
import schedules.attention_cpu as ac  # noqa: E402
from compiler import compile_model, load  # noqa: E402
from compiler.pipeline import Options  # noqa: E402

VARIANTS = {"rule": None, "6x4": [(64, 6), (16, 8), (32, 8)], "2x8": [(32, 8), (16, 8)]}
shapes = [(2, 512, 8, 64), (1, 197, 12, 64)]
for b, s, h, d in shapes:
    node = helper.make_node("Attention", ["q", "k", "v"], ["y"], q_num_heads=h, kv_num_heads=h)
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, (b, s, h * d)) for n in "qkvy"]
    m = helper.make_model(helper.make_graph([node], "a", io[:3], io[3:]), opset_imports=[helper.make_opsetid("", 23)])
    m.ir_version = 10
    tmp = Path(tempfile.mkdtemp()); onnx.save(m, tmp / "a.onnx")
    rng = np.random.default_rng(0)
    x = {n: rng.standard_normal((b, s, h * d)).astype("float32") for n in "qkv"}
    runners = {}
    for name, blk in VARIANTS.items():
        with mock.patch.object(ac, "blocks", (lambda t, blk=blk: blk) if blk else ac.blocks):
            compile_model(tmp / "a.onnx", "cpu", tmp / f"{name}.tvmpkg", options=Options())
        runners[name] = load(str(tmp / f"{name}.tvmpkg"))
    ref = runners["rule"](**x)["y"]
    for n, r in runners.items():
        err = np.abs(r(**x)["y"] - ref).max(); assert err < 1e-4, (n, err)
    res = {n: [] for n in runners}
    for rnd in range(8):
        for n in random.Random(rnd).sample(list(runners), len(runners)):
            res[n] += list(runners[n].time(x, repeat=10, warmup=5).ms)
    base = np.median(res["rule"])
    print(b, s, h, d, {n: f"{np.median(v):.3f} ({np.min(v):.3f}) {base / np.median(v):.3f}x" for n, v in res.items()}, flush=True)
