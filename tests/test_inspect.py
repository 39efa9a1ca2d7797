"""``tvmpipe inspect`` and ``--no-fusion`` as a user drives them: what each kernel computes, the bytes."""

import json
import zipfile

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper

from helpers import compile_and_compare, make_model, rel_err, run_cli, save

F = TP.FLOAT


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    """MatMul -> Add bias -> Relu -> MatMul: 3 x 7 floats (84 bytes) per intermediate."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"])]
    inits = {"w": rng.standard_normal((5, 7)).astype(np.float32), "b": rng.standard_normal(7).astype(np.float32),
             "w2": rng.standard_normal((7, 2)).astype(np.float32)}
    return save(make_model(nodes, [("x", F, [3, 5])], [("y", F, [3, 2])], inits),
                tmp_path_factory.mktemp("mlp") / "mlp.onnx")


def inspect_json(capsys, model, *args) -> dict:
    r = run_cli(capsys, "inspect", model, "--target", "cpu", "--json", *args)
    assert r.code == 0, r.err
    return json.loads(r.out)


def test_json_kernels_ops_and_bytes(capsys, mlp):
    report = inspect_json(capsys, mlp)
    assert report["onnx_ops"] == {"MatMul": 2, "Add": 1, "Relu": 1} and report["onnx_nodes"] == 4
    fused, last = report["kernels"]
    assert fused["ops"] == ["relax.matmul", "relax.add", "relax.nn.relu"] and last["ops"] == ["relax.matmul"]
    # matmul and add outputs stay inside the kernel: each 84 bytes, written once and read once
    assert fused["saved_bytes"] == 2 * (84 + 84) and last["saved_bytes"] == 0
    assert fused["schedule"] == last["schedule"] == "hand:CpuMatmul" and report["custom_schedules"] is True
    scratch = fused["scratch_bytes"] + last["scratch_bytes"]
    assert report["totals"] == {"kernels": 2, "saved_bytes": 336, "scratch_bytes": scratch}


def test_no_fusion_is_one_kernel_per_op(capsys, mlp):
    report = inspect_json(capsys, mlp, "--no-fusion")
    ops = [k["ops"] for k in report["kernels"]]
    assert ops == [["relax.matmul"], ["relax.add"], ["relax.nn.relu"], ["relax.matmul"]]
    assert report["fusion"] == "none" and report["totals"]["saved_bytes"] == 0


def test_no_custom_schedules_shows_tvms_own(capsys, mlp):
    """The kernels compile --no-custom-schedules builds: the same fusion, TVM's default schedules, none of ours."""
    report = inspect_json(capsys, mlp, "--no-custom-schedules")
    assert [k["ops"] for k in report["kernels"]] == [["relax.matmul", "relax.add", "relax.nn.relu"], ["relax.matmul"]]
    assert report["custom_schedules"] is False and not any(k["schedule"].startswith("hand:") for k in report["kernels"])
    r = run_cli(capsys, "inspect", mlp, "--target", "cpu", "--no-custom-schedules")
    assert r.code == 0 and "fusion: tvmpipe, TVM's own schedules" in r.out, r.err


def test_text_report(capsys, mlp):
    r = run_cli(capsys, "inspect", mlp, "--target", "cpu")
    assert r.code == 0, r.err
    assert "MatMul 2, Add 1, Relu 1" in r.out and "2 launched per inference" in r.out and "TVM's own" not in r.out
    line = next(ln for ln in r.out.splitlines() if "fused_matmul_add_relu" in ln)
    assert "336 B" in line and "matmul + add + relu" in line and "hand:CpuMatmul" in line


def test_graph_passes_listed(capsys, tmp_path):
    """Transposes that cancel: the report names the pass and what it removed."""
    nodes = [helper.make_node("Transpose", ["x"], ["a"], perm=[1, 0]), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Transpose", ["b"], ["y"], perm=[1, 0])]
    model = save(make_model(nodes, [("x", F, [3, 4])], [("y", F, [3, 4])]), tmp_path / "t.onnx")
    report = inspect_json(capsys, model)
    assert report["relax_ops_after_import"] == 3 and len(report["kernels"]) == 1
    assert any(c["pass"] == "SimplifyLayout" and c["removed"].get("relax.permute_dims") for c in report["graph_passes"])


def test_dump_ir_after_every_pass(capsys, tmp_path, mlp):
    r = run_cli(capsys, "inspect", mlp, "--target", "cpu", "--dump-ir", tmp_path / "ir")
    assert r.code == 0, r.err
    names = sorted(p.name for p in (tmp_path / "ir").iterdir())
    assert names[0] == "00-Import.py" and any(n.endswith("-FuseOps.py") for n in names)
    assert any(n.endswith("-FuseAttention.py") for n in names) and any(n.endswith("-FuseTIR.py") for n in names)
    assert "R.nn.relu" in (tmp_path / "ir" / "00-Import.py").read_text()
    assert "fused_matmul_add_relu" in next((tmp_path / "ir").glob("*-FuseTIR.py")).read_text()


def test_dump_ir_into_a_file_is_an_error(capsys, tmp_path, mlp):
    (tmp_path / "f").write_text("")
    r = run_cli(capsys, "inspect", mlp, "--target", "cpu", "--dump-ir", tmp_path / "f")
    assert r.code == 2 and r.err.count("\n") == 1 and "IR dumps" in r.err, r.err


def test_inspect_bad_model(capsys, tmp_path):
    r = run_cli(capsys, "inspect", tmp_path / "missing.onnx", "--target", "cpu")
    assert r.code == 2 and "model file not found" in r.err


def test_compile_no_fusion(capsys, tmp_path, rng, mlp):
    x = rng.standard_normal((3, 5)).astype(np.float32)
    import onnx

    ours, ref = compile_and_compare(capsys, tmp_path, onnx.load(mlp), {"x": x}, extra_args=("--no-fusion",))
    assert rel_err(ours["y"], ref["y"]) < 1e-5
    with zipfile.ZipFile(tmp_path / "model.tvmpkg") as zf:
        manifest = json.loads(zf.read("manifest.json"))
    assert manifest["options"]["fusion"] == "none" and "FuseOps" not in manifest["passes"]
    assert len(manifest["kernels"]) == 4
