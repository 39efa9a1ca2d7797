"""Frontend: shapes bound from the CLI, exporter shape subgraphs, Constant forms, If, refusals, bad files."""

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper

from helpers import compile_and_compare, make_model, rel_err, run_cli, save

F = TP.FLOAT


def test_dynamic_batch_bound_by_input_shape(capsys, tmp_path, rng):
    w = rng.standard_normal((5, 7)).astype(np.float32)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", F, ["batch", 5])],
                       [("y", F, ["batch", 7])], {"w": w})
    x = rng.standard_normal((3, 5)).astype(np.float32)
    ours, ref = compile_and_compare(capsys, tmp_path, model, {"x": x}, shapes={"x": (3, 5)})
    assert ours["y"].shape == (3, 7)
    assert rel_err(ours["y"], ref["y"]) < 1e-5


def test_unbound_dynamic_dim_names_input_and_dim(capsys, tmp_path):
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", F, ["batch", 5])], [("y", F, ["batch", 5])])
    r = run_cli(capsys, "compile", save(model, tmp_path / "m.onnx"), "--target", "cpu", "-o", tmp_path / "m.tvmpkg")
    assert r.code == 2
    assert "input 'x'" in r.err and "dim 0 ('batch')" in r.err and "--input-shape x:1x5" in r.err
    assert "Traceback" not in r.err and not (tmp_path / "m.tvmpkg").exists()


def test_shape_subgraph_feeding_reshape(capsys, tmp_path, rng):
    """PyTorch's x.view(x.size(0), -1): Shape -> Gather -> Unsqueeze -> Concat -> Reshape."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
        helper.make_node("Unsqueeze", ["b", "axes"], ["b1"]),
        helper.make_node("Concat", ["b1", "minus1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w"], ["y"]),
    ]
    w = rng.standard_normal((3 * 4 * 5, 6)).astype(np.float32)
    inits = {"zero": np.array(0, np.int64), "axes": np.array([0], np.int64), "minus1": np.array([-1], np.int64), "w": w}
    model = make_model(nodes, [("x", F, ["N", 3, 4, 5])], [("y", F, ["N", 6])], inits)
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    ours, ref = compile_and_compare(capsys, tmp_path, model, {"x": x}, shapes={"x": (2, 3, 4, 5)})
    assert rel_err(ours["y"], ref["y"]) < 1e-5


@pytest.mark.parametrize("form", ["value", "value_float", "value_floats", "value_int", "value_ints", "sparse_value"])
def test_constant_attribute_forms(capsys, tmp_path, rng, form):
    vals = rng.standard_normal(4).astype(np.float32)
    attr = {
        "value": helper.make_tensor("c", F, [4], vals),
        "value_float": float(vals[0]),
        "value_floats": [float(v) for v in vals],
        "value_int": 3,
        "value_ints": [1, -2, 3, 4],
        "sparse_value": helper.make_sparse_tensor(
            helper.make_tensor("v", F, [2], vals[:2]), helper.make_tensor("i", TP.INT64, [2], [0, 3]), [4]),
    }[form]
    nodes = [helper.make_node("Constant", [], ["c"], **{form: attr})]
    if form in ("value_int", "value_ints"):
        nodes.append(helper.make_node("Cast", ["c"], ["cf"], to=F))
    nodes.append(helper.make_node("Add", ["x", "cf" if form in ("value_int", "value_ints") else "c"], ["y"]))
    model = make_model(nodes, [("x", F, [2, 4])], [("y", F, [2, 4])])
    x = rng.standard_normal((2, 4)).astype(np.float32)
    ours, ref = compile_and_compare(capsys, tmp_path, model, {"x": x})
    np.testing.assert_allclose(ours["y"], ref["y"], rtol=1e-6)


@pytest.mark.parametrize("big", [True, False])
def test_if_with_constant_condition(capsys, tmp_path, rng, big):
    """The condition depends only on the (now static) input shape, so the If folds to one branch."""
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [], [helper.make_tensor_value_info("t", F, None)])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [helper.make_tensor_value_info("e", F, None)])
    nodes = [
        helper.make_node("Size", ["x"], ["n"]),
        helper.make_node("Greater", ["n", "limit"], ["cond"]),
        helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g),
    ]
    model = make_model(nodes, [("x", F, ["N", 4])], [("y", F, ["N", 4])], {"limit": np.array(10, np.int64)})
    n = 5 if big else 2
    x = rng.standard_normal((n, 4)).astype(np.float32)
    ours, ref = compile_and_compare(capsys, tmp_path, model, {"x": x}, shapes={"x": (n, 4)})
    np.testing.assert_allclose(ours["y"], ref["y"])


def test_tiny_constants_are_not_folded_away(capsys, tmp_path, rng):
    """``x + 1e-12`` and ``x * 1.000001`` are not no-ops (an epsilon guarding a division by zero)."""
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("Add", ["sq", "eps"], ["d"]),
        helper.make_node("Div", ["x", "d"], ["q"]),
        helper.make_node("Mul", ["q", "one"], ["y"]),
    ]
    model = make_model(nodes, [("x", F, [3, 5])], [("y", F, [3, 5])],
                       {"eps": np.array(1e-12, np.float32), "one": np.array(1.0001, np.float32)})
    x = rng.standard_normal((3, 5)).astype(np.float32)
    x[1] = 0.0  # 0 / (0 + eps) = 0; without eps it is NaN
    ours, ref = compile_and_compare(capsys, tmp_path, model, {"x": x})
    assert np.isfinite(ours["y"]).all()
    np.testing.assert_allclose(ours["y"], ref["y"], rtol=1e-6)


def test_all_unsupported_ops_reported_at_once(capsys, tmp_path):
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="ok"),
        helper.make_node("Frobnicate", ["a"], ["b"], name="frob_1", domain="my.ops"),
        helper.make_node("Loop", ["", "", "b"], ["c"], name="loop_1", body=helper.make_graph(
            [helper.make_node("Identity", ["c_in"], ["c_out"]), helper.make_node("Identity", ["v"], ["v2"])], "body",
            [helper.make_tensor_value_info("i", TP.INT64, []), helper.make_tensor_value_info("c_in", TP.BOOL, []),
             helper.make_tensor_value_info("v", F, None)],
            [helper.make_tensor_value_info("c_out", TP.BOOL, []), helper.make_tensor_value_info("v2", F, None)])),
        helper.make_node("Frobnicate", ["c"], ["y"], name="frob_2", domain="my.ops"),
    ]
    model = make_model(nodes, [("x", F, [2])], [("y", F, [2])], extra_opsets={"my.ops": 1}, opset=17)
    r = run_cli(capsys, "compile", save(model, tmp_path / "m.onnx"), "--target", "cpu", "-o", tmp_path / "m.tvmpkg")
    assert r.code == 2 and r.err.count("\n") == 1, r.err
    for s in ("my.ops::Frobnicate", "'frob_1'", "'frob_2'", "Loop", "'loop_1'", "opset 17", "opset 1"):
        assert s in r.err


def test_layernorm_mean_and_invstddev_outputs(capsys, tmp_path, rng):
    """Upstream Relax returns dummy zeros for these; tvmpipe computes them (in float32, as ONNX)."""
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["y", "mean", "inv"], name="ln", axis=1)]
    g, b = rng.standard_normal((4, 5)).astype(np.float32), rng.standard_normal((4, 5)).astype(np.float32)
    model = make_model(nodes, [("x", F, [3, 4, 5])], [("y", F, [3, 4, 5]), ("mean", F, [3, 1, 1]), ("inv", F, [3, 1, 1])],
                       {"g": g, "b": b})
    x = (3 + 2 * rng.standard_normal((3, 4, 5))).astype(np.float32)
    ours, ref = compile_and_compare(capsys, tmp_path, model, {"x": x})
    for name in ("y", "mean", "inv"):
        assert rel_err(ours[name], ref[name]) < 1e-5, name


def test_nms_with_runtime_threshold_refused(capsys, tmp_path):
    nodes = [helper.make_node("NonMaxSuppression", ["boxes", "scores", "maxb", "iou", "score"], ["sel"], name="nms")]
    model = make_model(
        nodes,
        [("boxes", F, [1, 6, 4]), ("scores", F, [1, 1, 6]), ("iou", F, [1])],
        [("sel", TP.INT64, ["k", 3])],
        {"maxb": np.array([3], np.int64), "score": np.array([0.0], np.float32)},
        opset=11,
    )
    r = run_cli(capsys, "compile", save(model, tmp_path / "m.onnx"), "--target", "cpu")
    assert r.code == 2 and "NonMaxSuppression" in r.err and "iou_threshold" in r.err


@pytest.mark.parametrize("case", ["missing", "empty", "truncated", "not_onnx", "directory"])
def test_bad_model_files(capsys, tmp_path, case):
    good = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", F, [2])], [("y", F, [2])],
                      {"w": np.ones((64, 64), np.float32)})
    path = tmp_path / "m.onnx"
    if case == "empty":
        path.write_bytes(b"")
    elif case == "truncated":
        path.write_bytes(good.SerializeToString()[:-700])
    elif case == "not_onnx":
        path.write_text("this is a text file, not a model\n" * 10)
    elif case == "directory":
        path.mkdir()
    r = run_cli(capsys, "compile", path, "--target", "cpu", "-o", tmp_path / "out.tvmpkg")
    assert r.code == 2, r.err
    assert r.err.startswith("tvmpipe: error:") and r.err.count("\n") == 1 and str(path) in r.err
    assert not (tmp_path / "out.tvmpkg").exists()


@pytest.mark.parametrize("arg,needle", [
    ("x", "malformed --input-shape"), ("x:2xa", "positive integers"), ("x:0x2", "positive"),
    ("y:2x2", "model's inputs are 'x'"), ("x:2x2x2", "rank 3 given"), ("x:3x2", "fixed to 2"),
])
def test_bad_input_shape_args(capsys, tmp_path, arg, needle):
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", F, [2, "n"])], [("y", F, [2, "n"])])
    r = run_cli(capsys, "compile", save(model, tmp_path / "m.onnx"), "--target", "cpu", "--input-shape", arg)
    assert r.code == 2 and needle in r.err, r.err


def test_cleaning_does_not_log_values_it_cannot_fold(caplog):
    """onnxscript's folder logs a warning for each value it fails to evaluate (BERT: "cannot reshape array of
    size 1 into shape (1,128)"); the value stays for TVM to compute, so users should not see it."""
    import logging

    from onnx import numpy_helper

    from compiler.frontend.onnx_clean import clean

    x = helper.make_tensor_value_info("x", TP.FLOAT, [1, 128])
    y = helper.make_tensor_value_info("y", TP.FLOAT, [1, 128])
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["c", "s"], ["r"]), helper.make_node("Add", ["x", "r"], ["y"])], "g", [x], [y],
        [numpy_helper.from_array(np.ones(1, np.float32), "c"), numpy_helper.from_array(np.array([1, 128], np.int64), "s")])
    with caplog.at_level(logging.WARNING):
        clean(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert not [r for r in caplog.records if "Evaluation failed" in r.getMessage()]
    assert logging.getLogger("onnxscript.optimizer._constant_folding").level == logging.NOTSET  # restored
