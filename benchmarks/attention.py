"""Fused attention on the GPU: correctness vs a float64 reference, then TFLOP/s of tvmpipe's kernel next
to torch SDPA's flash and cuDNN backends, in the same run on the same inputs.

    python3 benchmarks/attention.py --build            # here (TVM compiler): build/gpu/attention/attention.so
    python3 benchmarks/attention.py --run --out DIR    # GPU machine (TVM runtime + torch): DIR/attention-<gpu>.json + .png
    python3 benchmarks/attention.py --cpu              # this CPU: fused kernel vs TVM's unfused lowering and onnxruntime
    python3 benchmarks/attention.py --cpu --cpu-baseline old.py   # and another attention_cpu.py's kernel (A/B)
    python3 benchmarks/attention.py --summary FILE     # per shape: rule's choice, best tile config, torch (from --run's JSON)

A/B of a kernel change: ``--build --rule-only --cases ... --dir build/gpu/attention-new`` with the change, then
``--run --dir build/gpu/attention-new --baseline build/gpu/attention`` (the baseline's rule kernels as variants).

``--build`` compiles every kernel below (static shapes, sm_90a, cubin + PTX via NVRTC) into ONE library:
the kernel our schedule rule picks (impl "tvmpipe"), plus, for the benchmark shapes, the other tile
configurations of the tensor-core kernel (records with a "variant"), so one GPU run can tell which
configuration the rule should pick. ``--run`` loads it with the TVM runtime alone. Benchmarks: batch x seq = 16384 tokens, hidden 2048
(heads = 2048 / d), fp16, d in {64, 128}, seq in {512, 2048, 8192}, causal or not; TFLOP/s counts
4·b·h·s²·d, halved for causal. Each kernel of a case is checked first; then all of them and torch's backends
are timed in ``ROUNDS`` interleaved rounds, each in a random order (the median kept, each round's in
``ms_rounds``), so that no kernel is always timed first or right after the same other. One failure is recorded, the
rest go on.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import traceback
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.common import gpu_slug, interleaved  # noqa: E402

BUILD = REPO / "build" / "gpu" / "attention"
LIB = BUILD / "attention.so"
TOKENS, HIDDEN = 16384, 2048
TOL = {"float16": 4e-3, "bfloat16": 3e-2, "float32": 1e-4}
# Timing rounds, interleaved over a case's kernels and torch's backends, each round in its own (seeded) random order;
# a record's ms is its median round. Each timing follows as many untimed runs of the same kernel. The H200's clocks
# fall under sustained tensor-core load: the first kernel timed after a pause ran up to 26 % faster than in the
# next round without that warm-up, and still up to 10 % with it, so a fixed order with the best round favoured it.
# Rounds that only rotated one order kept each kernel behind the same one: the rule's kernel always ran right after
# cuDNN's and, in every round but the first, 10-20 % slower than the same configuration built as a variant.
# 9 rounds: with 5, byte-identical kernels of two builds timed side by side differed by 0.97-1.08x (H100,
# 2026-12-06 11:08, the README's H100 table of 11:08 in rerun/attention-end-aligned/); the table of 11:43 took 9.
ROUNDS = 9


@dataclass(frozen=True)
class Case:
    name: str
    batch: int
    seq_q: int
    seq_kv: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype: str = "float16"
    bias: str | None = None  # None, "padding" [b,1,1,kv], "mask" [1,h,q,kv], "masked-rows" [b,h,q,kv]
    causal: str | None = None  # None, "TopLeft", "BottomRight"
    bench: bool = False
    splits: tuple[int, ...] = ()  # SIMT kernel: lanes per query row to time besides the rule's choice (no torch)

    @property
    def bias_shape(self) -> tuple[int, ...] | None:
        b, h, q, kv = self.batch, self.heads, self.seq_q, self.seq_kv
        return {None: None, "padding": (b, 1, 1, kv), "mask": (1, h, q, kv), "masked-rows": (b, h, q, kv)}[self.bias]

    def canonical(self):
        """The canonical attention PrimFunc of this case's shapes (what the legalisation hands the rule)."""
        from tvm import te

        from schedules.attention import canonical_attention

        shapes = {"q": (self.batch, self.seq_q, self.heads, self.head_dim),
                  "k": (self.batch, self.seq_kv, self.kv_heads, self.head_dim),
                  "v": (self.batch, self.seq_kv, self.kv_heads, self.head_dim), "bias": self.bias_shape}
        args = [te.placeholder(shape, self.dtype, name) if shape else None for name, shape in shapes.items()]
        return canonical_attention(*args, 1 / math.sqrt(self.head_dim), self.causal or "none")

    @property
    def flops(self) -> float:
        full = 4 * self.batch * self.heads * self.seq_q * self.seq_kv * self.head_dim
        return full / 2 if self.causal else full

    def variants(self, spec) -> list:
        """Tile configurations to time besides the rule's choice (benchmark shapes only): the mma.sync kernel the rule
        picks without wgmma (sm_80's choice); the wgmma kernel without TMA that the rule picked before it
        (cp.async from every thread; causal up to 4096 rows with per-warpgroup diagonals); and the rule's TMA
        kernel with 2 computing warpgroups in ping-pong (``p``) or not, with 2 stages, with 2 computing warpgroups
        instead of 3 or 3 instead of 2 (d128: of 64-key tiles), and persistent (``P``) or not, whichever the rule
        did not pick (persistent: also with one Q buffer, and with the next item's first S carried or not, whichever
        the rule did not pick, ``TileConfig.carry``; not: without ping-pong), and without its peeled last key tile
        (``TileConfig.peel``); causal, in L2 sections of 1/2 to 1/16 as many (batch, head) pairs (``lpt_heads``). The
        correctness cases check the rule's wgmma kernel too, where it picks mma.sync for their short sequences."""
        from schedules.attention_cuda import (TC_DTYPES, TC_HEAD_DIMS, causal_launch, choose, cp_async_wgmma_config,
                                             wgmma_rule)
        from schedules.common import SMS

        chosen = choose(spec, wgmma=True)
        if not self.bench:
            wgmma = wgmma_rule(spec)
            tensor_cores = self.dtype in TC_DTYPES and self.head_dim in TC_HEAD_DIMS
            return [wgmma] if tensor_cores and wgmma != chosen else []
        before = cp_async_wgmma_config(self.head_dim)
        if self.causal:  # (in the rule's L2 sections: one where it keeps mma.sync)
            before = replace(causal_launch(before, spec), lpt_heads=chosen.lpt_heads)
        other = [choose(spec), before]
        if chosen.tma:  # ping-pong (of 2 computing warpgroups), 2 stages, the other count of computing warpgroups;
            # persistent or not, whichever the rule did not pick (persistent: also with 1 Q buffer for head_dim 64)
            other += [replace(chosen, warps=8, pingpong=not chosen.pingpong), replace(chosen, stages=2),
                      replace(chosen, warps=12 if chosen.warps == 8 else 8, bn=128 if self.head_dim <= 64 else 64,
                              q_bufs=1, pingpong=False)]
            if chosen.persistent:
                other += [replace(chosen, persistent=0, q_bufs=1, pingpong=False, carry=False),
                          replace(chosen, q_bufs=1)]
            else:
                other.append(replace(chosen, persistent=SMS["sm_90"]))
            other.append(replace(chosen, peel=False, carry=False))  # the last key tile in the loop (``z``)
            if chosen.persistent:  # the next item's first S carried behind the last P·V (``c``), or not
                other.append(replace(chosen, carry=not chosen.carry))
        if self.causal and chosen.lpt_heads:  # smaller L2 sections of the causal launch order (``lpt_heads``)
            other += [replace(chosen, lpt_heads=max(1, chosen.lpt_heads >> s)) for s in (1, 2, 3, 4)]
        # O leaves through TMA only from the persistent kernel with its last key tile peeled, and from the rule's
        # tile height: the variants that change either store it from the registers
        other = [c if c.persistent and c.peel and c.warps == chosen.warps else replace(c, tma_store=False) for c in other]
        return [c for c in other if c != chosen]


CASES = [
    Case(f"bench_d{d}_s{s}_{'causal' if c else 'full'}", TOKENS // s, s, s, HIDDEN // d, HIDDEN // d, d,
         causal="TopLeft" if c else None, bench=True)
    for d in (64, 128) for s in (512, 2048, 8192) for c in (False, True)
] + [
    Case("odd_seq", 2, 1000, 1000, 8, 8, 128),
    Case("causal_odd", 1, 777, 777, 4, 4, 64, causal="TopLeft"),
    Case("bf16_bottom_right", 2, 300, 1000, 4, 4, 128, "bfloat16", causal="BottomRight"),
    Case("key_padding", 3, 500, 500, 4, 4, 64, bias="padding"),
    Case("additive_mask_causal", 1, 333, 333, 8, 8, 128, bias="mask", causal="TopLeft"),
    Case("gqa_causal", 2, 1024, 1024, 16, 4, 128, causal="TopLeft"),
    Case("fully_masked_rows", 1, 200, 300, 2, 2, 64, bias="masked-rows"),
    Case("fallback_fp32", 1, 300, 300, 4, 4, 64, "float32", causal="TopLeft"),
    Case("fallback_d80", 2, 129, 129, 4, 4, 80),
    # long enough for the rule's wgmma kernel: key padding; grouped heads with a bottom-right causal mask
    Case("key_padding_long", 2, 1500, 1500, 4, 4, 128, bias="padding"),
    Case("gqa_causal_long", 1, 2100, 2300, 8, 2, 128, "bfloat16", causal="BottomRight"),
] + [  # the zoo's fp32 attention at batch 1 (CUDA cores): BERT-base (key padding), GPT-2 prefill (causal), ViT-B/16
    Case(f"zoo_fp32_{name}", 1, s, s, 12, 12, 64, "float32", bias=bias, causal=causal, splits=(1, 2, 4, 8, 16))
    for name, s, bias, causal in (("bert", 128, "padding", None), ("gpt2", 256, None, "TopLeft"), ("vit", 197, None, None))
]


def build(cases: list[Case] = CASES, lib: Path = LIB, variants: bool = True) -> None:
    """Schedule each case's canonical attention function with our rule (and, with ``variants``, its other tile
    configurations); compile all into one library ``lib``, its kernel names in ``kernels.json`` beside it."""
    import tvm

    from compiler import targets
    from compiler.build import Built
    from schedules.attention import Attention, AttentionSpec
    from schedules.attention_cuda import flash_mma, flash_simt

    info = targets.resolve("cuda-sm90")
    funcs = {}
    for case in cases:
        canonical = case.canonical()
        with info.target:
            sch = Attention().apply(canonical, info.target, False)
        funcs[case.name] = sch.mod["main"].with_attr("global_symbol", case.name)
        spec = AttentionSpec.of(canonical)
        for cfg in case.variants(spec) if variants else ():
            name = f"{case.name}__{cfg.name}"
            funcs[name] = flash_mma(spec, cfg).with_attr("global_symbol", name)
        for split in case.splits:
            name = f"{case.name}__split{split}"
            funcs[name] = flash_simt(spec, split).with_attr("global_symbol", name)
    lib.parent.mkdir(parents=True, exist_ok=True)
    gpu = Built(tvm.compile(tvm.IRModule(funcs), target=info.target), info).export(lib)
    (lib.parent / "kernels.json").write_text(json.dumps({"tvm": tvm.__version__, "kernels": sorted(funcs)}, indent=1))
    print(f"built {lib} ({lib.stat().st_size} bytes, {len(funcs)} kernels): {gpu}")


def run(out: Path, cases: list[Case] = CASES, rounds: int = ROUNDS, build_dir: Path = BUILD,
        baselines: list[Path] = ()) -> None:
    """Check and time every case's kernels of ``build_dir`` (and, A/B of a change, the rule's kernel of each
    ``baselines`` build, recorded as variant "baseline:<folder>") beside torch's backends."""
    import torch
    import torch.nn.functional as F
    import tvm
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from compiler.runtime import load_cuda_runtime

    load_cuda_runtime()  # a runtime-only TVM does not load its CUDA backend by itself
    lib = tvm.runtime.load_module(str(build_dir / LIB.name))
    kernels = json.loads((build_dir / "kernels.json").read_text())["kernels"]
    others = {f"baseline:{d.name}": tvm.runtime.load_module(str(d / LIB.name)) for d in baselines}
    dev = tvm.cuda(0)
    device = torch.cuda.get_device_name(0)
    tdt = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
    gen = torch.Generator("cuda").manual_seed(0)

    def inputs(case: Case) -> dict:
        def randn(*shape):
            return torch.randn(*shape, generator=gen, device="cuda", dtype=torch.float32).to(tdt[case.dtype])

        t = {"q": randn(case.batch, case.seq_q, case.heads, case.head_dim),
             "k": randn(case.batch, case.seq_kv, case.kv_heads, case.head_dim),
             "v": randn(case.batch, case.seq_kv, case.kv_heads, case.head_dim)}
        if case.bias == "padding":  # the last keys of each sequence are padding
            bias = torch.zeros(case.bias_shape, device="cuda")
            for i in range(case.batch):
                bias[i, ..., case.seq_kv - 17 * (i + 1):] = -math.inf
            t["bias"] = bias.to(tdt[case.dtype])
        elif case.bias:
            bias = randn(*case.bias_shape).float()
            if case.bias == "masked-rows":  # row 3 masked entirely (NaN out), row 5 over its first 130 keys
                bias[:, :, 3, :] = -math.inf
                bias[:, :, 5, :130] = -math.inf
            t["bias"] = bias.to(tdt[case.dtype])
        return t

    def reference(case: Case, t: dict, heads: list[int], batch: int) -> torch.Tensor:
        """float64 on the GPU, for the given query heads of ``batch`` batches; NaN for a row with no finite score."""
        g = case.heads // case.kv_heads
        q = t["q"][:batch, :, heads].double().transpose(1, 2)
        k = t["k"][:batch, :, [h // g for h in heads]].double().transpose(1, 2)
        v = t["v"][:batch, :, [h // g for h in heads]].double().transpose(1, 2)
        s = q @ k.transpose(-1, -2) / math.sqrt(case.head_dim)
        if "bias" in t:
            bias = t["bias"].double().expand(case.batch, case.heads, case.seq_q, case.seq_kv)
            s = s + bias[:batch, heads]
        if case.causal:
            offset = 0 if case.causal == "TopLeft" else abs(case.seq_q - case.seq_kv)
            rows = torch.arange(case.seq_q, device="cuda")[:, None]
            s = s.masked_fill(torch.arange(case.seq_kv, device="cuda")[None, :] > rows + offset, -math.inf)
        return (torch.softmax(s, -1) @ v).transpose(1, 2)

    def error(ours: torch.Tensor, ref: torch.Tensor) -> float:
        ours = ours.double()
        if not torch.equal(torch.isnan(ours), torch.isnan(ref)):
            return math.inf
        finite = ~torch.isnan(ref)
        return float((ours[finite] - ref[finite]).abs().max() / ref[finite].abs().max())

    def cuda_ms(fn, reps: int) -> float:
        """Mean ms of ``reps`` calls after as many untimed ones (see ``ROUNDS``)."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / reps

    records = []
    for case in cases:
        base = {"case": case.name, "d": case.head_dim, "seq": case.seq_q, "seq_kv": case.seq_kv, "batch": case.batch,
                "heads": case.heads, "kv_heads": case.kv_heads, "dtype": case.dtype, "bias": case.bias,
                "causal": bool(case.causal), "causal_mode": case.causal, "device": device}
        heads = sorted({0, case.heads - 1})  # checked against float64: first and last head, 1 batch when benchmarking
        batch = 1 if case.bench else case.batch
        reps = max(5, min(100, int(2e13 / case.flops)))
        first = len(records)
        timers = {}  # record -> a function that times it once (ms)
        t = None
        runs = [(lib, k, {"variant": k.split("__")[1]} if "__" in k else {})
                for k in [case.name] + [n for n in kernels if n.startswith(case.name + "__")]]
        runs += [(other, case.name, {"variant": name}) for name, other in others.items()]
        for klib, kernel, variant in runs:
            try:
                if t is None:
                    t = inputs(case)
                    torch.cuda.synchronize()  # TVM launches on its own stream
                o = torch.full_like(t["q"], math.nan)
                args = [tvm.runtime.from_dlpack(x) for x in [t[n] for n in ("q", "k", "v", "bias") if n in t] + [o]]
                klib[kernel](*args)
                torch.cuda.synchronize()
                err = error(o[:batch, :, heads], reference(case, t, heads, batch))
                records.append({**base, "impl": "tvmpipe", **variant, "max_rel_err": err, "correct": err <= TOL[case.dtype]})
                if case.bench or case.splits:
                    timers[len(records) - 1] = lambda m=klib, k=kernel, a=args: 1e3 * m.time_evaluator(
                        k, dev, number=reps, repeat=2)(*a).results[-1]
            except Exception as err:  # one failing case must not stop the others
                records.append({**base, "impl": "tvmpipe", **variant, "error": f"{type(err).__name__}: {err}",
                                "traceback": traceback.format_exc(limit=4)})
        if case.bench and t is not None:
            q, k, v = (t[n].transpose(1, 2) for n in ("q", "k", "v"))  # torch's (b, h, s, d) views of the same data
            for impl, backend in (("torch-flash", SDPBackend.FLASH_ATTENTION), ("torch-cudnn", SDPBackend.CUDNN_ATTENTION)):
                def sdpa(backend=backend):
                    with sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(q, k, v, is_causal=bool(case.causal))

                try:
                    err = error(sdpa().transpose(1, 2)[:1, :, heads], reference(case, t, heads, 1))
                    records.append({**base, "impl": impl, "max_rel_err": err})
                    timers[len(records) - 1] = lambda f=sdpa: cuda_ms(f, reps)
                except Exception as err:
                    records.append({**base, "impl": impl, "error": f"{type(err).__name__}: {err}"})
        # timed after every check, in interleaved rounds of random order (see ROUNDS)
        order = list(timers)
        shuffle = random.Random(0).shuffle
        for _ in range(rounds if order else 0):
            shuffle(order)
            for i in order:
                try:
                    records[i].setdefault("ms_rounds", []).append(timers[i]())
                except Exception as err:
                    records[i]["error"] = f"{type(err).__name__}: {err}"
        for i in timers:
            if records[i].get("ms_rounds"):
                ms = statistics.median(records[i]["ms_rounds"])
                records[i].update(ms=ms, tflops=case.flops / ms / 1e9)
        for rec in records[first:]:
            print(json.dumps(rec), flush=True)
        t = q = k = v = o = args = timers = None
        torch.cuda.empty_cache()

    slug = gpu_slug()
    out.mkdir(parents=True, exist_ok=True)
    (out / f"attention-{slug}.json").write_text(json.dumps(records, indent=1))
    plot(records, out / f"attention-{slug}.png", device)
    for r in records:  # one line per measurement, for reading the log
        print(f"{r['case']:34} {r['impl']:12} {r.get('variant', ''):12} {r.get('tflops', 0):7.1f} TFLOP/s  "
              f"err {r.get('max_rel_err', math.nan):.1e}  {r.get('error', '')[:80]}")
    summary(records)


def summary(records: list[dict]) -> None:
    """Per benchmark shape: the rule's kernel, the best tile configuration and torch's backends (TFLOP/s)."""
    print(f"{'case':26} {'tvmpipe':>8} {'best':>8} {'variant':16} {'flash':>7} {'cudnn':>7} {'rule/flash':>10} {'best/flash':>10}")
    for case in dict.fromkeys(r["case"] for r in records if r.get("tflops")):
        rows = [r for r in records if r["case"] == case and r.get("tflops") and r.get("correct", True)]
        ours = {r.get("variant", "rule"): r["tflops"] for r in rows if r["impl"] == "tvmpipe"}
        torch = {r["impl"]: r["tflops"] for r in rows if r["impl"] != "tvmpipe"}
        best = max(ours, key=ours.get)
        flash = torch.get("torch-flash", math.nan)
        print(f"{case.removeprefix('bench_'):26} {ours.get('rule', math.nan):8.1f} {ours[best]:8.1f} {best:16} {flash:7.1f} "
              f"{torch.get('torch-cudnn', math.nan):7.1f} {ours.get('rule', math.nan) / flash:10.2f} {ours[best] / flash:10.2f}")


CPU_SHAPES = [(2, 512, 8, 64), (1, 197, 12, 64)]  # (batch, seq, heads, head dim): the GPU benchmark's kind; ViT-B's
# ((batch, query rows, keys, heads, key/value heads, head dim), dtype, causal, mask): each shape in float32 and float16,
# causal and not, unmasked; BERT-base as the transformers exporter writes it, the padding mask expanded to a
# [1, 1, s, s] additive bias, at 128 and 512 tokens; decoding steps with a KV cache of 1024-2048 keys: a Llama-style
# model's (32 query heads sharing 8 key/value heads of 128), one query row and 4 (speculative decoding), and GPT-2-medium
# style multi-head attention at batch 4
CPU_CASES = [((b, s, s, h, h, d), dtype, causal, False) for b, s, h, d in CPU_SHAPES for dtype in ("float32", "float16")
             for causal in (False, True)] + [((1, s, s, 12, 12, 64), "float32", False, True) for s in (128, 512)] + [
             ((1, 1, 2048, 32, 8, 128), "float32", False, False), ((1, 4, 2048, 32, 8, 128), "float32", False, False),
             ((4, 1, 1024, 16, 16, 64), "float32", False, False)]


def onnx_attention(shape: tuple[int, ...], dtype: str, causal: bool = False, masked: bool = False):
    """One ONNX ``Attention`` (opset 23) node as a user's model holds it, for ``shape`` = (batch, query rows, keys, heads,
    key/value heads, head dim), and the shapes of q, k, v and y; ``masked``: a [1, 1, s, keys] additive mask input."""
    from onnx import TensorProto, helper

    b, s, skv, h, hkv, d = shape
    elem = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}[dtype]
    names = ["q", "k", "v"] + (["mask"] if masked else [])
    node = helper.make_node("Attention", names, ["y"], q_num_heads=h, kv_num_heads=hkv, is_causal=int(causal))
    shapes = {"q": (b, s, h * d), "k": (b, skv, hkv * d), "v": (b, skv, hkv * d), "y": (b, s, h * d)}
    io = [helper.make_tensor_value_info(n, elem, shape) for n, shape in shapes.items()]
    if masked:
        io.insert(3, helper.make_tensor_value_info("mask", elem, [1, 1, s, skv]))
    model = helper.make_model(helper.make_graph([node], "attention", io[:-1], io[-1:]),
                              opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    return model, shapes


def cpu(out: Path, rounds: int = 5, baseline: Path | None = None) -> None:
    """Latency on this CPU of one ONNX ``Attention`` (opset 23) node, as a user's model holds it: compiled by tvmpipe
    (the fused kernel), by tvmpipe ``--no-custom-schedules`` (TVM's unfused lowering), and run by onnxruntime;
    each checked against float64, timed in ``rounds`` interleaved rounds (median and best). ``baseline``: another
    version of ``schedules/attention_cpu.py`` (e.g. ``git show REV:schedules/attention_cpu.py``), whose kernel is
    compiled the same way (for every shape: not the decode kernel) and timed in the same rounds as
    "tvmpipe-baseline"."""
    import contextlib
    import importlib.util
    import os
    import platform
    import tempfile
    from unittest import mock

    import numpy as np
    import onnx

    import schedules.attention_cpu
    import schedules.attention_cpu_decode
    from compiler import compile_model, load, targets
    from compiler.compare import OrtSession, errors
    from compiler.pipeline import Options

    builds = {"tvmpipe": (True, []), "tvm-unfused": (False, [])}  # impl -> (custom schedules, patches while compiling)
    if baseline:  # loaded inside the package, so that its relative imports resolve
        spec = importlib.util.spec_from_file_location("schedules._baseline_attention_cpu", baseline)
        old = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(old)
        builds["tvmpipe-baseline"] = (True, [mock.patch.object(schedules.attention_cpu, "kernel", old.kernel),
                                             mock.patch.object(schedules.attention_cpu_decode, "fits", lambda *_: False)])
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for (b, s, skv, h, hkv, d), dtype, causal, masked in CPU_CASES:
            model, shapes = onnx_attention((b, s, skv, h, hkv, d), dtype, causal, masked)
            path = Path(tmp) / "attention.onnx"
            onnx.save(model, path)
            rng = np.random.default_rng(0)
            inputs = {n: rng.standard_normal(shapes[n]).astype(dtype) for n in "qkv"}
            if masked:  # the last eighth of the keys padding, at the exporter's finfo.min
                inputs["mask"] = np.zeros((1, 1, s, skv), dtype)
                inputs["mask"][..., -skv // 8 :] = np.finfo(dtype).min
            qkv = (inputs[n].reshape(*shapes[n][:2], -1, d) for n in "qkv")
            ref = {"y": _reference_bshd(*qkv, causal, inputs.get("mask")).reshape(b, s, h * d)}
            impls = {}
            for impl, (custom, patches) in builds.items():
                with contextlib.ExitStack() as stack:
                    for patch in patches:
                        stack.enter_context(patch)
                    compile_model(path, "cpu", Path(tmp) / f"{impl}.tvmpkg", options=Options(custom_schedules=custom))
                runner = load(str(Path(tmp) / f"{impl}.tvmpkg"))
                impls[impl] = (runner(**inputs), lambda n, r=runner: r.time(inputs, repeat=n, warmup=n).ms)
            ort = OrtSession(str(path), threads=os.cpu_count())
            impls["onnxruntime"] = (ort(inputs), lambda n: ort.time(inputs, repeat=n, warmup=n))
            # each round in its own order; each turn as many untimed runs as timed (the unfused lowering: ~1 s a call)
            times = interleaved({impl: lambda t=timer, n=1 if impl == "tvm-unfused" else 5: t(n)
                                 for impl, (_, timer) in impls.items()}, rounds,
                                order=lambda r, seed=len(records): random.Random(seed + r).sample(list(impls), len(impls)))
            flops = 4 * b * h * s * skv * d / (2 if causal else 1)
            for impl, (result, _) in impls.items():
                ms = float(np.median(times[impl]))
                err = errors(result, ref)["max_rel_err"]
                records.append({"impl": impl, "dtype": dtype, "causal": causal, "mask": [1, 1, s, skv] if masked else None,
                                "batch": b, "seq": s, "seq_kv": skv, "heads": h, "kv_heads": hkv, "d": d, "ms": ms, "min_ms": min(times[impl]), "runs": len(times[impl]),
                                "gflops": flops / ms / 1e6, "max_rel_err": err, "correct": err <= CPU_TOL[dtype],
                                "cores": os.cpu_count(), "load_avg": list(os.getloadavg())})
                print(json.dumps(records[-1]), flush=True)
    out.mkdir(parents=True, exist_ok=True)
    machine = {"machine": platform.machine(), "cpu": targets.resolve("cpu").isa_summary(), "rounds": rounds,
               "baseline": str(baseline) if baseline else None}
    (out / "attention-cpu.json").write_text(json.dumps(machine | {"records": records}, indent=1))


CPU_TOL = {"float32": 1e-4, "float16": 5e-3}  # normwise relative error against float64


def _reference_bshd(q, k, v, causal: bool, bias=None):
    """softmax(q kᵀ / sqrt(d) (+ bias) (+ causal mask)) v in float64, [batch, seq, heads, dim], k and v's heads each
    shared by as many of q's as that takes (an independent reference)."""
    import numpy as np

    group = q.shape[2] // k.shape[2]
    k, v = (np.repeat(t, group, axis=2) for t in (k, v))
    q, k, v = (np.asarray(t, np.float64).transpose(0, 2, 1, 3) for t in (q, k, v))
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    if bias is not None:
        scores = scores + np.asarray(bias, np.float64)
    if causal:
        scores = np.where(np.tril(np.ones(scores.shape[-2:], bool)), scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return ((p / p.sum(-1, keepdims=True)) @ v).transpose(0, 2, 1, 3)


def plot(records: list[dict], path: Path, device: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(16, 4), sharey=True)
    panels = [(d, c) for d in (64, 128) for c in (False, True)]
    for ax, (d, causal) in zip(axes, panels):
        bench = [r for r in records if r.get("tflops") and r["dtype"] == "float16" and r["d"] == d and r["causal"] == causal]
        lines = {impl: [r for r in bench if r["impl"] == impl and "variant" not in r]
                 for impl in ("tvmpipe", "torch-flash", "torch-cudnn")}
        best = {}
        for r in bench:
            if r["impl"] == "tvmpipe" and r["tflops"] > best.get(r["seq"], {"tflops": 0})["tflops"]:
                best[r["seq"]] = r
        lines["tvmpipe, best tile config"] = list(best.values())
        for label, rows in lines.items():
            if rows:
                pts = sorted((r["seq"], r["tflops"]) for r in rows)
                ax.plot(*zip(*pts), marker="o", label=label, linestyle="--" if "best" in label else "-")
        ax.set(title=f"d={d} {'causal' if causal else 'non-causal'}", xlabel="seq (batch·seq = 16384)")
        ax.set_xscale("log", base=2)
        ax.minorticks_off()
        ax.set_xticks([512, 2048, 8192], ["512", "2048", "8192"])
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("TFLOP/s (fp16)")
    for ax in [ax for ax in axes if ax.lines][:1]:  # the first panel with lines (--cases may leave some empty)
        ax.legend()
    fig.suptitle(f"Attention forward, hidden 2048, {device}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    """The command line (see the module docstring); experiment scripts call it with their own ``Case.variants``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", action="store_true", help="compile the kernels (here, with the TVM compiler)")
    ap.add_argument("--run", action="store_true", help="check and time them (GPU machine, TVM runtime + torch)")
    ap.add_argument("--cpu", action="store_true",
                    help="time the CPU kernel against TVM's unfused lowering and onnxruntime, here")
    ap.add_argument("--cpu-baseline", type=Path, help="--cpu: also time the kernel of this other attention_cpu.py")
    ap.add_argument("--summary", type=Path, help="print the per-shape summary of a --run result file")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    ap.add_argument("--cases", help="--build / --run: only these cases (comma-separated names)")
    ap.add_argument("--rounds", type=int, default=ROUNDS, help="--run / --cpu: timing rounds")
    ap.add_argument("--dir", type=Path, default=BUILD, help="--build / --run: the library's folder")
    ap.add_argument("--rule-only", action="store_true", help="--build: the rule's kernels, no other tile configurations")
    ap.add_argument("--baseline", type=Path, nargs="+", default=[],
                    help="--run: also time the rule's kernels of these other --build folders (A/B of a change)")
    a = ap.parse_args(argv)
    names = a.cases.split(",") if a.cases else [c.name for c in CASES]
    unknown = set(names) - {c.name for c in CASES}
    if unknown:
        ap.error(f"unknown cases: {', '.join(sorted(unknown))}")
    cases = [c for c in CASES if c.name in names]
    if a.summary:
        summary(json.loads(a.summary.read_text()))
    if a.build:
        build(cases, a.dir / LIB.name, variants=not a.rule_only)
    if a.run:
        run(a.out, cases, a.rounds, a.dir, a.baseline)
    if a.cpu:
        cpu(a.out, a.rounds, a.cpu_baseline)


def experiment(script: str, names: tuple[str, ...], variants) -> None:
    """An experiment script's command line: ``main`` on the cases ``names``, their variants ``variants(chosen, spec)``
    (tile configurations, from the rule's ``chosen``) instead of ``Case.variants``, built into build/gpu/<the script's
    folder>, results beside the script, 9 rounds."""
    def case_variants(case: Case, spec) -> list:
        from schedules.attention_cuda import choose  # (at build time: the GPU machine's runtime-only TVM lacks it)

        return variants(choose(spec, wgmma=True), spec)

    Case.variants = case_variants
    folder = Path(script).resolve().parent
    main(["--cases", ",".join(names), "--dir", str(REPO / "build" / "gpu" / folder.name), "--out", str(folder),
          "--rounds", "9", *sys.argv[1:]])


if __name__ == "__main__":
    main()
