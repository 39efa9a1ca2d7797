"""Does tvmpipe compile the transformers architectures people export? Each one built tiny from its config (2 layers,
hidden 256, 8 heads where it has them; seeded random weights), exported by PyTorch's dynamo exporter as a user would
(batch 2, a padding mask with one row padded where the model takes a mask), compiled for the CPU, run against
onnxruntime on the same random inputs, and compiled for cuda-sm90 in float32 and with ``--precision fp16`` (code
generation only: no GPU here; in float32 CUDA attention stays unfused by design, see the README).

Records per architecture: the distinct kernels by the rule that scheduled them (``default``: TVM's own lowering; layers
of one shape share their kernels), how many of them are fused attention, the relative error against onnxruntime over
the unpadded rows, and the compile times.

    python benchmarks/hf_architectures.py [--only qwen2,t5] [--no-cuda]   # -> benchmarks/results/hf-architectures.json

Needs the ``zoo`` extra (torch, transformers).
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

DIMS = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8)
SEQ2SEQ = dict(d_model=256, encoder_layers=2, decoder_layers=2, encoder_attention_heads=8, decoder_attention_heads=8,
               encoder_ffn_dim=512, decoder_ffn_dim=512)
# name -> (config class, model class, config arguments, inputs: "text" (ids + mask), "seq2seq" (ids + mask + decoder
# ids), "speech" (log-mel features + decoder ids) or "image" (pixels)); decoders with their grouped-query heads
ARCHITECTURES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(DIMS, num_key_value_heads=2), "text"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(DIMS, num_key_value_heads=2), "text"),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(DIMS, num_key_value_heads=2), "text"),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(DIMS, num_key_value_heads=1, head_dim=32), "text"),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(DIMS, num_key_value_heads=4, pad_token_id=0), "text"),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", dict(DIMS, num_key_value_heads=2), "text"),
    "falcon": ("FalconConfig", "FalconForCausalLM", dict(DIMS, num_kv_heads=2, new_decoder_architecture=True), "text"),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", DIMS, "text"),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_embd=256, n_layer=2, n_head=8), "text"),
    "opt": ("OPTConfig", "OPTForCausalLM", dict(DIMS, ffn_dim=512, word_embed_proj_dim=256), "text"),
    "bert": ("BertConfig", "BertModel", DIMS, "text"),
    "roberta": ("RobertaConfig", "RobertaModel", dict(DIMS, pad_token_id=1), "text"),
    "distilbert": ("DistilBertConfig", "DistilBertModel", dict(dim=256, n_layers=2, n_heads=8, hidden_dim=512), "text"),
    "clip_text": ("CLIPTextConfig", "CLIPTextModel", DIMS, "text"),
    "vit": ("ViTConfig", "ViTModel", dict(DIMS, image_size=64, patch_size=16), "image"),
    "bart": ("BartConfig", "BartModel", SEQ2SEQ, "seq2seq"),
    # (T5's SDPA path did not export: a view of a transposed tensor in torch.export's decomposition)
    "t5": ("T5Config", "T5Model", dict(d_model=256, d_kv=32, d_ff=512, num_layers=2, num_heads=8,
                                       attn_implementation="eager"), "seq2seq"),
    "whisper": ("WhisperConfig", "WhisperModel", dict(SEQ2SEQ, num_mel_bins=80, max_source_positions=50, pad_token_id=0,
                                                      bos_token_id=1, eos_token_id=2, decoder_start_token_id=1),
                "speech"),
}
VOCAB, BATCH, SEQ, DEC_SEQ, PADDED = 1000, 2, 24, 7, 18  # row 1 of the mask keeps its first PADDED tokens


def export(name: str, path: Path) -> list[str]:
    """The architecture's tiny model as ONNX at ``path``; the names of its inputs."""
    import torch
    import transformers

    config_cls, model_cls, kwargs, kind = ARCHITECTURES[name]
    torch.manual_seed(0)
    kwargs = {"vocab_size": VOCAB, **kwargs} if kind != "image" else kwargs
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**kwargs)).eval()
    ids = torch.randint(3, VOCAB, (BATCH, SEQ))
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, PADDED:] = 0
    decoder = torch.randint(3, VOCAB, (BATCH, DEC_SEQ))
    args = {"text": {"input_ids": ids, "attention_mask": mask},
            "image": {"pixel_values": torch.randn(BATCH, 3, 64, 64)},
            "seq2seq": {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": decoder},
            "speech": {"input_features": torch.randn(BATCH, 80, 100), "decoder_input_ids": decoder}}[kind]

    # no cache returned: one output (decoders and seq2seq models would return the cache too)
    extra = {"use_cache": False} if "use_cache" in inspect.signature(model.forward).parameters else {}

    class Wrapped(torch.nn.Module):  # positional inputs, one output (the exporter names them as given)
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *values):
            out = self.model(**dict(zip(args, values)), **extra)
            return out.logits if hasattr(out, "logits") else out.last_hidden_state

    torch.onnx.export(Wrapped(), tuple(args.values()), path, input_names=list(args), output_names=["y"], dynamo=True)
    return list(args)


def inputs(names: list[str], specs: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Fresh inputs: token ids in the vocabulary, a mask with row 1 padded, normal floats."""
    out = {}
    for name in names:
        shape, dtype = specs[name]["shape"], specs[name]["dtype"]
        if name == "attention_mask":
            out[name] = np.ones(shape, dtype)
            out[name][1, PADDED:] = 0
        elif dtype.startswith("int"):
            out[name] = rng.integers(3, VOCAB, shape).astype(dtype)
        else:
            out[name] = rng.standard_normal(shape).astype(dtype)
    return out


def check(name: str, work: Path, cuda: bool) -> dict:
    from compiler import compile_model, load
    from compiler.compare import OrtSession
    from compiler.pipeline import Options

    onnx_path = work / f"{name}.onnx"
    rec: dict = {"architecture": name, "model_class": ARCHITECTURES[name][1]}
    names = export(name, onnx_path)
    t0 = time.perf_counter()
    manifest = compile_model(onnx_path, "cpu", work / f"{name}-cpu.tvmpkg")
    rec["cpu_compile_s"] = round(time.perf_counter() - t0, 1)
    rules = Counter(manifest["kernels"].values())
    rec["kernels"] = dict(rules)
    rec["attention_kernels"] = sum(n for rule, n in rules.items() if rule.endswith("Attention"))
    rec["default_kernels"] = sorted(k for k, rule in manifest["kernels"].items() if rule == "default")
    runner = load(str(work / f"{name}-cpu.tvmpkg"))
    specs = {s["name"]: s for s in runner.manifest["inputs"]}
    x = inputs(names, specs, np.random.default_rng(1))
    ours, ref = runner(**x)["y"], OrtSession(onnx_path, threads=2)(x)["y"]
    valid = np.ones(ours.shape, bool)
    if "attention_mask" in x and ours.shape[:2] == x["attention_mask"].shape:  # padded positions: any value will do
        valid = np.broadcast_to(x["attention_mask"].astype(bool)[..., None], ours.shape)
    rec["rel_err"] = float(np.abs(ours - ref)[valid].max() / np.abs(ref).max())
    for precision in ("fp32", "fp16") if cuda else ():
        t0 = time.perf_counter()
        gpu = compile_model(onnx_path, "cuda-sm90", work / f"{name}-cuda-{precision}.tvmpkg",
                            options=Options(precision=precision))
        rec[f"cuda_{precision}_compile_s"] = round(time.perf_counter() - t0, 1)
        rec[f"cuda_{precision}_kernels"] = dict(Counter(gpu["kernels"].values()))
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated architectures (default: all)")
    ap.add_argument("--no-cuda", dest="cuda", action="store_false", help="skip the cuda-sm90 compile")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "hf-architectures.json")
    args = ap.parse_args()
    import transformers

    names = args.only.split(",") if args.only else list(ARCHITECTURES)
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            try:
                rec = check(name, Path(tmp), args.cuda)
            except Exception as e:  # one architecture's failure is a result, not the end of the run
                rec = {"architecture": name, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
            rec["transformers"] = transformers.__version__
            records.append(rec)
            print(json.dumps(rec), flush=True)
            args.out.write_text(json.dumps(records, indent=1))
    ok = [r for r in records if "error" not in r and r["rel_err"] < 1e-4]
    print(f"{len(ok)} of {len(records)} compile and match onnxruntime; wrote {args.out}")


if __name__ == "__main__":
    main()
