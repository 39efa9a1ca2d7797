"""Graph passes and fusion, per pattern: a structural check (what the kernels compute, via ``tvmpipe
inspect --json``) and the numbers vs onnxruntime on random inputs."""

import json
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper

from compiler import targets
from helpers import compile_and_compare, make_model, rel_err, run_cli, save

sys.path.insert(0, str(Path(__file__).parent.parent / "models"))
import fusion_blocks as blocks  # noqa: E402

F = TP.FLOAT


def kernels(capsys, path: Path, *args: str) -> list[dict]:
    r = run_cli(capsys, "inspect", path, "--target", "cpu", "--json", *args)
    assert r.code == 0, r.err
    return json.loads(r.out)["kernels"]


def random_inputs(model, rng) -> dict[str, np.ndarray]:
    """Gaussian floats; masks (inputs named mask*) of 0/1 that never mask a whole row (key 0 always kept)."""
    out = {}
    for vi in model.graph.input:
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        if vi.name.startswith("mask"):
            m = (rng.random(shape) < 0.7).astype(np.float32)
            m[..., 0] = 1
            out[vi.name] = m
        else:
            out[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def check(capsys, tmp_path, model, rng, tol=1e-5) -> list[dict]:
    """Numerics vs onnxruntime through compile/run, then the kernels inspect reports."""
    inputs = random_inputs(model, rng)
    ours, ref = compile_and_compare(capsys, tmp_path, model, inputs)
    for name in ref:
        assert rel_err(ours[name], ref[name]) < tol, name
    return kernels(capsys, tmp_path / "model.onnx")


# ---------------------------------------------------------------- conv/matmul + bias + activation + residual


# How the Relax frontend writes each activation (Clip arrives as TIR max/min, HardSwish as x*clip(x+3)/6).
ACTIVATION_OPS = {
    "Relu": ["nn.relu"], "Relu6": ["maximum", "minimum"], "Sigmoid": ["sigmoid"],
    "HardSigmoid": ["multiply", "add", "clip"], "HardSwish": ["add", "clip", "divide", "multiply"],
    "Gelu": ["nn.gelu"], "Silu": ["sigmoid", "multiply"], "LeakyRelu": ["nn.leakyrelu"],
}


def _ops(*names: str) -> list[str]:
    return [n if n.startswith("tir.") else f"relax.{n}" for n in names]


@pytest.mark.parametrize("act", blocks.ACTIVATIONS)
def test_conv_bn_activation_residual_is_two_kernels(capsys, tmp_path, rng, act):
    """Conv3x3+BN+act, then Conv1x1+BN+residual Add: one kernel each, BN folded into the conv weights."""
    ks = check(capsys, tmp_path, blocks.conv_bn_act(act), rng)
    assert [k["ops"] for k in ks] == [_ops("nn.conv2d", "add", *ACTIVATION_OPS[act]), _ops("nn.conv2d", "add", "add")]


@pytest.mark.parametrize("act", blocks.ACTIVATIONS)
def test_gemm_bias_activation_residual_is_one_kernel(capsys, tmp_path, rng, act):
    g = blocks.Graph()
    x = g.input("x", [3, 7])
    y = g.n("Gemm", [x, g.w(7, 7), g.w(7, scale=0.1)], transB=1)
    (k,) = check(capsys, tmp_path, g.model([g.n("Add", [g.act(y, act), x])], opset=20), rng)
    assert k["ops"] == _ops("matmul", "add", *ACTIVATION_OPS[act], "add") and k["saved_bytes"] > 0


@pytest.mark.parametrize("producer,ops", [
    ("MatMul", ["matmul", "add"]),  # BatchNorm1d after a Linear without bias: into the weight columns + a bias
    ("Conv-Relu", ["nn.conv2d", "nn.relu", "multiply", "add"]),  # after the activation: a conv epilogue
    ("ConvTranspose", ["nn.conv2d_transpose", "add"]),
    ("Gemm", ["matmul", "add"]),
])
def test_batchnorm_folded(capsys, tmp_path, rng, producer, ops):
    """No BN kernel remains after any of these producers: one kernel computing exactly ``ops``."""
    g = blocks.Graph()
    if producer == "MatMul":
        y, ch = g.n("MatMul", [g.input("x", [4, 6]), g.w(6, 5)]), 5
    elif producer == "Gemm":
        y, ch = g.n("Gemm", [g.input("x", [4, 6]), g.w(6, 5), g.w(5, scale=0.1)]), 5
    elif producer == "ConvTranspose":
        y, ch = g.n("ConvTranspose", [g.input("x", [1, 4, 5, 5]), g.w(4, 3, 3, 3)], strides=[2, 2], group=1), 3
    else:
        y, ch = g.n("Relu", [g.conv(g.input("x", [1, 3, 6, 6]), 3, 4, 3, bias=False)]), 4
    (k,) = check(capsys, tmp_path, g.model([g.bn(y, ch)]), rng)
    assert k["ops"] == _ops(*ops), k


def test_batchnorm_pass_folds_into_grouped_conv_transpose(rng):
    """The Relax pass itself (the ONNX cleaning folds this case before it): weights scaled group by group."""
    import tvm
    from tvm import relax

    from compiler.passes.fold_batchnorm import FoldBatchNorm

    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)  # 2 groups x 2 in -> 6 out channels
    gamma, beta, mean = (rng.standard_normal(6).astype(np.float32) for _ in range(3))
    var = (rng.random(6) + 0.5).astype(np.float32)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 4, 5, 5], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d_transpose(x, relax.const(w), groups=2))
            bn = bb.emit(relax.op.nn.batch_norm(y, *(relax.const(a) for a in (gamma, beta, mean, var)), axis=1,
                                                training=False))
            out = bb.emit_output(relax.TupleGetItem(bn, 0))
        bb.emit_func_output(out)
    before = bb.get()
    after = FoldBatchNorm()(before)
    assert "batch_norm" not in after.script()
    xs = rng.standard_normal((1, 4, 5, 5)).astype(np.float32)
    results = []
    for mod in (before, after):
        vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
        results.append(vm["main"](tvm.runtime.tensor(xs)).numpy())
    assert rel_err(results[1], results[0]) < 1e-5


@pytest.mark.parametrize("square,affine", [("Pow", True), ("Mul", False)])
def test_decomposed_layernorm_is_one_kernel(capsys, tmp_path, rng, square, affine):
    """LayerNormalization as exporters below opset 17 write it: mean, sub, pow, mean, add eps, sqrt, div."""
    g = blocks.Graph()
    x = g.input("x", [2, 5, 16])
    d = g.n("Sub", [x, g.n("ReduceMean", [x], axes=[-1], keepdims=1)])
    sq = g.n("Pow", [d, g.c(np.float32(2))]) if square == "Pow" else g.n("Mul", [d, d])
    var = g.n("ReduceMean", [sq], axes=[-1], keepdims=1)
    y = g.n("Div", [d, g.n("Sqrt", [g.n("Add", [var, g.c(np.float32(1e-5))])])])
    if affine:
        y = g.n("Add", [g.n("Mul", [y, g.w(16)]), g.w(16)])
    (k,) = check(capsys, tmp_path, g.model([y], opset=13), rng)
    assert k["ops"] == ["relax.nn.layer_norm"], k


# ---------------------------------------------------------------- layout


def test_transpose_pairs_and_unit_axis_transposes_vanish(capsys, tmp_path, rng):
    nodes = [
        helper.make_node("Transpose", ["x"], ["a"], perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", ["a"], ["b"], perm=[0, 3, 1, 2]),  # undoes the first
        helper.make_node("Relu", ["b"], ["r"]),
        helper.make_node("Transpose", ["r"], ["y"], perm=[1, 0, 2, 3]),  # moves only a size-1 axis: a view
    ]
    model = make_model(nodes, [("x", F, [1, 3, 4, 5])], [("y", F, [3, 1, 4, 5])])
    (k,) = check(capsys, tmp_path, model, rng)
    # the pair is gone; the unit-axis transpose is a reshape (index arithmetic inside the Relu kernel)
    assert set(k["ops"]) <= {"relax.nn.relu", "relax.reshape"} and "relax.nn.relu" in k["ops"], k


# ---------------------------------------------------------------- attention


@pytest.mark.parametrize("layout,sk,op,causal", [
    ("bert", None, "relax.nn.attention_bias", None),
    ("sdpa_causal", None, "relax.nn.attention", "TopLeft"),
    ("sdpa_causal", 8, "relax.nn.attention", "BottomRight"),
    ("gpt2", None, "relax.nn.attention_bias", "TopLeft"),
    ("keras", None, "relax.nn.attention_bias", None),
    ("mha", 7, "relax.nn.attention", None),
])
def test_attention_recognised(capsys, tmp_path, rng, layout, sk, op, causal):
    """Each exporter layout becomes ONE attention kernel, with no softmax or head transpose left over."""
    model = blocks.attention(layout, sk=sk)
    ks = check(capsys, tmp_path, model, rng)
    ops = [op for k in ks for op in k["ops"]]
    assert ops.count(op) == 1 and "relax.nn.softmax" not in ops and "relax.permute_dims" not in ops, ks
    mask_kernel = layout in ("bert", "gpt2", "keras")  # computes the additive mask from the mask input
    assert len(ks) == 5 + mask_kernel, ks  # Q, K, V projections, attention, output projection
    r = run_cli(capsys, "inspect", tmp_path / "model.onnx", "--target", "cpu", "--dump-ir", tmp_path / "ir")
    assert r.code == 0, r.err
    fused = (next((tmp_path / "ir").glob("*-FuseAttention.py"))).read_text()
    assert (f'causal_mask="{causal}"' if causal else "causal_mask=None") in fused


@pytest.mark.parametrize("form", ["repeat_kv", "dynamo_sdpa", "interleaved"])
def test_attention_kv_cache_heads_stay_grouped(capsys, tmp_path, rng, form):
    """One attention kernel reads a decoding step's grouped heads as they are, and no repeated copy is made; repeated
    the other way round (query head h reading K/V head h % g, which is not grouped-query attention) the repeat stays.
    The kernel reads K and V in the cache's [batch, heads, seq, dim], so they are not transposed to its layout either."""
    ks = check(capsys, tmp_path, blocks.kv_cache_step(form), rng)
    ops = [op for k in ks for op in k["ops"]]
    assert ops.count("relax.nn.attention_bias") == 1 and "relax.nn.softmax" not in ops, ks
    assert ("relax.broadcast_to" in ops) == (form == "interleaved"), ks
    # the kernel reads K and V where the cache holds them ([b, heads, seq, dim]): no transposed copy either
    assert form == "interleaved" or not any(k["ops"] == ["relax.permute_dims"] for k in ks), ks


@pytest.mark.parametrize("fp16", ["model", "--precision"])
@pytest.mark.parametrize("s, layout", [(3, "BHSD"), (40, "BSNH")])
def test_cuda_decode_kernel_reads_kv_cache_in_place(tmp_path, s, layout, fp16):
    """For CUDA, a float16 decoding step's K and V reach the decode kernel as the cache holds them (no transposed
    copy); with 40 new tokens the prefill kernel takes them, in its own layout (transposed). A float16 model, or a
    float32 one compiled with ``--precision fp16`` (whose float32 cache is cast once, not repeated per query head)."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    from compiler import pipeline, report
    from compiler.pipeline import Options
    from schedules.attention import KV_LAYOUT_ATTR

    model = blocks.kv_cache_step("repeat_kv", s, d=32)
    if fp16 == "model":
        model = convert_float_to_float16(model, keep_io_types=False)
    options = Options(precision="fp16" if fp16 == "--precision" else "fp32")
    prep = pipeline.prepare(save(model, tmp_path / "m.onnx"), "cuda-sm90", None, options)
    (attention,) = [f for g, f in prep.mod.functions.items() if prep.hand.get(g.name_hint) == "Attention"]
    assert str(attention.attrs.get(KV_LAYOUT_ATTR, "BSNH")) == layout
    launches = report._kernels(prep.mod, prep.hand)  # (each kernel launch of main, with its ops)
    assert not any("relax.broadcast_to" in k["ops"] for k in launches), launches
    transposes = [k for k in launches if "relax.permute_dims" in k["ops"]
                  and set(k["ops"]) <= {"relax.permute_dims", "relax.astype"}]
    assert len(transposes) == (2 if layout == "BSNH" else 0), transposes


@pytest.mark.parametrize("bias_shape", [[], [1], [2, 1, 5, 1]])
def test_attention_with_broadcast_bias(capsys, tmp_path, rng, bias_shape):
    """A bias that broadcasts over the keys (a scalar, a per-query column) is still one attention kernel."""
    g = blocks.Graph()
    q, k, v = (g.input(n, [2, 3, 5, 4]) for n in "qkv")
    scores = g.n("MatMul", [q, g.n("Transpose", [k], perm=[0, 1, 3, 2])])
    bias = g.c(rng.standard_normal(bias_shape).astype(np.float32))
    p = g.n("Softmax", [g.n("Add", [scores, bias])], axis=-1)
    ks = check(capsys, tmp_path, g.model([g.n("MatMul", [p, v])]), rng)
    assert [op for k in ks for op in k["ops"]].count("relax.nn.attention_bias") == 1, ks


@pytest.mark.parametrize("same_rows", [True, False])
def test_attention_bias_same_for_every_query_is_one_row(capsys, tmp_path, rng, same_rows):
    """transformers' exports spell a [b, s_k] padding mask out over the query rows: And with an all-true [1, 1, s_q, 1]
    constant, then Where(·, 0, finfo.min). The fused op gets it as [b, 1, 1, s_k]; a constant that differs between
    rows keeps the full [b, 1, s_q, s_k]. Both match onnxruntime."""
    from compiler import pipeline
    from schedules.attention import AttentionSpec

    g = blocks.Graph()
    q, k, v = g.input("q", [2, 3, 5, 4]), g.input("k", [2, 3, 6, 4]), g.input("v", [2, 3, 6, 4])
    keep = g.n("Unsqueeze", [g.n("Cast", [g.input("keys", [2, 6], TP.INT64)], to=TP.BOOL), g.c(np.int64([1, 2]))])
    rows = np.ones((1, 1, 5, 1), bool)
    rows[0, 0, 3] = same_rows
    bias = g.n("Where", [g.n("And", [g.c(rows), keep]), g.c(np.float32(0)), g.c(np.finfo(np.float32).min)])
    scores = g.n("Add", [g.n("MatMul", [q, g.n("Transpose", [k], perm=[0, 1, 3, 2])]), bias])
    model = g.model([g.n("MatMul", [g.n("Softmax", [scores], axis=-1), v])])
    inputs = random_inputs(model, rng)
    inputs["keys"] = np.int64([[1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 1, 1]])
    ours, ref = compile_and_compare(capsys, tmp_path, model, inputs)
    assert all(rel_err(ours[n], ref[n]) < 1e-5 for n in ref)
    mod = pipeline.prepare(tmp_path / "model.onnx", "cpu").mod
    (spec,) = filter(None, (AttentionSpec.of(f) for f in mod.functions.values() if hasattr(f, "params")))
    assert spec.bias_shape == ((2, 1, 1, 6) if same_rows else (2, 1, 5, 6))


def test_torch_sdpa_export_is_one_kernel(capsys, tmp_path, rng):
    """torch.onnx (dynamo) writes SDPA as: Q and Kᵀ each scaled by sqrt(scale), a boolean mask turned into
    Where(mask, 0, -inf), Softmax, then Where(IsNaN(P), 0, P) before P·V (BERT, GPT-2 in the zoo). One attention
    kernel; a query whose keys are all masked gives 0, as the graph does (the softmax row is NaN there)."""
    g = blocks.Graph()
    q = g.input("q", [2, 3, 5, 4])
    mask = g.input("mask", [2, 1, 5, 6], TP.BOOL)
    root = g.c(np.float32(0.5 ** 0.5))  # sqrt(1 / sqrt(4)) on each side
    kt = g.n("Mul", [g.n("Transpose", [g.input("k", [2, 3, 6, 4])], perm=[0, 1, 3, 2]), root])
    scores = g.n("MatMul", [g.n("Mul", [q, root]), kt])
    bias = g.n("Where", [mask, g.c(np.float32(0)), g.c(np.float32(-np.inf))])
    p = g.n("Softmax", [g.n("Add", [scores, bias])], axis=-1)
    p = g.n("Where", [g.n("IsNaN", [p]), g.c(np.float32(0)), p])
    model = g.model([g.n("MatMul", [p, g.input("v", [2, 3, 6, 4])])])
    inputs = random_inputs(model, rng)
    inputs["mask"] = rng.random((2, 1, 5, 6)) < 0.6
    inputs["mask"][0, 0, [1, 3]] = False  # two queries see no key
    inputs["mask"][1, 0, 0] = True
    ours, ref = compile_and_compare(capsys, tmp_path, model, inputs)
    (name,) = ref
    assert np.isfinite(ours[name]).all() and not ours[name][0, :, [1, 3]].any()
    assert rel_err(ours[name], ref[name]) < 1e-5
    ops = [op for k in kernels(capsys, tmp_path / "model.onnx") for op in k["ops"]]
    assert ops.count("relax.nn.attention_bias") == 1 and "relax.nn.softmax" not in ops, ops


def test_attention_fuses_on_cuda_only_onto_tensor_cores(capsys, tmp_path):
    """On CUDA the fused op must get the tensor-core kernel (fp16/bf16, head dims 32-128): an fp32 graph keeps
    its chain there (its GEMMs take the tensor-core GEMM kernel), while the CPU target fuses it."""
    from compiler.passes.attention import _fused_is_faster

    path = save(blocks.attention("bert"), tmp_path / "m.onnx")
    cpu = [op for k in kernels(capsys, path) for op in k["ops"]]
    cuda = [op for k in kernels(capsys, path, "--target", "cuda-sm90") for op in k["ops"]]
    assert "relax.nn.attention_bias" in cpu and "relax.nn.softmax" not in cpu, cpu
    assert "relax.nn.attention_bias" not in cuda and cuda.count("relax.matmul") == cpu.count("relax.matmul") + 2, cuda
    with targets.resolve("cuda-sm90").target:
        assert _fused_is_faster("float16", 64, 64) and _fused_is_faster("bfloat16", 128, 128)
        assert not any(_fused_is_faster(*a) for a in (("float32", 64, 64), ("float16", 80, 80), ("float16", 64, 32)))


def test_torch_sdpa_export_fuses_under_mixed_precision(capsys, tmp_path):
    """``--precision fp16``: ToMixedPrecision casts the NaN-zeroed float32 probabilities to float16 for P·V,
    the float32 scores to float16 and back, and the scale to float16 (``astype(0.125)``); the pattern is still
    one attention kernel, on tensor cores."""
    g = blocks.Graph()
    mask = g.input("mask", [2, 1, 5, 6], TP.BOOL)
    scores = g.n("MatMul", [g.input("q", [2, 4, 5, 64]), g.n("Transpose", [g.input("k", [2, 4, 6, 64])], perm=[0, 1, 3, 2])])
    bias = g.n("Where", [mask, g.c(np.float32(0)), g.c(np.float32(-np.inf))])
    p = g.n("Softmax", [g.n("Add", [g.n("Mul", [scores, g.c(np.float32(0.125))]), bias])], axis=-1)
    p = g.n("Where", [g.n("IsNaN", [p]), g.c(np.float32(0)), p])
    out = g.n("MatMul", [g.n("MatMul", [p, g.input("v", [2, 4, 6, 64])]), g.w(64, 64)])  # P·V goes on in float16
    path = save(g.model([out]), tmp_path / "m.onnx")
    r = run_cli(capsys, "compile", path, "--target", "cuda-sm90", "--precision", "fp16", "-o", tmp_path / "m.tvmpkg")
    assert r.code == 0, r.err
    assert "different data type" not in r.err
    with zipfile.ZipFile(tmp_path / "m.tvmpkg") as zf:
        kernels = json.loads(zf.read("manifest.json"))["kernels"]
    assert list(kernels.values()).count("hand:Attention") == 1 and "softmax" not in kernels, kernels


def test_attention_output_used_elsewhere_is_left_alone(capsys, tmp_path, rng):
    """If the probabilities are also a model output, fusing would compute them twice: keep the graph."""
    g = blocks.Graph()
    q, k, v = (g.input(n, [2, 3, 4, 5]) for n in "qkv")
    p = g.n("Softmax", [g.n("MatMul", [q, g.n("Transpose", [k], perm=[0, 1, 3, 2])])], axis=-1)
    model = g.model([g.n("MatMul", [p, v]), p])
    ks = check(capsys, tmp_path, model, rng)
    assert not any("attention" in op for k in ks for op in k["ops"])


# ---------------------------------------------------------------- ONNX Attention (opset 23)


def onnx_attention(q_shape, kv_shapes, mask=None, past=None, outputs=1, **attrs):
    names = ["q", "k", "v", "mask" if mask else "", "past_k" if past else "", "past_v" if past else ""]
    while not names[-1]:
        names.pop()
    out_names = ["y", "present_k", "present_v"][:outputs]
    node = helper.make_node("Attention", names, out_names, **attrs)
    ins = [("q", F, q_shape), ("k", F, kv_shapes[0]), ("v", F, kv_shapes[1])]
    ins += [("mask", mask[0], mask[1])] if mask else []
    ins += [("past_k", F, past[0]), ("past_v", F, past[1])] if past else []
    import onnx

    return onnx.shape_inference.infer_shapes(make_model([node], ins, [(n, F, None) for n in out_names], opset=23))


@pytest.mark.parametrize("case", ["3d_gqa_bool_mask", "4d_causal_scale", "4d_past_causal"])
def test_onnx_attention_op(capsys, tmp_path, rng, case):
    if case == "3d_gqa_bool_mask":  # 4 query heads share 2 K/V heads; boolean [seq_q, seq_k] mask
        model = onnx_attention([2, 5, 4 * 6], ([2, 7, 2 * 6], [2, 7, 2 * 4]), mask=(TP.BOOL, [5, 7]),
                               q_num_heads=4, kv_num_heads=2)
    elif case == "4d_causal_scale":
        model = onnx_attention([2, 3, 6, 4], ([2, 3, 6, 4], [2, 3, 6, 5]), is_causal=1, scale=0.3)
    else:  # a KV cache: 3 new tokens after 4 cached ones, causal aligned to the cache, present_* returned
        model = onnx_attention([1, 2, 3, 4], ([1, 2, 3, 4], [1, 2, 3, 4]), past=([1, 2, 4, 4], [1, 2, 4, 4]),
                               outputs=3, is_causal=1)
    inputs = random_inputs(model, rng)
    if "mask" in inputs:
        inputs["mask"] = inputs["mask"].astype(bool)
    ours, ref = compile_and_compare(capsys, tmp_path, model, inputs)
    for name in ref:
        assert rel_err(ours[name], ref[name]) < 1e-5, name
    ops = [op for k in kernels(capsys, tmp_path / "model.onnx") for op in k["ops"]]
    assert any(op.startswith("relax.nn.attention") for op in ops) and "relax.nn.softmax" not in ops


@pytest.mark.parametrize("custom", [True, False])
def test_onnx_attention_grouped_heads_stay_grouped(capsys, tmp_path, rng, custom):
    """8 query heads sharing 2 K/V heads, one query row (a decoding step): the attention op takes K and V grouped (our
    kernels read each K/V head once for its group), no repeat kernel; with ``--no-custom-schedules`` TVM's own
    lowering, which needs one K/V head per query head, gets them repeated. Both match onnxruntime."""
    model = onnx_attention([2, 1, 8 * 16], ([2, 40, 2 * 16], [2, 40, 2 * 16]), q_num_heads=8, kv_num_heads=2)
    inputs = random_inputs(model, rng)
    extra = () if custom else ("--no-custom-schedules",)
    ours, ref = compile_and_compare(capsys, tmp_path, model, inputs, extra_args=extra)
    assert rel_err(ours["y"], ref["y"]) < 1e-5
    if custom:
        ops = [op for k in kernels(capsys, tmp_path / "model.onnx") for op in k["ops"]]
        assert "relax.nn.attention" in ops and "relax.repeat" not in ops, ops


def test_onnx_attention_fully_masked_rows_are_zero(capsys, tmp_path, rng):
    """The spec (and onnx's reference implementation) gives Y = 0 for a query that may attend to no key."""
    from onnx.reference import ReferenceEvaluator

    model = onnx_attention([2, 3, 5, 4], ([2, 3, 6, 4], [2, 3, 6, 4]), mask=(TP.BOOL, [2, 1, 5, 6]))
    inputs = random_inputs(model, rng)
    inputs["mask"] = rng.random((2, 1, 5, 6)) < 0.6
    inputs["mask"][0, 0, [1, 3]] = False
    inputs["mask"][1, 0, 4] = False
    ours, _ = compile_and_compare(capsys, tmp_path, model, inputs)
    (ref,) = ReferenceEvaluator(model).run(None, inputs)
    assert np.isfinite(ours["y"]).all() and not ours["y"][0, :, [1, 3]].any()
    assert rel_err(ours["y"], ref) < 1e-5


def test_onnx_attention_softcap_takes_the_explicit_path(capsys, tmp_path, rng):
    """softcap is not expressible by relax.nn.attention: the frontend spells the computation out (matmul,
    tanh cap, softmax, matmul), and it matches onnx's reference."""
    from onnx.reference import ReferenceEvaluator

    model = onnx_attention([1, 2, 3, 4], ([1, 2, 3, 4], [1, 2, 3, 4]), softcap=1.5)
    inputs = random_inputs(model, rng)
    ours, _ = compile_and_compare(capsys, tmp_path, model, inputs)
    (ref,) = ReferenceEvaluator(model).run(None, inputs)
    assert rel_err(ours["y"], ref) < 1e-5
    ops = [op for k in kernels(capsys, tmp_path / "model.onnx") for op in k["ops"]]
    assert "relax.tanh" in ops


@pytest.mark.parametrize("exponent,ops", [(3.0, ["multiply", "multiply"]), (2.0, ["multiply"]), (2.5, ["power"])])
def test_small_constant_powers_are_products(capsys, tmp_path, rng, exponent, ops):
    """pow(x, 3) (GPT-2's GELU) and pow(x, 2) become multiplies: right for x < 0, where CUDA's fast-math powf
    gave NaN; other exponents stay pow (NaN for x < 0 as ONNX says)."""
    g = blocks.Graph()
    y = g.n("Pow", [g.input("x", [5, 33]), g.c(np.array(exponent, np.float32))])
    model = g.model([y])
    inputs = {"x": np.concatenate([rng.standard_normal((5, 30)), [[-np.inf, np.nan, -0.0]] * 5], axis=1).astype(np.float32)}
    ours, ref = compile_and_compare(capsys, tmp_path, model, inputs)
    (name,) = ref
    np.testing.assert_allclose(ours[name], ref[name], rtol=1e-6, equal_nan=True)
    np.testing.assert_array_equal(np.signbit(ours[name]), np.signbit(ref[name]))
    (k,) = kernels(capsys, tmp_path / "model.onnx")
    assert k["ops"] == _ops(*ops)


@pytest.mark.parametrize(
    "indices,axis,sliced",
    [(np.array(1), 0, True), (np.array(-1), 1, True), (np.array([1, 3, 5]), 2, True), (np.array([4]), 1, True),
     (np.array([2, 0]), 2, False), (np.array([[0, 1]]), 0, False)],
)
def test_constant_index_gather_is_a_slice_that_fuses(capsys, tmp_path, rng, indices, axis, sliced):
    """Gather at a constant index (PyTorch's packed q/k/v split) or evenly spaced ones becomes a slice, fused with
    what follows; other index sets stay a take. Numbers vs onnxruntime either way."""
    g = blocks.Graph()
    picked = g.n("Gather", [g.input("x", [3, 5, 7]), g.c(indices.astype(np.int64))], axis=axis)
    model = g.model([g.n("Relu", [picked])])
    ks = check(capsys, tmp_path, model, rng, tol=1e-12)  # a copy: exact
    ops = [op for k in ks for op in k["ops"]]
    assert ("relax.take" not in ops and "relax.strided_slice" in ops and len(ks) == 1) == sliced, ks


@pytest.mark.parametrize("shared_elsewhere", [False, True])
def test_packed_qkv_slices_each_read_the_projection(capsys, tmp_path, rng, shared_elsewhere):
    """PyTorch's packed q/k/v (``nn.MultiheadAttention``, torchvision's ViT): qkv [s, b, 3e] -> Reshape -> Unsqueeze
    -> Transpose -> Squeeze -> three Gathers. Each slice's kernel recomputes the layout chain from qkv, so no kernel
    writes the [3, s, b, e] copy; unless the copy is read by something else too (here: a model output), then it is
    written once, as before. Numbers vs onnxruntime either way."""
    g = blocks.Graph()
    s, b, e = 5, 3, 8
    qkv = g.n("Add", [g.n("MatMul", [g.input("x", [s, b, 6]), g.w(6, 3 * e)]), g.w(3 * e)])
    split = g.n("Reshape", [qkv, g.c(np.array([s, b, 3, e], np.int64))])
    moved = g.n("Transpose", [g.n("Unsqueeze", [split, g.c(np.array([0], np.int64))])], perm=[3, 1, 2, 0, 4])
    packed = g.n("Squeeze", [moved, g.c(np.array([3], np.int64))])
    parts = [g.n("Gather", [packed, g.c(np.array(i, np.int64))], axis=0) for i in range(3)]
    outputs = [g.n("Mul", [p, g.c(np.array(0.35, np.float32))]) for p in parts[:2]] + [parts[2]]
    ks = check(capsys, tmp_path, g.model(outputs + [packed] * shared_elsewhere), rng, tol=1e-6)
    layout = [k for k in ks if "relax.permute_dims" in k["ops"]]
    sliced = [k for k in layout if "relax.strided_slice" in k["ops"]]
    assert (len(layout), len(sliced)) == ((1, 0) if shared_elsewhere else (3, 3)), ks


def _addmm_view(g: "blocks.Graph", rng) -> str:
    """Hugging Face GPT-2's Conv1D: a 2-D addmm viewed as [1, 6, 10]."""
    h = g.n("Add", [g.n("MatMul", [g.input("x", [6, 8]), g.c(rng.standard_normal((8, 10)).astype(np.float32))]),
                    g.c(rng.standard_normal(10).astype(np.float32))])
    return g.n("Reshape", [h, g.c(np.array([1, 6, 10], np.int64))])


def _tanh_gelu(g: "blocks.Graph", h: str) -> str:
    cube = g.n("Mul", [g.n("Pow", [h, g.c(np.array(3.0, np.float32))]), g.c(np.array(0.044715, np.float32))])
    t = g.n("Tanh", [g.n("Mul", [g.n("Add", [h, cube]), g.c(np.array(0.7978845608, np.float32))])])
    return g.n("Mul", [g.n("Mul", [h, g.c(np.array(0.5, np.float32))]), g.n("Add", [t, g.c(np.array(1.0, np.float32))])])


@pytest.mark.parametrize("tail", ["gelu", "residual", "output"])
def test_elementwise_after_an_addmm_view_fuses_into_the_matmul(capsys, tmp_path, rng, tail):
    """GPT-2's MLP: the tanh-GELU after its reshaped addmm (then the next matmul), or the residual add (then a
    reduction), is the matmul's epilogue; at a model output the last op keeps the reshape (no copy kernel)."""
    g = blocks.Graph()
    h = _addmm_view(g, rng)
    if tail == "gelu":
        flat = g.n("Reshape", [_tanh_gelu(g, h), g.c(np.array([6, 10], np.int64))])
        y = g.n("MatMul", [flat, g.c(rng.standard_normal((10, 4)).astype(np.float32))])
    elif tail == "residual":
        y = g.n("ReduceSum", [g.n("Add", [h, g.input("r", [1, 6, 10])]), g.c(np.array([-1], np.int64))])
    else:
        y = _tanh_gelu(g, h)
    ks = check(capsys, tmp_path, g.model([y]), rng)
    (first,) = [k for k in ks if "relax.matmul" in k["ops"] and "relax.add" in k["ops"]]
    if tail == "gelu":
        assert "relax.tanh" in first["ops"], ks
    elif tail == "residual":
        assert first["ops"].count("relax.add") == 2, ks
    assert all(k["ops"] != ["relax.reshape"] for k in ks), ks
@pytest.mark.parametrize("case", ["fewer axes", "broadcast"])
def test_reshapes_that_must_stay_do(capsys, tmp_path, rng, case):
    """A reshape that removes axes, and an op whose other operand broadcasts, keep their order (numbers only)."""
    g = blocks.Graph()
    x = g.input("x", [2, 3, 4])
    if case == "fewer axes":
        y = g.n("Tanh", [g.n("Reshape", [x, g.c(np.array([6, 4], np.int64))])])
    else:
        y = g.n("Add", [g.n("Reshape", [x, g.c(np.array([1, 6, 4], np.int64))]), g.input("b", [4])])
    check(capsys, tmp_path, g.model([y]), rng)


def test_gelu_after_an_addmm_view_fuses_under_mixed_precision(capsys, tmp_path, rng):
    """``--precision fp16``: ToMixedPrecision casts the GELU's scalars (``astype(3.0)``); folded to constants, the
    pow becomes products and the GELU is the tensor-core GEMM's epilogue."""
    g = blocks.Graph()
    flat = g.n("Reshape", [_tanh_gelu(g, _addmm_view(g, rng)), g.c(np.array([6, 10], np.int64))])
    y = g.n("MatMul", [flat, g.c(rng.standard_normal((10, 4)).astype(np.float32))])
    path = save(g.model([y]), tmp_path / "m.onnx")
    r = run_cli(capsys, "compile", path, "--target", "cuda-sm90", "--precision", "fp16", "-o", tmp_path / "m.tvmpkg")
    assert r.code == 0, r.err
    with zipfile.ZipFile(tmp_path / "m.tvmpkg") as zf:
        kernels = json.loads(zf.read("manifest.json"))["kernels"]
    (gelu,) = [name for name in kernels if "tanh" in name]
    assert kernels[gelu] == "hand:GpuMatmul" and "power" not in gelu, kernels


# ---------------------------------------------------------------- outputs that only reshape a kernel's result


@pytest.mark.parametrize("source", ["kernel", "input"])
def test_output_reshape_is_written_by_its_producer(capsys, tmp_path, rng, source):
    """The model's output reshapes a kernel's result: that kernel writes the output (no copy kernel; in a tuple of
    outputs TVM makes such a reshape a view itself). A reshaped input stays a copy. Both match onnxruntime."""
    g = blocks.Graph()
    x = g.input("x", [3, 7])
    h = g.n("Relu", [g.n("MatMul", [x, g.c(rng.standard_normal((7, 10)).astype(np.float32))])]) if source == "kernel" else x
    ks = check(capsys, tmp_path, g.model([g.n("Reshape", [h, g.c(np.int64([-1, 5] if source == "kernel" else [7, 3]))])]), rng)
    assert [k["ops"] for k in ks] == ([["relax.matmul", "relax.nn.relu"]] if source == "kernel" else [["relax.reshape"]]), ks


def _output_reshape_module(case: str):
    """``main`` returns ``reshape(add(x))`` ("kernel"), ``reshape(x)`` ("input") or ``(reshape(add(x)),)`` ("tuple")."""
    import tvm
    from tvm.script import ir as I
    from tvm.script import relax as R
    from tvm.script import tirx as T

    @I.ir_module
    class Module:
        @T.prim_func(private=True, s_tir=True)
        def add(a: T.Buffer((2, 6), "float32"), out: T.Buffer((2, 6), "float32")):
            for i, j in T.grid(2, 6):
                with T.sblock("add"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    out[vi, vj] = a[vi, vj] + T.float32(1)

        @T.prim_func(private=True, s_tir=True)
        def reshape(a: T.Buffer((2, 6), "float32"), out: T.Buffer((3, 4), "float32")):
            for i, j in T.grid(3, 4):
                with T.sblock("reshape"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    out[vi, vj] = a[(vi * 4 + vj) // 6, (vi * 4 + vj) % 6]

        @R.function
        def kernel(x: R.Tensor((2, 6), "float32")):
            cls = Module
            with R.dataflow():
                lv = R.call_tir(cls.add, (x,), R.Tensor((2, 6), "float32"))
                gv = R.call_tir(cls.reshape, (lv,), R.Tensor((3, 4), "float32"))
                R.output(gv)
            return gv

        @R.function
        def input(x: R.Tensor((2, 6), "float32")):
            cls = Module
            with R.dataflow():
                gv = R.call_tir(cls.reshape, (x,), R.Tensor((3, 4), "float32"))
                R.output(gv)
            return gv

        @R.function
        def tuple(x: R.Tensor((2, 6), "float32")):
            cls = Module
            with R.dataflow():
                lv = R.call_tir(cls.add, (x,), R.Tensor((2, 6), "float32"))
                lv1 = R.call_tir(cls.reshape, (lv,), R.Tensor((3, 4), "float32"))
                gv = (lv1,)
                R.output(gv)
            return gv

    return tvm.IRModule({**{g: Module[g] for g in Module.get_global_vars() if g.name_hint in ("add", "reshape")},
                         "main": Module[case].with_attr("global_symbol", "main")})


def test_write_output_shape_before_after():
    """The producer's output parameter takes the output's shape, its body writing the old one through a view; the
    reshape kernel goes. A reshaped input keeps the copy; so does the pass a reshape in a tuple of outputs (a
    dataflow variable, which TVM's RewriteDataflowReshape makes a view)."""
    import tvm
    from tvm.script import ir as I
    from tvm.script import relax as R
    from tvm.script import tirx as T

    from compiler.passes import write_output_shape

    @I.ir_module
    class After:
        @T.prim_func(private=True, s_tir=True)
        def add(a: T.Buffer((2, 6), "float32"), out: T.Buffer((3, 4), "float32")):
            out_1 = T.decl_buffer((2, 6), "float32", data=out.data)
            for i, j in T.grid(2, 6):
                with T.sblock("add"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    out_1[vi, vj] = a[vi, vj] + T.float32(1)

        @R.function
        def main(x: R.Tensor((2, 6), "float32")):
            cls = After
            with R.dataflow():
                gv = R.call_tir(cls.add, (x,), R.Tensor((3, 4), "float32"))
                R.output(gv)
            return gv

    mod, folded = write_output_shape(_output_reshape_module("kernel"))
    assert folded == ["reshape"]
    tvm.ir.assert_structural_equal(mod, After)
    for case in ("input", "tuple"):
        before = _output_reshape_module(case)
        mod, folded = write_output_shape(before)
        assert folded == [] and mod.same_as(before), case


def test_cuda_decode_output_is_the_attention_kernels(tmp_path):
    """A decoding step's attention reshaped to [batch, seq, hidden] as the model's output: for CUDA the attention
    kernel writes it (two launches, not three), with the same CUDA code as before the fold."""
    import tvm

    from compiler import pipeline
    from compiler.passes.output_reshape import with_output_shape
    from compiler.pipeline import Options

    h16 = TP.FLOAT16
    model = make_model([helper.make_node("Attention", ["q", "k", "v"], ["y"], q_num_heads=4, kv_num_heads=2)],
                       [("q", h16, [1, 1, 96]), ("k", h16, [1, 33, 48]), ("v", h16, [1, 33, 48])],
                       [("y", h16, [1, 1, 96])], opset=23)
    prep = pipeline.prepare(save(model, tmp_path / "m.onnx"), "cuda-sm90")
    mod, kernels, _ = pipeline.schedule(prep, Options())
    assert kernels == {"attention": "hand:Attention"}, kernels
    folded, before = mod["attention"], prep.mod["attention"]
    assert [int(d) for d in folded.params[-1].shape] == [1, 1, 96]

    def cuda(func):
        with prep.target.target:
            exe = tvm.compile(tvm.IRModule({"main": func}), target=prep.target.target)
        return exe.mod.imports[0].inspect_source()

    assert cuda(folded) == cuda(before) == cuda(with_output_shape(before, [96]))
