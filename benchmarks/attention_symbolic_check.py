"""One CUDA attention kernel for any batch, query length and KV length, run on the GPU: a Relax module whose lengths
are symbolic (what a decoder exported with dynamic axes needs; the ONNX frontend binds them, so no package is), compiled
here for cuda-sm90 with its GPU code (cubin), then run there by the TVM runtime alone at prompt and decoding-step
shapes, each checked against float64 (torch). Both forms of the decode kernel (``on_tensor_cores``) are built.

    python benchmarks/attention_symbolic_check.py --build           # here: build/gpu/attention-symbolic/*.so
    python3 benchmarks/attention_symbolic_check.py --run --out DIR  # GPU machine -> DIR/attention-symbolic-<gpu>.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.common import build_or_run, gpu_slug  # noqa: E402

BUILD = REPO / "build" / "gpu" / "attention-symbolic"
HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128  # Llama-style grouped heads
# (batch, query rows, keys; rows <= keys): decoding steps (1 and 4 rows: the decode kernel), a prompt (the prefill
# kernels), and a ragged mix of lengths that no tile divides
SHAPES = [(1, 1, 1), (1, 1, 2048), (3, 1, 777), (2, 4, 4099), (1, 300, 300), (2, 129, 1000), (1, 5, 5)]
TOL = 4e-3  # fp16


def module():
    """``main(q, k, v) = attention(q, k, v)``, fp16 BSNH, causal from the bottom right (the last query row sees every
    key), batch ``b``, query length ``s`` and KV length ``n`` symbolic."""
    import tvm
    from tvm import relax
    from tvm.script import relax as R

    b, s, n = (tvm.tirx.Var(name, "int64") for name in "bsn")
    bb = relax.BlockBuilder()
    q = relax.Var("q", R.Tensor((b, s, HEADS, HEAD_DIM), "float16"))
    k = relax.Var("k", R.Tensor((b, n, KV_HEADS, HEAD_DIM), "float16"))
    v = relax.Var("v", R.Tensor((b, n, KV_HEADS, HEAD_DIM), "float16"))
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.nn.attention(q, k, v, causal_mask="BottomRight")))
        bb.emit_func_output(out)
    return bb.get()


def build() -> None:
    from unittest import mock

    from compiler import passes, schedules, targets
    from compiler.build import build as build_vm
    from schedules import attention_cuda_decode

    info = targets.resolve("cuda-sm90")
    BUILD.mkdir(parents=True, exist_ok=True)
    for form in ("simt", "tc"):
        with mock.patch.object(attention_cuda_decode, "on_tensor_cores", lambda *_: form == "tc"):
            mod, _ = passes.optimize(module(), info, legalize=schedules.legalizations())
            mod, chosen = schedules.apply(mod, info)
            assert "Attention" in chosen.values(), chosen
            gpu = build_vm(mod, info).export(BUILD / f"attention-{form}.so")
        print(f"built {BUILD / f'attention-{form}.so'}: {gpu}", flush=True)


def run(out: Path) -> None:
    import torch
    import torch.nn.functional as F
    import tvm
    from tvm.runtime.vm import VirtualMachine

    from compiler.runtime import load_cuda_runtime

    load_cuda_runtime()
    records = []
    for form in ("simt", "tc"):
        vm = VirtualMachine(tvm.runtime.load_module(str(BUILD / f"attention-{form}.so")), tvm.cuda(0))
        for b, s, n in SHAPES:
            rng = np.random.default_rng(b * 1_000_003 + s * 1009 + n)
            x = {name: rng.standard_normal((b, rows, heads, HEAD_DIM)).astype(np.float16)
                 for name, rows, heads in (("q", s, HEADS), ("k", n, KV_HEADS), ("v", n, KV_HEADS))}
            ours = vm["main"](*[tvm.runtime.tensor(x[name], tvm.cuda(0)) for name in "qkv"]).numpy().astype(np.float64)
            q, k, v = (torch.from_numpy(x[name]).cuda().double().transpose(1, 2) for name in "qkv")
            mask = torch.ones(s, n, dtype=torch.bool, device="cuda").tril(n - s)  # row i sees keys up to i + n - s
            ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True).transpose(1, 2).cpu().numpy()
            err = float(np.linalg.norm(ours - ref) / np.linalg.norm(ref))  # (NaN if ours has a NaN: not ok)
            rec = {"form": form, "batch": b, "seq_q": s, "seq_kv": n, "rel_err": err, "ok": err < TOL,
                   "device": torch.cuda.get_device_name(0)}
            print(json.dumps(rec), flush=True)
            records.append(rec)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"attention-symbolic-{gpu_slug()}.json"
    path.write_text(json.dumps(records, indent=1))
    print(f"wrote {path}: {sum(r['ok'] for r in records)} of {len(records)} ok")


def main() -> None:
    args = build_or_run(__doc__, "modules", "check them on the GPU machine").parse_args()
    build() if args.build else run(args.out)


if __name__ == "__main__":
    main()
