"""The CLI as a user drives it: targets, compile/run/bench, the package, run-time input errors."""

import json
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper

from helpers import make_model, ort_run, rel_err, run_cli, save, with_manifest

F = TP.FLOAT


@pytest.fixture(scope="module")
def small_pkg(tmp_path_factory):
    """A compiled 2-input model (shared by the run/bench tests)."""
    tmp = tmp_path_factory.mktemp("pkg")
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["s"]),
             helper.make_node("Softmax", ["s"], ["y"], axis=-1)]
    model = make_model(nodes, [("x", F, [3, 5]), ("b", F, [3, 7])], [("y", F, [3, 7])],
                       {"w": rng.standard_normal((5, 7)).astype(np.float32)})
    src = save(model, tmp / "m.onnx")
    from compiler.cli import main

    assert main(["compile", str(src), "--target", "cpu", "-o", str(tmp / "m.tvmpkg")]) == 0
    return src, tmp / "m.tvmpkg"


def test_targets_lists_named_targets(capsys):
    r = run_cli(capsys, "targets", "--json")
    rows = {t["name"]: t for t in json.loads(r.out)}
    assert {"cpu", "cuda-sm90", "cuda-sm80"} <= set(rows)
    assert rows["cuda-sm90"]["target"]["arch"] == "sm_90a" and rows["cuda-sm90"]["sms"] == 132
    assert rows["cpu"]["target"]["num-cores"] >= 1 and rows["cpu"]["target"]["mcpu"] != "host"


def test_unknown_target(capsys, tmp_path):
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", F, [2])], [("y", F, [2])])
    r = run_cli(capsys, "compile", save(model, tmp_path / "m.onnx"), "--target", "tpu-v9")
    assert r.code == 2 and "unknown target 'tpu-v9'" in r.err and "cuda-sm90" in r.err


def test_target_file_path(capsys, tmp_path, rng):
    (tmp_path / "mine.json").write_text(json.dumps({"target": {"kind": "llvm", "mcpu": "x86-64", "num-cores": 1}}))
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", F, [4])], [("y", F, [4])])
    r = run_cli(capsys, "compile", save(model, tmp_path / "m.onnx"), "--target", tmp_path / "mine.json",
                "-o", tmp_path / "m.tvmpkg")
    assert r.code == 0, r.err
    from compiler import load

    x = rng.standard_normal(4).astype(np.float32)
    np.testing.assert_array_equal(load(tmp_path / "m.tvmpkg")(x=x)["y"], np.maximum(x, 0))


def test_runner_bound_call_and_timing(small_pkg, rng):
    """``Runner.bound``: main on inputs copied once, as ``__call__`` computes it (outputs left on the device);
    ``time(number=...)`` gives one figure per repeat."""
    from compiler import load

    runner = load(small_pkg[1])
    x = {"x": rng.standard_normal((3, 5)).astype(np.float32), "b": rng.standard_normal((3, 7)).astype(np.float32)}
    call = runner.bound(x)
    np.testing.assert_array_equal(call().numpy(), runner(**x)["y"])
    before = runner(**x)["y"]
    x["b"][:, 0] += 1  # (bound to the arrays as they were; a shift of one column: softmax ignores a row-wide one)
    np.testing.assert_array_equal(call().numpy(), before)
    assert np.abs(runner(**x)["y"] - before).max() > 1e-5  # (rounding: ~1e-8)
    assert len(runner.time(x, repeat=3, number=4).ms) == 3


def test_package_manifest(small_pkg):
    src, pkg = small_pkg
    with zipfile.ZipFile(pkg) as zf:
        assert set(zf.namelist()) == {"manifest.json", "model.so"}
        m = json.loads(zf.read("manifest.json"))
    assert m["target"]["name"] == "cpu" and m["tvm_version"] == "0.27.0.post1"
    assert [i["name"] for i in m["inputs"]] == ["x", "b"] and m["outputs"][0] == {"name": "y", "shape": [3, 7], "dtype": "float32"}
    import hashlib

    assert m["source_model"]["sha256"] == hashlib.sha256(src.read_bytes()).hexdigest()
    assert "FuseOps" in m["passes"] and m["kernels"]


def test_run_matches_onnxruntime(capsys, tmp_path, small_pkg, rng):
    src, pkg = small_pkg
    inputs = {"x": rng.standard_normal((3, 5)).astype(np.float32), "b": rng.standard_normal((3, 7)).astype(np.float32)}
    np.savez(tmp_path / "in.npz", **inputs)
    r = run_cli(capsys, "run", pkg, "--inputs", tmp_path / "in.npz", "--outputs", tmp_path / "out.npz")
    assert r.code == 0, r.err
    with np.load(tmp_path / "out.npz") as f:
        assert rel_err(f["y"], ort_run(src, inputs)["y"]) < 1e-5


@pytest.mark.parametrize("bad,needle", [
    ({"x": ((3, 5), "float32")}, "missing input 'b'"),
    ({"x": ((3, 5), "float32"), "b": ((3, 7), "float32"), "z": ((1,), "float32")}, "unknown input 'z'"),
    ({"x": ((3, 6), "float32"), "b": ((3, 7), "float32")}, "input 'x' has shape [3, 6], expected [3, 5]"),
    ({"x": ((3, 5), "float64"), "b": ((3, 7), "float32")}, "input 'x' has dtype float64, expected float32"),
])
def test_run_input_errors(capsys, tmp_path, small_pkg, bad, needle):
    _, pkg = small_pkg
    np.savez(tmp_path / "in.npz", **{k: np.zeros(s, d) for k, (s, d) in bad.items()})
    r = run_cli(capsys, "run", pkg, "--inputs", tmp_path / "in.npz")
    assert r.code == 2 and needle in r.err and r.err.count("\n") == 1, r.err


def test_bench_profile_times_every_kernel(capsys, small_pkg):
    _, pkg = small_pkg
    with zipfile.ZipFile(pkg) as zf:
        kernels = json.loads(zf.read("manifest.json"))["kernels"]
    r = run_cli(capsys, "bench", pkg, "--repeat", "5", "--profile", "--json")
    assert r.code == 0, r.err
    rows = json.loads(r.out.strip().splitlines()[-1])["kernels"]
    assert {k["name"]: k["schedule"] for k in rows} == kernels  # every kernel launched, labelled as built
    assert all(k["calls"] == 1 and k["ms"] > 0 for k in rows)
    assert [k["ms"] for k in rows] == sorted((k["ms"] for k in rows), reverse=True)
    text = run_cli(capsys, "bench", pkg, "--repeat", "5", "--profile")
    assert text.code == 0 and "schedule" in text.out and next(iter(kernels)) in text.out


def test_bench_json_compare(capsys, small_pkg):
    src, pkg = small_pkg
    r = run_cli(capsys, "bench", pkg, "--repeat", "20", "--json", "--compare-onnx", src)
    assert r.code == 0, r.err
    result = json.loads(r.out.strip().splitlines()[-1])
    assert result["median_ms"] > 0 and result["ort_median_ms"] > 0 and result["max_rel_err"] < 1e-5
    assert {"mean_ms", "p90_ms", "p99_ms"} <= set(result)


def test_bench_cuda_graph_refuses_cpu_package(capsys, small_pkg):
    _, pkg = small_pkg
    r = run_cli(capsys, "bench", pkg, "--repeat", "3", "--cuda-graph")
    assert r.code == 2 and "is built for cpu: a CUDA graph needs a package built for a GPU target" in r.err
    assert "Traceback" not in r.err


def test_bench_cuda_graph_refuses_graph_build(capsys, tmp_path, small_pkg):
    """A package built with --cuda-graph (its manifest says so) is refused before the GPU is touched: TVM's graph
    capture inside ours failed on the H100 with a driver error."""
    _, pkg = small_pkg
    graph = with_manifest(pkg, tmp_path / "graph.tvmpkg", lambda m: m["options"].update(cuda_graph=True))
    r = run_cli(capsys, "bench", graph, "--repeat", "3", "--cuda-graph")
    assert r.code == 2 and "was built with --cuda-graph" in r.err and "rebuild it without --cuda-graph" in r.err
    assert "Traceback" not in r.err


def test_corrupt_package(capsys, tmp_path, small_pkg):
    _, pkg = small_pkg
    data = bytearray(pkg.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = b"\xff" * 64
    (tmp_path / "bad.tvmpkg").write_bytes(bytes(data))
    np.savez(tmp_path / "in.npz", x=np.zeros((3, 5), np.float32), b=np.zeros((3, 7), np.float32))
    r = run_cli(capsys, "run", tmp_path / "bad.tvmpkg", "--inputs", tmp_path / "in.npz")
    assert r.code == 2 and "corrupt" in r.err, r.err
    (tmp_path / "text.tvmpkg").write_text("hello")
    r = run_cli(capsys, "run", tmp_path / "text.tvmpkg", "--inputs", tmp_path / "in.npz")
    assert r.code == 2 and "not a tvmpipe package" in r.err


def test_package_from_other_version(capsys, tmp_path, small_pkg):
    _, pkg = small_pkg
    old = with_manifest(pkg, tmp_path / "old.tvmpkg", lambda m: m.update(tvm_version="0.19.0"))
    r = run_cli(capsys, "bench", old)
    assert r.code == 2 and "built with TVM 0.19.0" in r.err


def test_cuda_package_refused_without_gpu(capsys, tmp_path, small_pkg):
    _, pkg = small_pkg
    gpu = with_manifest(pkg, tmp_path / "gpu.tvmpkg", lambda m: m["target"].update(name="cuda-sm90", kind="cuda",
                                                                                    arch="sm_90"))
    import tvm

    if tvm.cuda(0).exist:
        pytest.skip("this machine has a GPU")
    r = run_cli(capsys, "bench", gpu)
    assert r.code == 2 and "no CUDA GPU" in r.err


def test_console_script_exit_codes(tmp_path):
    """The installed entry point: one error line, no traceback; --debug shows it."""
    r = subprocess.run([sys.executable, "-m", "compiler", "compile", str(tmp_path / "nope.onnx"), "--target", "cpu"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip() == f"tvmpipe: error: model file not found: {tmp_path / 'nope.onnx'}"
    r = subprocess.run([sys.executable, "-m", "compiler", "compile", str(tmp_path / "nope.onnx"), "--target", "cpu",
                        "--debug"], capture_output=True, text=True)
    assert r.returncode != 0 and "Traceback" in r.stderr


@pytest.mark.parametrize("preset", [None, "1"])
def test_loaded_package_runs_on_every_cpu(small_pkg, preset):
    """TVM's thread pool would take half the CPUs (one thread on a 2-core machine) and pin them to cores (a
    busy core then stalls every kernel): tvmpipe gives it every CPU the process may use, unpinned, unless the
    user set TVM_NUM_THREADS / TVM_BIND_THREADS."""
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "TVM_BIND_THREADS")}
    if preset:
        env |= {"TVM_NUM_THREADS": preset, "TVM_BIND_THREADS": preset}
    code = (f"import compiler, os; compiler.load({str(small_pkg[1])!r}); "
            "print(os.environ['TVM_NUM_THREADS'], os.environ['TVM_BIND_THREADS'])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ([preset, preset] if preset else [str(len(os.sched_getaffinity(0))), "0"])


def test_demo(capsys, tmp_path):
    r = run_cli(capsys, "demo", "-o", tmp_path)
    assert r.code == 0, r.out + r.err
    assert "OK" in r.out and (tmp_path / "demo-cpu.tvmpkg").exists()


def test_demo_model_is_reproducible(tmp_path):
    sys.path.insert(0, "models")
    import make_demo

    assert make_demo.build().SerializeToString() == make_demo.DEFAULT_PATH.read_bytes()


@pytest.mark.parametrize("target", ["cpu", "cuda-sm90"])
def test_compile_prints_no_raw_tvm_warnings(capfd, tmp_path, rng, target):
    """An exported decoder's embedding lookup (Gather) and GPT-2's GELU cube (Pow 3): TVM logged a warning from C++
    at each legalisation of either (9 raw lines compiling GPT-2). The compile prints tvmpipe's own line only, and the
    package still matches onnxruntime (a gathered row past the last is a run-time error, not a read outside)."""
    if target.startswith("cuda"):
        pytest.importorskip("cuda.bindings")
    table = rng.standard_normal((50, 8)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"]), helper.make_node("Pow", ["e", "three"], ["c"]),
             helper.make_node("Add", ["e", "c"], ["y"])]
    model = make_model(nodes, [("ids", TP.INT64, [2, 5])], [("y", F, [2, 5, 8])],
                       {"table": table, "three": np.array(3.0, np.float32)})
    src, pkg = save(model, tmp_path / "m.onnx"), tmp_path / "m.tvmpkg"
    r = run_cli(capfd, "compile", src, "--target", target, "-o", pkg)
    assert r.code == 0, r.err
    assert r.err == "" and r.out.count("\n") == 1 and r.out.startswith("compiled "), (r.out, r.err)
    if target == "cpu":
        ids = rng.integers(-50, 50, (2, 5))  # negative ids count from the end
        np.savez(tmp_path / "in.npz", ids=ids)
        assert run_cli(capfd, "run", pkg, "--inputs", tmp_path / "in.npz", "--outputs", tmp_path / "out.npz").code == 0
        assert rel_err(np.load(tmp_path / "out.npz")["y"], ort_run(src, {"ids": ids})["y"]) < 1e-6
        np.savez(tmp_path / "bad.npz", ids=np.full((2, 5), 50))
        r = run_cli(capfd, "run", pkg, "--inputs", tmp_path / "bad.npz", "--outputs", tmp_path / "out.npz")
        assert r.code != 0 and "ids" in r.err, r.err
