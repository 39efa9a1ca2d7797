"""Decoding steps (one query row per head, or a few, and a KV cache) on the GPU: tvmpipe's CUDA decode kernel
(``schedules/attention_cuda_decode.py``), against the prefill kernels it replaces there (``tvmpipe-prefill``: 64-row
query tiles for one row), each of its two forms (``tvmpipe-simt``: CUDA cores, ``tvmpipe-tc``: tensor cores; one is
the default) and torch SDPA, on the same fp16 tensors; the default package recorded into one CUDA graph
(``tvmpipe-graph``, ``Runner.capture``) against torch's SDPA replayed from a CUDA graph (``torch-graph``), each timed
per call (its launch latency included), and each against torch's graph issued ``PIPELINE`` calls back to back
(``-pipelined``: the GPU's time per call where the host keeps ahead, as between a model's kernels), and each
kernel's GPU time (``kernels_us``, CUPTI). ONNX ``Attention`` nodes (grouped heads as they are) compiled here for
cuda-sm90, checked against float64 and timed there.

Whole steps with the cache (``STEP_CASES``): the node also takes ``past_key`` / ``past_value`` ([batch, heads, seq,
dim]) and returns them with the new keys appended; the kernel reads them in place (``tvmpipe``) or after the
transposes to its own layout that this replaced (``tvmpipe-transposed``); the append on ``gpu_elementwise``'s vectors
or DLight's default (``tvmpipe-concat-dlight``); against torch's ``cat`` + SDPA.

    python benchmarks/attention_decode.py --build [--variants]    # here: build/gpu/decode/*.tvmpkg
    python3 benchmarks/attention_decode.py --run --out DIR        # GPU machine -> DIR/attention-decode-<gpu>.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.common import build_or_run, cuda_kernel_us, cuda_ms, gpu_slug, interleaved, rotation  # noqa: E402

BUILD = REPO / "build" / "gpu" / "decode"
# timing: ROUNDS rounds over every build and torch's backends, each round starting one later (load from elsewhere on
# the machine hits all alike), REPEAT calls a turn; a record's ms is the median of all its calls
ROUNDS, REPEAT = 5, 40
# "-pipelined" turns: PIPELINE calls back to back between two events, per call (the host's launches overlapping the
# GPU's work, as between a model's kernels): the GPU's time where the host keeps ahead, launch latency left out
PIPELINE = 20
# name -> (batch, query rows, keys, heads, K/V heads, head dim): Llama-style grouped heads at 2048 keys (8 MB of K/V:
# L2-resident from call to call), 32768 (134 MB) and batch 8 x 4096, and with 4 query rows (speculative decoding);
# GPT-2-medium-style heads at batch 4
CASES = {"gqa": (1, 1, 2048, 32, 8, 128), "gqa_32k": (1, 1, 32768, 32, 8, 128), "gqa_b8": (8, 1, 4096, 32, 8, 128),
         "gqa_b8_rows2": (8, 2, 4096, 32, 8, 128), "gqa_b8_rows4": (8, 4, 4096, 32, 8, 128),
         "mha": (4, 1, 1024, 16, 16, 64), "mha_rows4": (4, 4, 1024, 16, 16, 64),
         # more query rows than MAX_SEQ_Q (speculative decoding's draft tokens): tensor cores only
         "gqa_b8_rows8": (8, 8, 4096, 32, 8, 128), "mha_rows16": (4, 16, 1024, 16, 16, 64)}


# name -> (batch, new rows, cached keys, heads, K/V heads, head dim): a Llama-style step at 2048 keys, and batch 8 x 4096
STEP_CASES = {"gqa_step": (1, 1, 2047, 32, 8, 128), "gqa_b8_step": (8, 1, 4095, 32, 8, 128)}
# module (of schedules) -> its patched constants: the cache transposed to the kernel's layout first; its append on
# DLight's default schedule (a select per element: gpu_elementwise took none before)
STEP_VARIANTS = {"transposed": ("attention", {"_reads_in_place": lambda *_: False}),
                 "concat-dlight": ("gpu_elementwise", {"uses": lambda *_: True,
                                                       "_innermost_seams": lambda *_: None})}


def attention_model(path: Path, b, s, skv, h: int, hkv: int, d: int, past: int = 0) -> None:
    """An ONNX model of one ``Attention`` node (opset 23), fp16; with ``past`` cached keys, a step with the cache."""
    import onnx
    from onnx import TensorProto, helper

    shapes = {"q": (b, s, h * d), "k": (b, skv, hkv * d), "v": (b, skv, hkv * d)}
    outputs = {"y": (b, s, h * d)}
    if past:
        shapes.update(past_key=(b, hkv, past, d), past_value=(b, hkv, past, d))
        outputs.update(present_key=(b, hkv, past + skv, d), present_value=(b, hkv, past + skv, d))
    inputs = ["q", "k", "v", *(["", "past_key", "past_value"] if past else [])]
    node = helper.make_node("Attention", inputs, list(outputs), q_num_heads=h, kv_num_heads=hkv)
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT16, shape) for n, shape in {**shapes, **outputs}.items()]
    model = helper.make_model(helper.make_graph([node], "decode", io[:len(shapes)], io[len(shapes):]),
                              opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    onnx.save(model, path)


# other builds timed beside the default one (``tvmpipe``), by the module constants each is compiled with: the prefill
# kernels the decode kernel replaced; the decode kernel's two forms (``on_tensor_cores``; SIMT only up to MAX_SEQ_Q
# query rows), one of them the default
VARIANTS = {"prefill": {"fits": lambda *_: False}, "simt": {"on_tensor_cores": lambda *_: False},
            "tc": {"on_tensor_cores": lambda *_: True}}
# ... and those of them a query length over MAX_SEQ_Q takes (only the tensor-core form runs there)
LONG_VARIANTS = ("prefill",)
# with ``--variants``, also the tensor-core form with one of its constants changed (to choose them, as
# ``rerun/attention-decode-variants/`` chose the SIMT form's): ring steps, bytes of K per warp step, warps, CTAs per SM
TC_VARIANTS = {f"tc-{name}": {"on_tensor_cores": lambda *_: True, **patch} for name, patch in {
    "s2": {"TC_STAGES": 2}, "s4": {"TC_STAGES": 4}, "b8k": {"TC_STEP_BYTES": 8192}, "w8": {"TC_WARPS": 8},
    "waves4": {"WAVES": 4}}.items()}


def build(variants: dict) -> None:
    import importlib
    from unittest import mock

    from compiler import compile_model
    from schedules.attention_cuda_decode import MAX_SEQ_Q

    def compile_all(name: str, patches: dict) -> None:
        """The default package of ``name``'s model and one package per variant (``patches``: variant -> (module of
        schedules, its constants patched))."""
        manifest = compile_model(BUILD / f"{name}.onnx", "cuda-sm90", BUILD / f"{name}.tvmpkg")
        print(name, manifest["kernels"], flush=True)
        for variant, (module, patch) in patches.items():
            with mock.patch.multiple(importlib.import_module(f"schedules.{module}"), **patch):
                compile_model(BUILD / f"{name}.onnx", "cuda-sm90", BUILD / f"{name}-{variant}.tvmpkg")

    BUILD.mkdir(parents=True, exist_ok=True)
    for name, case in CASES.items():
        attention_model(BUILD / f"{name}.onnx", *case)
        patches = variants if case[1] <= MAX_SEQ_Q else {v: variants[v] for v in LONG_VARIANTS}
        compile_all(name, {variant: ("attention_cuda_decode", patch) for variant, patch in patches.items()})
    for name, (b, s, past, h, hkv, d) in STEP_CASES.items():
        attention_model(BUILD / f"{name}.onnx", b, s, s, h, hkv, d, past)
        compile_all(name, STEP_VARIANTS)


def run(out: Path) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from compiler.runtime import load

    def check(runner, b, s, skv, h, hkv, d):
        """Inputs, torch views of them, and the package's relative error against float64."""
        rng = np.random.default_rng(0)
        x = {"q": rng.standard_normal((b, s, h * d)), "k": rng.standard_normal((b, skv, hkv * d)),
             "v": rng.standard_normal((b, skv, hkv * d))}
        x = {n: a.astype(np.float16) for n, a in x.items()}
        ours = np.asarray(runner(**x)["y"], np.float64)
        heads = {"q": h, "k": hkv, "v": hkv}
        q, k, v = (torch.from_numpy(x[n]).cuda().view(b, -1, heads[n], d).transpose(1, 2) for n in "qkv")
        ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), enable_gqa=True)
        ref = ref.transpose(1, 2).reshape(b, s, h * d).cpu().numpy()
        return x, (q, k, v), float(np.linalg.norm(ours - ref) / np.linalg.norm(ref))

    def kernel_us(fn) -> dict[str, float]:
        """GPU microseconds per call of each kernel ``fn`` launches, over PIPELINE calls back to back."""
        return {name: k["us"] for name, k in cuda_kernel_us(fn, PIPELINE).items()}

    def graphed(fn):
        """``fn`` captured in a CUDA graph (its launches replayed without Python): the GPU time at its best."""
        fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return graph.replay

    records = []
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"attention-decode-{gpu_slug()}.json"

    def save(rec: dict) -> None:  # after every case: a failure later keeps what was measured
        records.append(rec)
        path.write_text(json.dumps(records, indent=1))

    def time_all(rec: dict, turns: dict) -> None:
        """Each turn's ``<impl>_ms`` into ``rec``: the median of its calls over ROUNDS rounds, each starting one later."""
        times = interleaved(turns, ROUNDS, order=rotation(list(turns)), pause=lambda: None)
        rec.update({f"{impl}_ms": float(np.median(ms)) for impl, ms in times.items()})
    for name, case in CASES.items():
        b, s, skv, h, hkv, d = case
        runner = load(str(BUILD / f"{name}.tvmpkg"))
        x, (q, k, v), err = check(runner, *case)
        rec = {"case": name, "batch": b, "seq_q": s, "seq_kv": skv, "heads": h, "kv_heads": hkv, "d": d,
               "dtype": "float16", "device": torch.cuda.get_device_name(0), "rel_err": err,
               "kv_bytes": 2 * b * skv * hkv * d * 2}
        graph = runner.capture(x)
        rec["graph_rel_err"] = check(graph, *case)[2]
        turns = {"tvmpipe": lambda r=runner: r.time(x, repeat=REPEAT, warmup=5).ms,
                 "tvmpipe-graph": lambda: graph.time(repeat=REPEAT, warmup=5).ms,
                 "tvmpipe-graph-pipelined": lambda: graph.time(repeat=REPEAT, warmup=1, number=PIPELINE).ms}
        built = [v for v in (*VARIANTS, *TC_VARIANTS) if (BUILD / f"{name}-{v}.tvmpkg").exists()]
        for variant in built:
            other = load(str(BUILD / f"{name}-{variant}.tvmpkg"))
            rec[f"{variant}_rel_err"] = check(other, *case)[2]
            turns[f"tvmpipe-{variant}"] = lambda r=other: r.time(x, repeat=REPEAT, warmup=5).ms
        for impl, backend in (("torch", None), ("torch-flash", SDPBackend.FLASH_ATTENTION),
                              ("torch-cudnn", SDPBackend.CUDNN_ATTENTION)):
            def sdpa(backend=backend):
                if backend is None:  # torch's own choice
                    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            turns[impl] = lambda fn=sdpa: cuda_ms(fn, repeat=REPEAT, warmup=5)
        replay = graphed(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
        turns["torch-graph"] = lambda: cuda_ms(replay, repeat=REPEAT, warmup=5)
        turns["torch-graph-pipelined"] = lambda: [t / PIPELINE for t in cuda_ms(
            lambda: [replay() for _ in range(PIPELINE)], repeat=REPEAT, warmup=1)]
        turns["tvmpipe-pipelined"] = lambda r=runner: r.time(x, repeat=REPEAT, warmup=5, number=PIPELINE).ms
        time_all(rec, turns)
        rec["kernels_us"] = {"tvmpipe": kernel_us(runner.bound(x)), "torch-graph": kernel_us(replay)}
        rec["tvmpipe_tbps"] = rec["kv_bytes"] / rec["tvmpipe_ms"] / 1e9
        rec["torch_vs_tvmpipe"] = rec["torch_ms"] / rec["tvmpipe_ms"]
        rec["torch-graph_vs_tvmpipe"] = rec["torch-graph_ms"] / rec["tvmpipe-graph_ms"]  # both replayed as graphs
        rec["pipelined_torch-graph_vs_tvmpipe"] = rec["torch-graph-pipelined_ms"] / rec["tvmpipe-pipelined_ms"]
        rec["pipelined_graph_vs_graph"] = rec["torch-graph-pipelined_ms"] / rec["tvmpipe-graph-pipelined_ms"]
        rec["prefill_vs_tvmpipe"] = rec["tvmpipe-prefill_ms"] / rec["tvmpipe_ms"]
        if "tvmpipe-simt_ms" in rec:  # > 1: the tensor-core form is faster
            rec["tc_vs_simt"] = rec["tvmpipe-simt_ms"] / rec["tvmpipe-tc_ms"]
        print(json.dumps(rec), flush=True)
        save(rec)
    for name, (b, s, past, h, hkv, d) in STEP_CASES.items():
        rng = np.random.default_rng(0)
        x = {"q": rng.standard_normal((b, s, h * d)), "k": rng.standard_normal((b, s, hkv * d)),
             "v": rng.standard_normal((b, s, hkv * d)), "past_key": rng.standard_normal((b, hkv, past, d)),
             "past_value": rng.standard_normal((b, hkv, past, d))}
        x = {n: a.astype(np.float16) for n, a in x.items()}
        t = {n: torch.from_numpy(a).cuda() for n, a in x.items()}
        q = t["q"].view(b, s, h, d).transpose(1, 2)

        def step(dtype=torch.float16):  # torch: the cache's cat, then SDPA
            k, v = (torch.cat([t[f"past_{c}"], t[c[0]].view(b, s, hkv, d).transpose(1, 2)], 2).to(dtype)
                    for c in ("key", "value"))
            return F.scaled_dot_product_attention(q.to(dtype), k, v, enable_gqa=True), k, v

        ref_y, ref_k, _ = (r.cpu().numpy() for r in step(torch.float64))
        ref_y = ref_y.transpose(0, 2, 1, 3).reshape(b, s, h * d)
        rec = {"case": name, "batch": b, "seq_q": s, "cached": past, "heads": h, "kv_heads": hkv, "d": d,
               "dtype": "float16", "device": torch.cuda.get_device_name(0)}
        turns = {"torch": lambda: cuda_ms(step, repeat=REPEAT, warmup=5)}
        replay = graphed(step)
        turns["torch-graph"] = lambda: cuda_ms(replay, repeat=REPEAT, warmup=5)
        for impl in ["tvmpipe", *(f"tvmpipe-{v}" for v in STEP_VARIANTS)]:
            runner = load(str(BUILD / f"{name}{impl[len('tvmpipe'):]}.tvmpkg"))
            calls = {impl: runner}
            if impl == "tvmpipe":
                ours, graph = runner.bound(x), runner.capture(x)
                calls["tvmpipe-graph"] = graph
                turns["tvmpipe-graph"] = lambda: graph.time(repeat=REPEAT, warmup=5).ms
            for label, call in calls.items():
                got = call(**x)
                rec[f"{label}_rel_err"] = float(np.linalg.norm(got["y"] - ref_y) / np.linalg.norm(ref_y))
                rec[f"{label}_cache_exact"] = bool(np.array_equal(got["present_key"], ref_k.astype(np.float16)))
            rec[f"{impl}_kernels"] = [{"kernel": k.name, "ms": k.ms, "calls": k.calls} for k in runner.profile(x)]
            turns[impl] = lambda r=runner: r.time(x, repeat=REPEAT, warmup=5).ms
        time_all(rec, turns)
        rec["kernels_us"] = {"tvmpipe": kernel_us(ours), "torch-graph": kernel_us(replay)}
        rec["transposed_vs_tvmpipe"] = rec["tvmpipe-transposed_ms"] / rec["tvmpipe_ms"]
        rec["concat-dlight_vs_tvmpipe"] = rec["tvmpipe-concat-dlight_ms"] / rec["tvmpipe_ms"]
        rec["torch-graph_vs_tvmpipe"] = rec["torch-graph_ms"] / rec["tvmpipe-graph_ms"]
        print(json.dumps(rec), flush=True)
        save(rec)
    print(f"wrote {path}")


def main() -> None:
    ap = build_or_run(__doc__, "packages")
    ap.add_argument("--variants", action="store_true", help="--build: also the tensor-core form's TC_VARIANTS")
    args = ap.parse_args()
    build({**VARIANTS, **(TC_VARIANTS if args.variants else {})}) if args.build else run(args.out)


if __name__ == "__main__":
    main()
