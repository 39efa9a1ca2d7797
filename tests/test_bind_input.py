"""``--bind-input``: a graph input frozen to a value at compile time, as a user drives it from the CLI.

The model reshapes ``x`` to a run-time ``shape`` and sums over run-time ``axes``: refused as it is (static
shapes), compiled once both are bound. The package then runs without them, accepts them fed with the bound
value, and refuses any other value with one error line naming the input.
"""

import json
import zipfile

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper

from helpers import make_model, ort_run, rel_err, run_cli, save

SHAPE = np.array([3, 4], np.int64)
AXES = np.array([-1], np.int64)


def _model():
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]),
             helper.make_node("ReduceSum", ["r", "axes"], ["y"], keepdims=0)]
    return make_model(nodes, [("x", TP.FLOAT, [2, 6]), ("shape", TP.INT64, [2]), ("axes", TP.INT64, [1])],
                      [("y", TP.FLOAT, ["n"])], opset=18)


@pytest.fixture(scope="module")
def bound_pkg(tmp_path_factory):
    """The model compiled with ``shape`` bound from a .npy and ``axes`` from a .npz."""
    tmp = tmp_path_factory.mktemp("bind")
    src = save(_model(), tmp / "m.onnx")
    np.save(tmp / "shape.npy", SHAPE)
    np.savez(tmp / "axes.npz", axes=AXES)
    from compiler.cli import main

    assert main(["compile", str(src), "-t", "cpu", "-o", str(tmp / "m.tvmpkg"),
                 "--bind-input", f"shape={tmp / 'shape.npy'}", "--bind-input", str(tmp / "axes.npz")]) == 0
    return src, tmp / "m.tvmpkg"


def test_refusal_suggests_bind_input(capsys, tmp_path):
    r = run_cli(capsys, "compile", save(_model(), tmp_path / "m.onnx"), "-t", "cpu", "-o", tmp_path / "m.tvmpkg")
    assert r.code == 2 and r.err.count("\n") == 1, r.err
    assert "--bind-input shape=FILE.npy" in r.err and "--bind-input axes=FILE.npy" in r.err


def test_refusal_names_the_inputs_a_shape_is_computed_from(tmp_path):
    """The shape is Concat(a, b): both graph inputs are named, and the error carries them for tools."""
    from compiler import compile_model
    from compiler.frontend.support import Unsupported

    nodes = [helper.make_node("Concat", ["a", "b"], ["s"], axis=0), helper.make_node("Reshape", ["x", "s"], ["y"])]
    model = make_model(nodes, [("x", TP.FLOAT, [12]), ("a", TP.INT64, [1]), ("b", TP.INT64, [1])],
                       [("y", TP.FLOAT, ["n"])])
    with pytest.raises(Unsupported, match="freeze them with --bind-input a=FILE.npy --bind-input b=FILE.npy") as err:
        compile_model(save(model, tmp_path / "m.onnx"), "cpu", tmp_path / "m.tvmpkg")
    assert err.value.bindable == ("a", "b")


def _expected(src, x):
    return ort_run(src, {"x": x, "shape": SHAPE, "axes": AXES})["y"]


def test_run_without_the_bound_inputs(capsys, tmp_path, bound_pkg, rng):
    src, pkg = bound_pkg
    x = rng.standard_normal((2, 6)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    r = run_cli(capsys, "run", pkg, "--inputs", tmp_path / "in.npz", "--outputs", tmp_path / "out.npz")
    assert r.code == 0, r.err
    with np.load(tmp_path / "out.npz") as f:
        assert f["y"].shape == (3,) and rel_err(f["y"], _expected(src, x)) < 1e-6


def test_run_with_the_bound_values_fed(capsys, tmp_path, bound_pkg, rng):
    src, pkg = bound_pkg
    x = rng.standard_normal((2, 6)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x, shape=SHAPE, axes=AXES)
    r = run_cli(capsys, "run", pkg, "--inputs", tmp_path / "in.npz", "--outputs", tmp_path / "out.npz")
    assert r.code == 0, r.err
    with np.load(tmp_path / "out.npz") as f:
        assert rel_err(f["y"], _expected(src, x)) < 1e-6


@pytest.mark.parametrize("fed,needle", [
    ({"shape": np.array([4, 3])}, "input 'shape' was bound at compile time (--bind-input) to int64[2] [3, 4], but "
                                  "the value given differs (at [0]: 4, bound 3)"),
    ({"axes": np.array([0])}, "input 'axes' was bound at compile time (--bind-input) to int64[1] [-1], but the value "
                              "given differs (at [0]: 0, bound -1)"),
    ({"shape": SHAPE.astype(np.int32)}, "input 'shape' was bound at compile time (--bind-input) to int64[2] [3, 4], "
                                        "but a int32[2] value was given"),
])
def test_run_with_a_different_value_is_refused(capsys, tmp_path, bound_pkg, fed, needle):
    _, pkg = bound_pkg
    np.savez(tmp_path / "in.npz", x=np.zeros((2, 6), np.float32), **fed)
    r = run_cli(capsys, "run", pkg, "--inputs", tmp_path / "in.npz")
    assert r.code == 2 and needle in r.err and r.err.count("\n") == 1, r.err


def test_manifest_records_the_bound_inputs(bound_pkg):
    from compiler.package import array_digest

    _, pkg = bound_pkg
    with zipfile.ZipFile(pkg) as zf:
        m = json.loads(zf.read("manifest.json"))
        assert "bound_inputs.npz" in zf.namelist()
    assert [i["name"] for i in m["inputs"]] == ["x"]
    assert m["bound_inputs"] == [
        {"name": "shape", "shape": [2], "dtype": "int64", "sha256": array_digest(SHAPE), "value": [3, 4]},
        {"name": "axes", "shape": [1], "dtype": "int64", "sha256": array_digest(AXES), "value": [-1]},
    ]


def test_bench_compare_feeds_the_bound_values_to_onnxruntime(capsys, bound_pkg):
    src, pkg = bound_pkg
    r = run_cli(capsys, "bench", pkg, "--repeat", "5", "--json", "--compare-onnx", src)
    assert r.code == 0, r.err
    assert json.loads(r.out.strip().splitlines()[-1])["max_rel_err"] < 1e-6


def test_python_api_binds_a_large_float_input(tmp_path, rng):
    """A bound value too large for the manifest is named by its hash; feeding another one is refused."""
    from compiler import TvmpipeError, compile_model, load

    model = make_model([helper.make_node("Mul", ["x", "w"], ["y"])], [("x", TP.FLOAT, [100]), ("w", TP.FLOAT, [100])],
                       [("y", TP.FLOAT, [100])])
    src = save(model, tmp_path / "m.onnx")
    w = rng.standard_normal(100).astype(np.float32)
    manifest = compile_model(src, "cpu", tmp_path / "m.tvmpkg", bind={"w": w})
    assert "value" not in manifest["bound_inputs"][0] and [i["name"] for i in manifest["inputs"]] == ["x"]
    run = load(tmp_path / "m.tvmpkg")
    x = rng.standard_normal(100).astype(np.float32)
    np.testing.assert_allclose(run(x=x)["y"], x * w, rtol=1e-6)
    assert np.array_equal(run(x=x, w=w)["y"], run(x=x)["y"])
    other = w.copy()
    other[57] = -0.0 if w[57] == 0 else 0.0
    with pytest.raises(TvmpipeError, match=r"input 'w' was bound .* float32\[100\] \(sha256 [0-9a-f]{12}\.\.\.\), "
                                           r"but the value given differs \(at \[57\]"):
        run(x=x, w=other)


@pytest.mark.parametrize("arg,needle", [
    ("shape", "malformed --bind-input 'shape': expected NAME=FILE.npy or FILE.npz"),
    ("=FILE", "malformed --bind-input '=FILE'"),
    ("shape=", "malformed --bind-input 'shape='"),
    ("shape={missing}", "--bind-input shape={missing}: file not found"),
    ("shape={text}", "is not a readable .npy file"),
    ("nope={shape}", "--bind-input nope: 'nope' is not an input of the model; the model's inputs are 'x', 'shape', "
                     "'axes'"),
    ("shape={shape32}", "--bind-input shape: the value is int32, the model's input 'shape' is int64"),
    ("shape={shape3}", "--bind-input shape: the value has shape [3], the model's input 'shape' has shape [2]"),
])
def test_bad_bind_input(capsys, tmp_path, arg, needle):
    paths = {"missing": tmp_path / "missing.npy", "text": tmp_path / "t.npy", "shape": tmp_path / "s.npy",
             "shape32": tmp_path / "s32.npy", "shape3": tmp_path / "s3.npy"}
    paths["text"].write_text("not numpy")
    np.save(paths["shape"], SHAPE)
    np.save(paths["shape32"], SHAPE.astype(np.int32))
    np.save(paths["shape3"], np.array([1, 3, 4]))
    r = run_cli(capsys, "compile", save(_model(), tmp_path / "m.onnx"), "-t", "cpu", "-o", tmp_path / "m.tvmpkg",
                "--bind-input", arg.format(**paths))
    assert r.code == 2 and needle.format(**paths) in r.err and r.err.count("\n") == 1, r.err


def test_bind_input_conflicts(capsys, tmp_path):
    src = save(make_model([helper.make_node("Add", ["x", "w"], ["y"])], [("x", TP.FLOAT, [2])], [("y", TP.FLOAT, [2])],
                          {"w": np.ones(2, np.float32)}), tmp_path / "m.onnx")
    np.save(tmp_path / "v.npy", np.zeros(2, np.float32))
    np.savez(tmp_path / "v.npz", x=np.zeros(2, np.float32))
    r = run_cli(capsys, "compile", src, "-t", "cpu", "--bind-input", f"w={tmp_path / 'v.npy'}")
    assert r.code == 2 and "'w' is a weight (initializer)" in r.err, r.err
    r = run_cli(capsys, "compile", src, "-t", "cpu", "--bind-input", f"x={tmp_path / 'v.npy'}",
                "--bind-input", str(tmp_path / "v.npz"))
    assert r.code == 2 and "--bind-input gives input 'x' twice" in r.err, r.err
    r = run_cli(capsys, "compile", src, "-t", "cpu", "--bind-input", f"x={tmp_path / 'v.npy'}", "--input-shape", "x:2")
    assert r.code == 2 and "input 'x' has both --input-shape and --bind-input" in r.err, r.err
