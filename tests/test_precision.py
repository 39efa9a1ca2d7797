"""--precision fp16 and --cuda-graph: numerics of the fp16 rewrite, the manifest, and refusals on CPU."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from compiler import frontend, passes, precision, targets
from compiler.build import build
from tests.helpers import make_model, ort_run, rel_err, run_cli, save


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
