"""Fused attention end to end: exported ONNX attention through the CLI becomes ONE hand-written kernel, and a
16-bit graph summed in float32 (how the frontend writes float16 MatMul / Softmax) is recognised as well."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import relax as R

from compiler import package, passes, schedules, targets
from compiler.build import build
from helpers import compile_and_compare, rel_err

sys.path.insert(0, str(Path(__file__).parent.parent / "models"))
import fusion_blocks as blocks  # noqa: E402


@pytest.mark.parametrize("layout", ["bert", "sdpa_causal"])
@pytest.mark.parametrize("lengths", [(33, 60), (65, 80)], ids=["one-query-tile", "last-tile-of-few-rows"])
def test_exported_encoder_is_one_attention_kernel(capsys, tmp_path, rng, layout, lengths):
    """An encoder block as PyTorch exports it (padding-mask input, or SDPA's causal mask), odd sequence length:
    the package lists one attention kernel, from our rule, and matches onnxruntime on fresh inputs. (65-79 tokens:
    on AVX-512 the CPU kernel's last query task of 1-15 rows takes its 16-lane register block.)"""
    b, seq = 2, int(rng.integers(*lengths)) | 1
    model = blocks.encoder_block(b=b, seq=seq, h=2, d=16, layout=layout)
    inputs = {"x": rng.standard_normal((b, seq, 32)).astype(np.float32)}
    if layout == "bert":  # sequence i keeps its first seq - 5i keys
        inputs["mask"] = (np.arange(seq) < seq - 5 * np.arange(b)[:, None]).astype(np.float32)
    ours, ref = compile_and_compare(capsys, tmp_path, model, inputs)
    kernels = package.read_manifest(tmp_path / "model.tvmpkg")["kernels"]
    attention = {name: how for name, how in kernels.items() if "attention" in name}
    assert list(attention.values()) == ["hand:Attention"], kernels
    for name in ref:
        assert rel_err(ours[name], ref[name]) < 1e-5, name


def float16_attention(b: int, s: int, h: int, d: int) -> tvm.IRModule:
    """Causal attention on [b, h, s, d] float16 operands written as the frontend writes 16-bit MatMul and
    Softmax: products summed in float32 and cast back, softmax in float32 and cast back."""
    bb = relax.BlockBuilder()
    q, k, v = (relax.Var(n, R.Tensor((b, h, s, d), "float16")) for n in "qkv")
    mask = np.where(np.tril(np.ones((s, s), bool)), 0, -np.inf).astype(np.float16)
    op = relax.op
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            kt = bb.emit(op.permute_dims(k, [0, 1, 3, 2]))
            scores = bb.emit(op.astype(op.matmul(q, kt, out_dtype="float32"), "float16"))
            logits = bb.emit(op.add(op.multiply(scores, relax.const(1 / np.sqrt(d), "float16")), relax.const(mask)))
            probs = bb.emit(op.astype(op.nn.softmax(op.astype(logits, "float32")), "float16"))
            out = bb.emit_output(bb.emit(op.astype(op.matmul(probs, v, out_dtype="float32"), "float16")))
        bb.emit_func_output(out)
    return bb.get()


def test_float16_graph_summed_in_float32_is_one_attention(rng):
    b, s, h, d = 2, 37, 2, 16
    info = targets.resolve("cpu")
    mod, _ = passes.optimize(float16_attention(b, s, h, d), info, legalize=schedules.legalizations())
    funcs = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    assert [f.attrs.get("tvmpipe.kernel") for f in funcs].count("attention") == 1
    assert "softmax" not in mod.script()
    mod, chosen = schedules.apply(mod, info)
    assert "Attention" in chosen.values()
    q, k, v = (rng.standard_normal((b, h, s, d)).astype(np.float16) for _ in range(3))
    ours = relax.VirtualMachine(build(mod, info).exe, tvm.cpu())["main"](*map(tvm.runtime.tensor, (q, k, v))).numpy()
    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    logits = np.where(np.tril(np.ones((s, s), bool)), q64 @ k64.transpose(0, 1, 3, 2) / np.sqrt(d), -np.inf)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    assert rel_err(ours, (p / p.sum(-1, keepdims=True)) @ v64) < 4e-3
