"""A Llama-style decoding step's attention block with a KV cache, as transformers writes it (grouped K/V heads
repeated to the query heads by ``repeat_kv``: unsqueeze, expand, reshape; eager attention with an additive mask; the
cache in [batch, heads, seq, dim], the new key concatenated and returned), exported by torch.onnx, compiled for this
CPU by tvmpipe, again without FuseAttention seeing through the repeat (``_grouped``), again with the cache's
concatenation left to TVM's default lowering (no ``cpu_elementwise._partition``), and run by onnxruntime; each
checked against onnxruntime, timed in interleaved rounds (10 calls a turn), and profiled per kernel:

    python benchmarks/results/rerun/attention-kv-cache-step/step.py    # -> step.json beside this file
"""
import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path
from unittest import mock

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3]))
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import compiler.passes.attention as fuse  # noqa: E402
import schedules.cpu_elementwise as elementwise  # noqa: E402
from benchmarks.common import interleaved  # noqa: E402
from compiler import compile_model, load, targets  # noqa: E402
from compiler.compare import OrtSession  # noqa: E402

H, HKV, D, HID, PAST = 32, 8, 128, 1024, 2047  # query heads, K/V heads, head dim, hidden, cached tokens


class Step(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.o = nn.Linear(HID, H * D, bias=False), nn.Linear(H * D, HID, bias=False)
        self.k, self.v = nn.Linear(HID, HKV * D, bias=False), nn.Linear(HID, HKV * D, bias=False)

    def forward(self, x, mask, past_k, past_v):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, H, D).transpose(1, 2)
        k = torch.cat([past_k, self.k(x).view(b, s, HKV, D).transpose(1, 2)], dim=2)
        v = torch.cat([past_v, self.v(x).view(b, s, HKV, D).transpose(1, 2)], dim=2)

        def repeat_kv(t):  # transformers' models/llama
            n, kvh, slen, d = t.shape
            return t[:, :, None, :, :].expand(n, kvh, H // HKV, slen, d).reshape(n, H, slen, d)

        w = torch.matmul(q, repeat_kv(k).transpose(2, 3)) / D ** 0.5 + mask
        a = torch.matmul(torch.softmax(w, dim=-1), repeat_kv(v))
        return self.o(a.transpose(1, 2).reshape(b, s, H * D)), k, v


def main() -> None:
    torch.manual_seed(0)
    records = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "step.onnx"
        args = (torch.randn(1, 1, HID), torch.zeros(1, 1, 1, PAST + 1), torch.randn(1, HKV, PAST, D),
                torch.randn(1, HKV, PAST, D))
        torch.onnx.export(Step().eval(), args, str(path), input_names=["x", "mask", "past_k", "past_v"],
                          output_names=["y", "present_k", "present_v"], opset_version=17, dynamo=False)
        runners = {}
        variants = {"tvmpipe": contextlib.nullcontext(), "tvmpipe-repeated": mock.patch.object(fuse, "_grouped", lambda *_: None),
                    "tvmpipe-concat-default": mock.patch.object(elementwise, "_partition", lambda *_: False)}
        for impl, patch in variants.items():
            with patch:
                compile_model(path, "cpu", Path(tmp) / f"{impl}.tvmpkg")
            runners[impl] = load(str(Path(tmp) / f"{impl}.tvmpkg"))
        x = runners["tvmpipe"].random_inputs(0)
        ort = OrtSession(str(path), threads=os.cpu_count())
        ref = ort(x)
        for impl, runner in runners.items():
            out = runner(**x)
            records[impl] = {"max_rel_err": max(float(np.abs(out[n] - ref[n]).max() / np.abs(ref[n]).max()) for n in ref),
                             "kernels": [{"kernel": k.name, "ms": k.ms, "calls": k.calls} for k in runner.profile(x)]}
        turns = {impl: (lambda r=runner: r.time(x, repeat=10, warmup=3).ms) for impl, runner in runners.items()}
        turns["onnxruntime"] = lambda: ort.time(x, repeat=10, warmup=3)
        times = interleaved(turns, 7)
    for impl, ms in times.items():
        records.setdefault(impl, {}).update(ms=float(np.median(ms)), min_ms=min(ms), runs=len(ms))
        print(impl, f"median {np.median(ms):.3f} ms, best {min(ms):.3f}", flush=True)
    (HERE / "step.json").write_text(json.dumps({"cpu": targets.resolve("cpu").isa_summary(), "load_avg": os.getloadavg(),
                                                "shape": {"heads": H, "kv_heads": HKV, "d": D, "hidden": HID,
                                                          "cached": PAST}, "records": records}, indent=1))


if __name__ == "__main__":
    main()
