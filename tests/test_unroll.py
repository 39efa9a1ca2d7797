"""Scan and Loop unrolled, and function ops expanded, before import (``compiler/frontend/unroll.py``) against
onnxruntime / the reference: two states, scan inputs along different axes and directions, scan outputs
stacked along different axes and directions, an outer-scope value read by the body, a Loop's iteration
number; a Scan or Loop that cannot be unrolled is refused with the reason."""

import numpy as np
from onnx import TensorProto as TP
from onnx import helper

from helpers import make_model, ort_run, run_cli, save


def _scan_model(opset: int, length: int | None) -> object:
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "a_t"], ["s_out"]),
         helper.make_node("Mul", ["p_in", "b_t"], ["p_mul"]),
         helper.make_node("Add", ["p_mul", "w"], ["p_out"]),  # w: from the outer graph
         helper.make_node("Sub", ["s_out", "p_out"], ["diff"]),
         helper.make_node("Identity", ["s_out"], ["s_copy"])],
        "body",
        [helper.make_tensor_value_info(n, TP.FLOAT, [3]) for n in ("s_in", "p_in", "a_t", "b_t")],
        [helper.make_tensor_value_info(n, TP.FLOAT, [3]) for n in ("s_out", "p_out", "diff", "s_copy")],
    )
    scan = helper.make_node("Scan", ["s0", "p0", "a", "b"], ["s", "p", "diffs", "sums"], body=body,
                            num_scan_inputs=2, scan_input_axes=[0, 1], scan_input_directions=[0, 1],
                            scan_output_axes=[1, 0], scan_output_directions=[1, 0])
    w = helper.make_node("Mul", ["s0", "s0"], ["w"])
    n = length or "L"
    return make_model(
        [w, scan],
        [("s0", TP.FLOAT, [3]), ("p0", TP.FLOAT, [3]), ("a", TP.FLOAT, [n, 3]), ("b", TP.FLOAT, [3, n])],
        [("s", TP.FLOAT, [3]), ("p", TP.FLOAT, [3]), ("diffs", TP.FLOAT, [3, n]), ("sums", TP.FLOAT, [n, 3])],
        opset=opset,
    )


def test_scan_unrolled_matches_onnxruntime(tmp_path, rng):
    from compiler import compile_model, load

    for opset, length in ((11, 5), (17, 7)):
        src = save(_scan_model(opset, length), tmp_path / f"m{opset}.onnx")
        feeds = {"s0": rng.standard_normal(3).astype(np.float32), "p0": rng.standard_normal(3).astype(np.float32),
                 "a": rng.standard_normal((length, 3)).astype(np.float32),
                 "b": rng.uniform(0.5, 1.5, (3, length)).astype(np.float32)}
        compile_model(src, "cpu", tmp_path / "m.tvmpkg")
        got, want = load(tmp_path / "m.tvmpkg")(**feeds), ort_run(src, feeds)
        for name, ref in want.items():
            np.testing.assert_allclose(got[name], ref, rtol=1e-5, atol=1e-6, err_msg=f"opset {opset}: {name}")


def test_scan_of_unknown_length_refused(capsys, tmp_path):
    """Without a static length (here: the opset-8 batched form) the refusal says what Scan needs."""
    body = helper.make_graph([helper.make_node("Add", ["s", "x"], ["s2"])], "b",
                             [helper.make_tensor_value_info(n, TP.FLOAT, [2]) for n in ("s", "x")],
                             [helper.make_tensor_value_info("s2", TP.FLOAT, [2])])
    scan = helper.make_node("Scan", ["", "s0", "x"], ["s"], body=body, num_scan_inputs=1)
    model = make_model([scan], [("s0", TP.FLOAT, [1, 2]), ("x", TP.FLOAT, [1, 4, 2])], [("s", TP.FLOAT, [1, 2])],
                       opset=8)
    r = run_cli(capsys, "compile", save(model, tmp_path / "m.onnx"), "-t", "cpu")
    assert r.code == 2 and "Scan" in r.err and "static non-zero length" in r.err, r.err


def test_function_op_expanded_matches_reference(tmp_path, rng):
    """LinearAttention has no converter but an ONNX function body (context-dependent, with a Scan): expanded,
    unrolled and compiled, it matches onnx's reference, with an omitted optional input in the middle."""
    from onnx.reference import ReferenceEvaluator

    from compiler import compile_model, load

    b, s, h, d = 2, 5, 3, 4
    node = helper.make_node("LinearAttention", ["q", "k", "v", "", "decay"], ["y", "state"],
                            q_num_heads=h, kv_num_heads=h, update_rule="gated")
    shape = [b, s, h * d]
    model = make_model([node], [(n, TP.FLOAT, shape) for n in ("q", "k", "v", "decay")],
                       [("y", TP.FLOAT, shape), ("state", TP.FLOAT, [b, h, d, d])], opset=27)
    feeds = {n: rng.standard_normal(shape).astype(np.float32) for n in ("q", "k", "v")}
    feeds["decay"] = -rng.uniform(0.05, 1.0, shape).astype(np.float32)
    compile_model(save(model, tmp_path / "m.onnx"), "cpu", tmp_path / "m.tvmpkg")
    got = load(tmp_path / "m.tvmpkg")(**feeds)
    for name, ref in zip(("y", "state"), ReferenceEvaluator(model).run(None, feeds)):
        np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-5, err_msg=name)


def _loop_model(cond_body: str) -> object:
    """y += x[i] * i for i < trip count (a constant 5); the per-step sums stacked. ``cond_body``: 'pass' hands
    the condition on, 'compute' computes it (the loop may stop early)."""
    cond_node = (helper.make_node("Identity", ["c_in"], ["c_out"]) if cond_body == "pass" else
                 helper.make_node("Less", ["i_f", "lim"], ["c_out"]))
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["i_f"], to=TP.FLOAT),
         helper.make_node("Gather", ["x", "i"], ["x_i"], axis=0),
         helper.make_node("Mul", ["x_i", "i_f"], ["term"]),
         helper.make_node("Add", ["y_in", "term"], ["y_out"]),
         helper.make_node("Identity", ["y_out"], ["y_step"]), cond_node],
        "body",
        [helper.make_tensor_value_info("i", TP.INT64, []), helper.make_tensor_value_info("c_in", TP.BOOL, []),
         helper.make_tensor_value_info("y_in", TP.FLOAT, [3])],
        [helper.make_tensor_value_info("c_out", TP.BOOL, []), helper.make_tensor_value_info("y_out", TP.FLOAT, [3]),
         helper.make_tensor_value_info("y_step", TP.FLOAT, [3])],
    )
    loop = helper.make_node("Loop", ["n", "c", "y0"], ["y", "steps"], body=body)
    return make_model([loop], [("x", TP.FLOAT, [6, 3]), ("y0", TP.FLOAT, [3])],
                      [("y", TP.FLOAT, [3]), ("steps", TP.FLOAT, [5, 3])],
                      {"n": np.array(5, np.int64), "c": np.array(True), "lim": np.array(2.5, np.float32)}, opset=13)


def test_loop_unrolled_matches_onnxruntime(tmp_path, rng):
    from compiler import compile_model, load

    src = save(_loop_model("pass"), tmp_path / "m.onnx")
    feeds = {"x": rng.standard_normal((6, 3)).astype(np.float32), "y0": rng.standard_normal(3).astype(np.float32)}
    compile_model(src, "cpu", tmp_path / "m.tvmpkg")
    got, want = load(tmp_path / "m.tvmpkg")(**feeds), ort_run(src, feeds)
    for name, ref in want.items():
        np.testing.assert_allclose(got[name], ref, rtol=1e-6, atol=1e-6, err_msg=name)


def test_loop_that_may_stop_early_refused(capsys, tmp_path):
    r = run_cli(capsys, "compile", save(_loop_model("compute"), tmp_path / "m.onnx"), "-t", "cpu")
    assert r.code == 2 and "Loop" in r.err and "condition that its body passes on" in r.err, r.err
