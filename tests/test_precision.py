"""--precision fp16 and --cuda-graph: numerics of the fp16 rewrite, the manifest, and refusals on CPU."""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper

from compiler import frontend, passes, precision, targets
from compiler.build import build
from tests.helpers import make_model, ort_run, rel_err, run_cli, save

sys.path.insert(0, str(Path(__file__).parent.parent / "models"))
import fusion_blocks as blocks  # noqa: E402


def _conv_clip_matmul(rng) -> onnx.ModelProto:
    """Conv -> ReLU6 (Clip, which ToMixedPrecision cannot take as is) -> MatMul -> Softmax."""
    w = (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32)
    m = (rng.standard_normal((5 * 5, 7)) * 0.3).astype(np.float32)
    lo, hi = np.array(0, np.float32), np.array(6, np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Clip", ["c", "lo", "hi"], ["r"]),
        helper.make_node("Reshape", ["r", "shape"], ["f"]),
        helper.make_node("MatMul", ["f", "m"], ["y0"]),
        helper.make_node("Softmax", ["y0"], ["y"], axis=-1),
    ]
    inits = {"w": w, "m": m, "lo": lo, "hi": hi, "shape": np.array([2, 8, 25], np.int64)}
    return make_model(nodes, [("x", TensorProto.FLOAT, [2, 3, 9, 9])], [("y", TensorProto.FLOAT, [2, 8, 7])], inits)


def test_fp16_rewrite_is_close_to_fp32(tmp_path, rng):
    """The fp16 module (built for the CPU here: its numerics do not depend on the target) stays within
    fp16 accuracy of onnxruntime's fp32, keeps fp32 inputs/outputs, and really computes in fp16."""
    import tvm
    from tvm.runtime.vm import VirtualMachine

    src = save(_conv_clip_matmul(rng), tmp_path / "m.onnx")
    info = targets.resolve("cpu")
    mod = precision.apply(frontend.load(src).mod, "fp16")
    assert "float16" in mod.script(show_meta=False)
    mod, _ = passes.optimize(mod, info)
    vm = VirtualMachine(build(mod, info).exe, tvm.cpu())
    x = rng.standard_normal((2, 3, 9, 9)).astype(np.float32)
    ours = vm["main"](tvm.runtime.tensor(x)).numpy()
    ref = ort_run(src, {"x": x})["y"]
    assert ours.dtype == np.float32
    err = rel_err(ours, ref)
    assert err < 3e-2
    assert err > 0  # fp16 rounding shows: the fp32 path would match to ~1e-7


@pytest.mark.parametrize("flag", [("--precision", "fp16"), ("--cuda-graph",)])
def test_gpu_only_options_refused_for_cpu(capsys, tmp_path, rng, flag):
    src = save(_conv_clip_matmul(rng), tmp_path / "m.onnx")
    r = run_cli(capsys, "compile", src, "-t", "cpu", "-o", tmp_path / "m.tvmpkg", *flag)
    assert r.code == 2
    assert "GPU targets" in r.err and "cpu" in r.err
    assert not (tmp_path / "m.tvmpkg").exists()


def test_cuda_fp16_graph_recorded_in_manifest(capsys, tmp_path, rng):
    pytest.importorskip("cuda.bindings")
    src = save(_conv_clip_matmul(rng), tmp_path / "m.onnx")
    pkg = tmp_path / "m.tvmpkg"
    r = run_cli(capsys, "compile", src, "-t", "cuda-sm90", "-o", pkg, "--precision", "fp16", "--cuda-graph")
    assert r.code == 0, r.err
    with zipfile.ZipFile(pkg) as zf:
        manifest = json.loads(zf.read("manifest.json"))
    assert manifest["options"]["precision"] == "fp16" and manifest["options"]["cuda_graph"] is True
    assert manifest["inputs"] == [{"name": "x", "shape": [2, 3, 9, 9], "dtype": "float32"}]
    assert manifest["gpu_code"]["images"][0] == "sm_90a cubin"


def test_cast_before_layout_moves_narrowing_casts_up():
    """A float32 -> float16 cast of layout ops (a repeat_kv, a transpose) moves above them; a widening cast, and one
    of a layout op that something else reads too, stay where they are."""
    from tvm import relax
    from tvm.script import relax as R

    @R.function
    def before(x: R.Tensor((2, 3, 4), "float32"), y: R.Tensor((2, 3), "float16")):
        with R.dataflow():
            e = R.expand_dims(x, axis=[1])
            b = R.broadcast_to(e, R.shape([2, 5, 3, 4]))
            r = R.reshape(b, R.shape([10, 3, 4]))
            t = R.permute_dims(r, axes=[0, 2, 1])
            c = R.astype(t, "float16")
            w = R.astype(R.permute_dims(y, axes=[1, 0]), "float32")  # widening
            s = R.permute_dims(x, axes=[2, 1, 0])
            shared = (R.astype(s, "float16"), R.add(s, s))  # the transposed x is read twice
            R.output(c, w, shared)
        return c, w, shared

    @R.function
    def after(x: R.Tensor((2, 3, 4), "float32"), y: R.Tensor((2, 3), "float16")):
        with R.dataflow():
            c = R.permute_dims(R.reshape(R.broadcast_to(R.expand_dims(R.astype(x, "float16"), axis=[1]),
                                                        R.shape([2, 5, 3, 4])), R.shape([10, 3, 4])), axes=[0, 2, 1])
            w = R.astype(R.permute_dims(y, axes=[1, 0]), "float32")
            s = R.permute_dims(x, axes=[2, 1, 0])
            shared = (R.astype(s, "float16"), R.add(s, s))
            R.output(c, w, shared)
        return c, w, shared

    def module(func: relax.Function) -> tvm.IRModule:
        return tvm.IRModule({"main": func.with_attr("global_symbol", "main")})

    tvm.ir.assert_structural_equal(precision.cast_before_layout(module(before)), module(after))


def _fp16_kernels_for_cpu(src) -> tvm.IRModule:
    """``src`` imported in fp16 and through the graph passes and lowering for the CPU (built there: the fp16 rewrite
    and the graph passes do not depend on the target), its kernels not yet scheduled."""
    from compiler import schedules

    mod = precision.apply(frontend.load(src).mod, "fp16")
    return passes.optimize(mod, targets.resolve("cpu"), legalize=schedules.legalizations())[0]


def _kernel_ops(mod: tvm.IRModule) -> list[list[str]]:
    """The ops each kernel of ``mod`` computes (``tvmpipe.ops``)."""
    return [list(f.attrs[passes.OPS_ATTR]) for f in mod.functions.values()
            if f.attrs is not None and passes.OPS_ATTR in f.attrs]


def _run_on_cpu(mod: tvm.IRModule, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """``mod`` (from ``_fp16_kernels_for_cpu``) scheduled, built and run on ``inputs`` (in order): its outputs."""
    from tvm.runtime.vm import VirtualMachine

    from compiler import schedules

    info = targets.resolve("cpu")
    mod, chosen = schedules.apply(mod, info)
    assert "Attention" in chosen.values(), chosen
    outs = VirtualMachine(build(mod, info).exe, tvm.cpu())["main"](*(tvm.runtime.tensor(a) for a in inputs.values()))
    return [o.numpy() for o in (outs if isinstance(outs, tvm.ir.Array) else [outs])]


def test_fp16_kv_cache_step_casts_the_cache_once(tmp_path, rng):
    """A float32 decoding step (transformers' repeat_kv) in fp16: the attention kernel reads one float16 cast of the
    cache, not a copy repeated to every query head (built for the CPU here; the rewrite does not depend on the
    target); outputs and the returned cache within fp16 accuracy of onnxruntime's float32."""
    src = save(blocks.kv_cache_step("repeat_kv", 3, d=32), tmp_path / "m.onnx")
    mod = _fp16_kernels_for_cpu(src)
    ops = _kernel_ops(mod)
    assert ["relax.astype"] in ops and not any("relax.broadcast_to" in k for k in ops), ops
    b, s, past, g, d = 2, 3, 11, 2, 32
    x = {"x": rng.standard_normal((b, s, 6 * d)), "bias": rng.standard_normal((b, 1, s, past + s)),
         "past_k": rng.standard_normal((b, g, past, d)), "past_v": rng.standard_normal((b, g, past, d))}
    x = {n: a.astype(np.float32) for n, a in x.items()}
    outs = _run_on_cpu(mod, x)
    assert len(outs) == 3
    for got, ref in zip(outs, ort_run(src, x).values()):
        assert got.dtype == np.float32 and rel_err(got, ref) < 1e-2


def test_fp16_attention_keeps_a_float32_mask(tmp_path, rng):
    """T5's attention under mixed precision: float16 scores plus a float16 position bias, then a float32 mask
    (Where(keep, 0, -FLT_MAX)) added in float32. One attention kernel, whose bias stays float32: a query row masked
    everywhere gets the mean of V as in onnxruntime's float32 graph, the rest within fp16 accuracy (built for the CPU
    here; the CUDA kernels read such a bias too, test_schedules_attention). The fusion raised a dtype error before."""
    b, s, h, d = 2, 20, 4, 32
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["scores"]), helper.make_node("Add", ["scores", "pos"], ["z0"]),
             helper.make_node("Where", ["keep", "zero", "fmin"], ["mask"]), helper.make_node("Add", ["z0", "mask"], ["z"]),
             helper.make_node("Softmax", ["z"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["o"]),
             helper.make_node("MatMul", ["o", "w"], ["y"])]  # (a float16 consumer, as the next layer is)
    inits = {"pos": rng.standard_normal((1, h, s, s)).astype(np.float32), "w": rng.standard_normal((d, d)).astype(np.float32),
             "zero": np.array(0.0, np.float32), "fmin": np.array(np.finfo(np.float32).min, np.float32)}
    ins = [(n, TensorProto.FLOAT, [b, h, s, d]) for n in "qkv"] + [("keep", TensorProto.BOOL, [b, 1, s, s])]
    src = save(make_model(nodes, ins, [("y", TensorProto.FLOAT, [b, h, s, d])], inits), tmp_path / "t5.onnx")
    mod = _fp16_kernels_for_cpu(src)
    (attention,) = [f for f in mod.functions.values()
                    if f.attrs is not None and list(f.attrs.get(passes.OPS_ATTR, [])) == ["relax.nn.attention_bias"]]
    assert [str(p.ty.dtype) for p in attention.params] == ["float16"] * 3 + ["float32", "float16"]  # q k v bias out
    x = {n: rng.standard_normal((b, h, s, d)).astype(np.float32) for n in "qkv"}
    x["keep"] = np.tril(np.ones((s, s), bool))[None, None].repeat(b, 0)
    x["keep"][1, :, :, 15:] = False  # padding
    x["keep"][1, :, 3] = False  # query row 3 sees no key
    (ours,) = _run_on_cpu(mod, x)
    assert rel_err(ours, ort_run(src, x)["y"]) < 1e-2
