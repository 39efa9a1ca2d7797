"""Bad inputs not covered by test_frontend / test_cli: each gives one clear error line and exit 2, and a
crash while compiling never leaves a package (half-written or not) at the output path.

(A corrupt tuning log and two tuning jobs on one log dir are tested with ``tvmpipe tune``.)
"""

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper

from helpers import make_model, run_cli, save, with_manifest

F = TP.FLOAT
REPO = Path(__file__).resolve().parent.parent


def _relu(tmp_path: Path) -> Path:
    return save(make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", F, [2, 3])], [("y", F, [2, 3])]),
                tmp_path / "m.onnx")


def _one_error_line(r) -> str:
    assert r.code == 2, r.out + r.err
    assert r.err.startswith("tvmpipe: error:") and r.err.count("\n") == 1 and "Traceback" not in r.err, r.err
    return r.err


def test_runtime_value_where_a_constant_is_needed(capsys, tmp_path):
    """Reshape's shape as a graph input: refused (its value would otherwise be baked in and ignored)."""
    model = make_model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="rs")],
                       [("x", F, [2, 3]), ("shape", TP.INT64, [2])], [("y", F, [3, 2])])
    err = _one_error_line(run_cli(capsys, "compile", save(model, tmp_path / "m.onnx"), "--target", "cpu",
                                  "-o", tmp_path / "m.tvmpkg"))
    assert "Reshape" in err and "'rs'" in err and "'shape'" in err and "tvmpipe compiles static shapes" in err
    assert not (tmp_path / "m.tvmpkg").exists()


def test_out_of_range_gather_indices_are_an_error(capsys, tmp_path, rng):
    """A token id past the table: one clear error (the compiled gather has no bounds check and would read out
    of bounds or crash the process); ids in range, negative ones included, match onnxruntime."""
    from helpers import ort_run

    table = rng.standard_normal((10, 8)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"), helper.make_node("Relu", ["e"], ["y"])]
    src = save(make_model(nodes, [("ids", TP.INT64, [2, 3])], [("y", F, [2, 3, 8])], {"table": table}), tmp_path / "m.onnx")
    assert run_cli(capsys, "compile", src, "--target", "cpu", "-o", tmp_path / "m.tvmpkg").code == 0
    good = np.array([[0, 9, -10], [-1, 3, 5]], np.int64)
    np.savez(tmp_path / "good.npz", ids=good)
    r = run_cli(capsys, "run", tmp_path / "m.tvmpkg", "--inputs", tmp_path / "good.npz", "--outputs", tmp_path / "out.npz")
    assert r.code == 0, r.err
    np.testing.assert_allclose(np.load(tmp_path / "out.npz")["y"], ort_run(src, {"ids": good})["y"])
    for bad in (10, -11, 1 << 40):
        ids = good.copy()
        ids[1, 2] = bad
        np.savez(tmp_path / "bad.npz", ids=ids)
        err = _one_error_line(run_cli(capsys, "run", tmp_path / "m.tvmpkg", "--inputs", tmp_path / "bad.npz",
                                      "--outputs", tmp_path / "out.npz"))
        assert f"input 'ids' holds {bad} at [1, 2], outside [-10, 9]" in err and "Gather node 'embed'" in err, err


@pytest.mark.parametrize("case,needle", [
    ("float8", "FLOAT8E4M3FN"),
    ("sequence", "is not a tensor"),
    ("nonzero", "data-dependent"),
])
def test_unsupported_types_and_shapes(capsys, tmp_path, case, needle):
    if case == "float8":
        model = make_model([helper.make_node("Add", ["x", "x"], ["y"])], [("x", TP.FLOAT8E4M3FN, [4])],
                           [("y", TP.FLOAT8E4M3FN, [4])], opset=21)  # float8 arithmetic (casts are compiled)
    elif case == "sequence":
        graph = helper.make_graph([helper.make_node("SequenceLength", ["s"], ["y"])], "g",
                                  [helper.make_tensor_sequence_value_info("s", F, [2])],
                                  [helper.make_tensor_value_info("y", TP.INT64, [])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    else:
        model = make_model([helper.make_node("NonZero", ["x"], ["y"])], [("x", F, [4])], [("y", TP.INT64, [1, "n"])])
    err = _one_error_line(run_cli(capsys, "compile", save(model, tmp_path / "m.onnx"), "--target", "cpu",
                                  "-o", tmp_path / "m.tvmpkg"))
    assert needle in err


def test_output_path_is_a_directory(capsys, tmp_path):
    (tmp_path / "out.tvmpkg").mkdir()
    err = _one_error_line(run_cli(capsys, "compile", _relu(tmp_path), "--target", "cpu", "-o", tmp_path / "out.tvmpkg"))
    assert "directory" in err


@pytest.fixture(scope="module")
def relu_pkg(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pkg")
    from compiler import compile_model

    compile_model(_relu(tmp), "cpu", tmp / "m.tvmpkg")
    return tmp / "m.tvmpkg"


def test_package_of_another_format_version(capsys, tmp_path, relu_pkg):
    with_manifest(relu_pkg, tmp_path / "new.tvmpkg", lambda m: m.update(format_version=99, tvmpipe_version="9.0.0"))
    np.savez(tmp_path / "in.npz", x=np.zeros((2, 3), np.float32))
    err = _one_error_line(run_cli(capsys, "run", tmp_path / "new.tvmpkg", "--inputs", tmp_path / "in.npz"))
    assert "format 99" in err and "recompile" in err


@pytest.mark.parametrize("case", ["missing", "not_npz"])
def test_bad_inputs_file(capsys, tmp_path, relu_pkg, case):
    path = tmp_path / "in.npz"
    if case == "not_npz":
        path.write_text("x = 1, 2, 3\n")
    err = _one_error_line(run_cli(capsys, "run", relu_pkg, "--inputs", path))
    assert str(path) in err


def test_scalar_input_runs(tmp_path, rng):
    """0-d inputs stay 0-d on their way to the VM (np.ascontiguousarray would make them 1-d)."""
    from compiler import compile_model, load

    model = make_model([helper.make_node("Mul", ["x", "s"], ["y"])], [("x", F, [3]), ("s", F, [])], [("y", F, [3])])
    compile_model(save(model, tmp_path / "m.onnx"), "cpu", tmp_path / "m.tvmpkg")
    x, s = rng.standard_normal(3).astype(np.float32), np.float32(rng.standard_normal())
    np.testing.assert_allclose(load(tmp_path / "m.tvmpkg")(x=x, s=np.array(s))["y"], x * s, rtol=1e-6)


_CRASH = """
import os, signal, sys, zipfile
sys.path.insert(0, {repo!r})
write = zipfile.ZipFile.write
def crash(self, *args, **kwargs):  # the library is half in the zip: die like a power cut
    write(self, *args, **kwargs)
    self.fp.flush()
    os.kill(os.getpid(), signal.SIGKILL)
zipfile.ZipFile.write = crash
from compiler.cli import main
main(["compile", {model!r}, "--target", "cpu", "-o", {out!r}])
"""


@pytest.mark.parametrize("existing", [False, True])
def test_compile_killed_mid_write_leaves_no_package(tmp_path, existing):
    """SIGKILL while the package is being written: nothing at the output path, or the old package intact."""
    model, out = _relu(tmp_path), tmp_path / "m.tvmpkg"
    if existing:
        out.write_bytes(b"the previous package")
    r = subprocess.run([sys.executable, "-c", _CRASH.format(repo=str(REPO), model=str(model), out=str(out))],
                       capture_output=True, text=True)
    assert r.returncode == -9, r.stderr
    if existing:
        assert out.read_bytes() == b"the previous package"
    else:
        assert not out.exists()


def test_compile_error_mid_write_cleans_up(capsys, tmp_path, monkeypatch):
    """An exception while exporting: no package and no temporary file left behind."""
    from compiler import build

    def broken_export(self, path):
        Path(path).write_bytes(b"\x7fELF half a library")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(build.Built, "export", broken_export)
    r = run_cli(capsys, "compile", _relu(tmp_path), "--target", "cpu", "-o", tmp_path / "out" / "m.tvmpkg")
    assert r.code != 0 and "No space left on device" in r.err and r.err.count("\n") == 1
    assert not list((tmp_path / "out").glob("*"))


def test_a_failing_schedule_rule_costs_only_its_kernels_schedule(capsys, tmp_path, monkeypatch, rng):
    """A bug in one of our schedule rules (an exception inside ``apply``, as the matmul rule's once on a decoding
    step's one-row RMSNorm) is a warning naming the rule and the kernel; the next rule takes the kernel and the model
    compiles and computes right."""
    from helpers import ort_run
    from schedules.cpu_matmul import CpuMatmul

    def broken(self, func, target, tunable):
        raise AssertionError("consumers not inlined\nsecond line")

    monkeypatch.setattr(CpuMatmul, "apply", broken)
    w = rng.standard_normal((24, 40)).astype(np.float32)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", F, [7, 24])], [("y", F, [7, 40])], {"w": w})
    src, pkg = save(model, tmp_path / "m.onnx"), tmp_path / "m.tvmpkg"
    with pytest.warns(UserWarning, match=r"schedule rule CpuMatmul failed on kernel (\w+) \(AssertionError: second line\)"):
        r = run_cli(capsys, "compile", src, "--target", "cpu", "-o", pkg)
    assert r.code == 0, r.err
    with zipfile.ZipFile(pkg) as zf:
        assert "hand:CpuMatmul" not in json.loads(zf.read("manifest.json"))["kernels"].values()
    x = rng.standard_normal((7, 24)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    assert run_cli(capsys, "run", pkg, "--inputs", tmp_path / "in.npz", "--outputs", tmp_path / "out.npz").code == 0
    np.testing.assert_allclose(np.load(tmp_path / "out.npz")["y"], ort_run(src, {"x": x})["y"], rtol=1e-5, atol=1e-5)
