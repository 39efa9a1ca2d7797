"""Custom-op plug-ins through the CLI: the shipped RMSNorm example on CPU and cuda-sm90, a package that
loads without its plug-in, ops without schedules, attributes and several outputs, and the errors."""

import hashlib
import json
import os
import re
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper

from helpers import make_model, rel_err, run_cli, save

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "plugins"
PLUGIN = EXAMPLE / "rmsnorm.py"
sys.path.insert(0, str(EXAMPLE))
import make_model as example  # noqa: E402

F = TP.FLOAT


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch):
    """Each test registers into empty copies, so no test sees another's ops or overrides."""
    from compiler import plugins
    from compiler.frontend import registry

    monkeypatch.setattr(registry, "_CONVERTERS", dict(registry._CONVERTERS))
    monkeypatch.setattr(plugins, "_OPS", {})


def _compile(capsys, tmp_path, model, *args, target="cpu"):
    src = model if isinstance(model, Path) else save(model, tmp_path / "m.onnx")
    return run_cli(capsys, "compile", src, "--target", target, "-o", tmp_path / "m.tvmpkg", *args)


def _run(capsys, tmp_path, **inputs):
    np.savez(tmp_path / "in.npz", **inputs)
    r = run_cli(capsys, "run", tmp_path / "m.tvmpkg", "--inputs", tmp_path / "in.npz", "--outputs", tmp_path / "out.npz")
    assert r.code == 0, r.err
    with np.load(tmp_path / "out.npz") as f:
        return {k: f[k] for k in f.files}


def _manifest(pkg: Path) -> dict:
    with zipfile.ZipFile(pkg) as zf:
        return json.loads(zf.read("manifest.json"))


def test_example_model_is_the_one_make_model_builds():
    assert onnx.load(example.MODEL).SerializeToString() == example.build().SerializeToString()


def test_example_cpu_matches_numpy_and_loads_without_the_plugin(capsys, tmp_path, rng):
    b, s = (int(v) for v in rng.integers(1, 6, 2))
    r = _compile(capsys, tmp_path, example.MODEL, "--plugin", PLUGIN, "--input-shape", f"x:{b}x{s}x64")
    assert r.code == 0, r.err
    m = _manifest(tmp_path / "m.tvmpkg")
    assert m["kernels"]["plugin_RMSNorm"] == "hand:PluginSchedule"
    assert m["options"]["plugins"] == [{"file": "rmsnorm.py", "sha256": hashlib.sha256(PLUGIN.read_bytes()).hexdigest()}]
    x = rng.standard_normal((b, s, 64)).astype(np.float32)
    ref = example.reference(onnx.load(example.MODEL), x)
    assert rel_err(_run(capsys, tmp_path, x=x)["y"], ref) < 1e-5

    # A fresh process that never imports the plug-in (nor tvmpipe's frontend) runs the package.
    np.save(tmp_path / "x.npy", x)
    code = textwrap.dedent(f"""
        import sys, numpy as np, compiler
        y = compiler.load({str(tmp_path / 'm.tvmpkg')!r})(x=np.load({str(tmp_path / 'x.npy')!r}))["y"]
        assert not [m for m in sys.modules if "plugin" in m or m.startswith("compiler.frontend")], sorted(sys.modules)
        np.save({str(tmp_path / 'y.npy')!r}, y)
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert rel_err(np.load(tmp_path / "y.npy"), ref) < 1e-5


@pytest.mark.parametrize("width,dtype,tol", [(37, np.float32, 1e-5), (96, np.float16, 2e-3)])
def test_example_op_odd_shapes(capsys, tmp_path, rng, width, dtype, tol):
    """A width with no vector factor (scalar CPU path), and float16 (accumulated in float32)."""
    rows = int(rng.integers(1, 9))
    scale = rng.standard_normal(width).astype(dtype)
    node = helper.make_node("RMSNorm", ["x", "scale"], ["y"], name="n", domain="tvmpipe.example", epsilon=1e-3)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    model = make_model([node], [("x", elem, [rows, width])], [("y", elem, [rows, width])], {"scale": scale},
                       extra_opsets={"tvmpipe.example": 1})
    assert _compile(capsys, tmp_path, model, "--plugin", PLUGIN).code == 0
    x = rng.standard_normal((rows, width)).astype(dtype)
    y = _run(capsys, tmp_path, x=x)["y"]
    assert y.dtype == dtype and rel_err(y, example.rmsnorm(x, scale, 1e-3)) < tol


def test_example_shape_check_names_the_node(capsys, tmp_path):
    node = helper.make_node("RMSNorm", ["x", "scale"], ["y"], name="norm_7", domain="tvmpipe.example")
    model = make_model([node], [("x", F, [2, 8])], [("y", F, [2, 8])], {"scale": np.ones(7, np.float32)},
                       extra_opsets={"tvmpipe.example": 1})
    r = _compile(capsys, tmp_path, model, "--plugin", PLUGIN)
    assert r.code == 2 and "tvmpipe.example::RMSNorm (node 'norm_7'): shape() failed: ValueError" in r.err, r.err
    assert "[2, 8] and [7]" in r.err


def test_example_builds_for_cuda_with_its_own_schedule(capsys, tmp_path, monkeypatch):
    from compiler import cuda_binary

    sources = []
    compile_source = cuda_binary.compile_source
    monkeypatch.setattr(cuda_binary, "compile_source", lambda src, arch: (sources.append(src), compile_source(src, arch))[1])
    r = _compile(capsys, tmp_path, example.MODEL, "--plugin", PLUGIN, "--input-shape", "x:3x5x64", target="cuda-sm90")
    assert r.code == 0, r.err
    m = _manifest(tmp_path / "m.tvmpkg")
    assert "sm_90a cubin" in m["gpu_code"]["images"] and m["kernels"]["plugin_RMSNorm"] == "hand:PluginSchedule"
    with zipfile.ZipFile(tmp_path / "m.tvmpkg") as zf:
        assert b"plugin_RMSNorm_kernel" in zf.read("model.so")
    (src,) = sources
    start = re.search(r'extern "C" __global__ void (__launch_bounds__\(\d+\) )?plugin_RMSNorm_kernel\(.*\{', src)
    kernel = src[start.start():src.find('extern "C"', start.end())]
    # The plug-in's schedule: one 32-thread block (one warp) per row of 200, reduced by warp shuffles only
    # (DLight's own schedule for this kernel uses 128 threads and a shared-memory stage between warps).
    assert "__launch_bounds__(32)" in kernel and "blockIdx.x" in kernel and kernel.count("__shfl_down_sync") == 5
    assert "red_buf_staging" not in kernel


PLUGINS = {
    # elementwise, no schedule (fuses with its neighbours), string/float/ints attrs, two outputs
    "split_affine": """
        from tvm import te
        from compiler import register_op

        def shape(shapes, dtypes, attrs):
            assert attrs == {"mode": "affine", "alpha": 2.0, "pair": (1, 3)}, attrs
            return [(shapes[0], dtypes[0])] * 2

        @register_op("test.ops", "SplitAffine", shape=shape)
        def split_affine(x, mode="", alpha=1.0, pair=()):
            lo, hi = pair
            return (te.compute(x.shape, lambda *i: x[i] * alpha + lo, name="a"),
                    te.compute(x.shape, lambda *i: x[i] * alpha - hi, name="b"))
    """,
}


def _plugin(tmp_path: Path, source: str, name: str = "my_ops.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(PLUGINS.get(source, source)))
    return path


def test_op_without_schedule_fuses_and_gets_its_attrs(capsys, tmp_path, rng):
    nodes = [helper.make_node("SplitAffine", ["x"], ["a", "b"], name="sa", domain="test.ops", mode="affine",
                              alpha=2.0, pair=[1, 3]),
             helper.make_node("Exp", ["a"], ["ea"]), helper.make_node("Mul", ["ea", "b"], ["y"])]
    model = make_model(nodes, [("x", F, [3, 7])], [("y", F, [3, 7])], extra_opsets={"test.ops": 1})
    r = _compile(capsys, tmp_path, model, "--plugin", _plugin(tmp_path, "split_affine"))
    assert r.code == 0, r.err
    assert len(_manifest(tmp_path / "m.tvmpkg")["kernels"]) == 1  # plug-in op, Exp and Mul: one fused kernel
    x = rng.standard_normal((3, 7)).astype(np.float32)
    x64 = x.astype(np.float64)
    assert rel_err(_run(capsys, tmp_path, x=x)["y"], np.exp(2 * x64 + 1) * (2 * x64 - 3)) < 1e-6


def test_override_builtin_op(capsys, tmp_path, rng):
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", F, [5])], [("y", F, [5])])
    leaky = """
        from tvm import te, tirx
        from compiler import register_op

        @register_op("", "Relu", shape=lambda s, d, a: [(s[0], d[0])], override={override})
        def leaky(x):
            return te.compute(x.shape, lambda i: tirx.max(x[i], x[i] * 0.5), name="leaky")
    """
    r = _compile(capsys, tmp_path, model, "--plugin", _plugin(tmp_path, leaky.format(override=False)))
    assert r.code == 2 and "Relu is an op tvmpipe already converts" in r.err and "override=True" in r.err
    assert _compile(capsys, tmp_path, model, "--plugin", _plugin(tmp_path, leaky.format(override=True), "b.py")).code == 0
    x = rng.standard_normal(5).astype(np.float32)
    np.testing.assert_allclose(_run(capsys, tmp_path, x=x)["y"], np.maximum(x, 0.5 * x), rtol=1e-6)


ERRORS = {
    "missing": (None, ["plug-in file not found", "nope.py"]),
    "import_error": ("import not_a_real_package_xyz\n", ["my_ops.py failed to import", "ModuleNotFoundError",
                                                         "not_a_real_package_xyz"]),
    "syntax_error": ("def broken(:\n", ["my_ops.py failed to import", "SyntaxError"]),
    "wrong_shape": ("""
        from tvm import te
        from compiler import register_op

        @register_op("test.err", "Op", shape=lambda s, d, a: [((s[0][0] + 1,), d[0])])
        def op(x):
            return te.compute(x.shape, lambda i: x[i] + 1, name="op")
    """, ["test.err::Op", "node 'bad'", "declares outputs [float32[5]]", "produced [float32[4]]"]),
    "bad_schedule_key": ("""
        from compiler import register_op

        register_op("test.err", "Op", shape=lambda *a: [], compute=lambda x: x, schedule={"gpu": print})
    """, ["my_ops.py", "schedule must map target kinds", "unknown: gpu"]),
    "broken_schedule": ("""
        from tvm import te
        from compiler import register_op

        def sched(sch):
            sch.get_sblock("no_such_block")

        @register_op("test.err", "Op", shape=lambda s, d, a: [(s[0], d[0])], schedule={"cpu": sched})
        def op(x):
            return te.compute(x.shape, lambda i: x[i] + 1, name="op")
    """, ["cpu schedule of plug-in op test.err::Op", "my_ops.py:5", "no_such_block"]),
    "cuda_schedule_binds_nothing": ("""
        from tvm import te
        from compiler import register_op

        @register_op("test.err", "Op", shape=lambda s, d, a: [(s[0], d[0])], schedule={"cuda": lambda sch: None})
        def op(x):
            return te.compute(x.shape, lambda i: x[i] + 1, name="op")
    """, ["cuda schedule of plug-in op test.err::Op", "block(s) 'op' outside any blockIdx/threadIdx loop"]),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_plugin_errors(capsys, tmp_path, case):
    source, needles = ERRORS[case]
    model = make_model([helper.make_node("Op", ["x"], ["y"], name="bad", domain="test.err")],
                       [("x", F, [4])], [("y", F, [4])], extra_opsets={"test.err": 1})
    plugin = _plugin(tmp_path, source) if source else tmp_path / "nope.py"
    r = _compile(capsys, tmp_path, model, "--plugin", plugin, target="cuda-sm90" if "cuda" in case else "cpu")
    assert r.code == 2 and r.err.startswith("tvmpipe: error:") and r.err.count("\n") == 1, r.err
    for needle in needles:
        assert needle in r.err, r.err
    assert not (tmp_path / "m.tvmpkg").exists()


def test_op_name_clash_between_plugins(capsys, tmp_path):
    one = _plugin(tmp_path, PLUGINS["split_affine"], "one.py")
    two = _plugin(tmp_path, PLUGINS["split_affine"], "two.py")
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", F, [2])], [("y", F, [2])])
    r = _compile(capsys, tmp_path, model, "--plugin", one, "--plugin", one)  # the same file twice: harmless
    assert r.code == 0, r.err
    r = _compile(capsys, tmp_path, model, "--plugin", one, "--plugin", two)
    assert r.code == 2 and "test.ops::SplitAffine is already registered by" in r.err, r.err
    assert "one.py" in r.err and "two.py" in r.err and "override=True" in r.err


def test_plugin_that_registers_nothing_warns(capsys, tmp_path):
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", F, [2])], [("y", F, [2])])
    with pytest.warns(UserWarning, match="my_ops.py registered no ops"):
        assert _compile(capsys, tmp_path, model, "--plugin", _plugin(tmp_path, "X = 1\n")).code == 0
