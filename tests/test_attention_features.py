"""ONNX Attention's explicit path (softcap, qk_matmul_output, sliding windows, nonpad_kv_seqlen, a short mask,
softmax_precision) against onnx's ReferenceEvaluator on fresh random inputs with odd shapes:
``compiler/frontend/attention_op.py``."""

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper
from onnx.reference import ReferenceEvaluator

from helpers import make_model, save

B, HQ, HKV, SQ, SK, D = 2, 4, 2, 5, 7, 6


def _run(tmp_path, model, feeds: dict[str, np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    from compiler import compile_model, load

    compile_model(save(model, tmp_path / "m.onnx"), "cpu", tmp_path / "m.tvmpkg")
    got = load(tmp_path / "m.tvmpkg")(**feeds)
    names = [o.name for o in model.graph.output]
    return [got[n] for n in names], ReferenceEvaluator(model).run(None, feeds)


@pytest.mark.parametrize("attrs,mode,mask", [
    ({"softcap": 2.5}, 0, None),
    ({"softcap": 1.5, "is_causal": 1}, 2, "float"),
    ({"left_window_size": 2}, 3, "bool_short"),
    ({"left_window_size": 1, "right_window_size": 2, "is_causal": 0}, 1, "float"),
    ({"is_causal": 1, "softmax_precision": TP.DOUBLE}, 3, None),
])
def test_attention_explicit_path(tmp_path, rng, attrs, mode, mask):
    """GQA heads, a past-free cache, every qk_matmul_output mode; fully masked rows (window + causal) give 0."""
    node = helper.make_node("Attention", ["q", "k", "v", "mask" if mask else ""], ["y", "", "", "qk"],
                            qk_matmul_output_mode=mode, **attrs)
    inputs = [("q", TP.FLOAT, [B, HQ, SQ, D]), ("k", TP.FLOAT, [B, HKV, SK, D]), ("v", TP.FLOAT, [B, HKV, SK, 3])]
    feeds = {"q": rng.standard_normal((B, HQ, SQ, D)).astype(np.float32),
             "k": rng.standard_normal((B, HKV, SK, D)).astype(np.float32),
             "v": rng.standard_normal((B, HKV, SK, 3)).astype(np.float32)}
    if mask == "float":
        inputs.append(("mask", TP.FLOAT, [SQ, SK]))
        feeds["mask"] = np.where(rng.random((SQ, SK)) < 0.3, -np.inf, rng.standard_normal((SQ, SK))).astype(np.float32)
    elif mask == "bool_short":  # covers the first keys only: the rest are masked out
        inputs.append(("mask", TP.BOOL, [SQ, SK - 2]))
        feeds["mask"] = rng.random((SQ, SK - 2)) < 0.7
    model = make_model([node], inputs, [("y", TP.FLOAT, [B, HQ, SQ, 3]), ("qk", TP.FLOAT, [B, HQ, SQ, SK])], opset=25)
    ours, ref = _run(tmp_path, model, feeds)
    for got, want in zip(ours, ref):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_attention_nonpad_kv_seqlen_3d_causal(tmp_path, rng):
    """An external cache: per batch, keys past nonpad_kv_seqlen[b] are padding and the causal frontier moves."""
    node = helper.make_node("Attention", ["q", "k", "v", "", "", "", "lens"], ["y"], is_causal=1,
                            q_num_heads=HQ, kv_num_heads=HKV)
    feeds = {"q": rng.standard_normal((B, 3, HQ * D)).astype(np.float32),
             "k": rng.standard_normal((B, SK, HKV * D)).astype(np.float32),
             "v": rng.standard_normal((B, SK, HKV * D)).astype(np.float32),
             "lens": np.array([SK, 4], np.int64)}
    inputs = [(n, TP.FLOAT, list(a.shape)) for n, a in feeds.items() if n != "lens"] + [("lens", TP.INT64, [B])]
    model = make_model([node], inputs, [("y", TP.FLOAT, [B, 3, HQ * D])], opset=24)
    (got,), (want,) = _run(tmp_path, model, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
