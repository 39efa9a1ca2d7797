"""ONNX LSTM / GRU / RNN through the CLI against onnxruntime: directions, optional inputs and outputs, layout,
activations, clip, GRU linear_before_reset, LSTM peepholes / input_forget, sequence_lens masking, refusals."""

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper

from helpers import compile_and_compare, make_model, rel_err, run_cli, save

F = TP.FLOAT
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
SEQ, BATCH, IN, HID = 5, 3, 7, 11


def rnn_model(op, rng, *, direction="forward", bias=True, init=True, layout=0, peepholes=False, seq_lens=None,
              runtime_lens=False, outputs=("Y", "Y_h", "Y_c"), dynamic_batch=False, opset=14, **attrs):
    """One op node with random weights; returns (model, onnxruntime reference model or None, inputs, shapes).

    onnxruntime has no layout=1, so for it the reference is the layout=0 node between Transposes."""
    dirs, g = 2 if direction == "bidirectional" else 1, GATES[op]
    b_axis = 0 if layout else 1  # of X and of the states
    x_shape, s_shape = ([BATCH, SEQ, IN], [BATCH, dirs, HID]) if layout else ([SEQ, BATCH, IN], [dirs, BATCH, HID])
    states = ["h0", "c0"][: 2 if op == "LSTM" else 1] if init else []
    feeds = {n: rng.standard_normal(x_shape if n == "X" else s_shape).astype(np.float32) for n in ["X", *states]}
    inits = {"W": 0.3 * rng.standard_normal((dirs, g * HID, IN)), "R": 0.3 * rng.standard_normal((dirs, g * HID, HID))}
    if bias:
        inits["B"] = 0.3 * rng.standard_normal((dirs, 2 * g * HID))
    if peepholes:
        inits["P"] = 0.3 * rng.standard_normal((dirs, 3 * HID))
    inits = {k: v.astype(np.float32) for k, v in inits.items()}
    if seq_lens is not None:
        (feeds if runtime_lens else inits)["lens"] = np.array(seq_lens, np.int32)

    def declared(shape: list[int]) -> list:  # the batch dim symbolic, to be bound by --input-shape
        return [("batch" if dynamic_batch and k == b_axis else d) for k, d in enumerate(shape)]

    graph_inputs = [(n, TP.INT32 if n == "lens" else F, declared(list(v.shape)) if n != "lens" else [BATCH])
                    for n, v in feeds.items()]
    names = ["X", "W", "R", "B" if bias else "", "lens" if seq_lens is not None else "",
             *(states or [""] * (2 if op == "LSTM" else 1)), "P" if peepholes else ""]
    while not names[-1]:
        names.pop()
    outs = [n if n in outputs else "" for n in ["Y", "Y_h", "Y_c"][: 3 if op == "LSTM" else 2]]
    y_shape = [BATCH, SEQ, dirs, HID] if layout else [SEQ, dirs, BATCH, HID]
    out_info = [(n, F, declared(y_shape if n == "Y" else s_shape)) for n in outs if n]

    def build(transposed: bool):
        moved = {"X", *states, *outs} - {""} if transposed else set()
        node = helper.make_node(op, [f"{n}_t" if n in moved else n for n in names],
                                [f"{n}_t" if n in moved else n for n in outs], direction=direction, hidden_size=HID,
                                **({"layout": 0 if transposed else layout} if opset >= 14 else {}), **attrs)
        pre = [helper.make_node("Transpose", [n], [f"{n}_t"], perm=[1, 0, 2]) for n in ["X", *states] if n in moved]
        post = [helper.make_node("Transpose", [f"{n}_t"], [n], perm=[2, 0, 1, 3] if n == "Y" else [1, 0, 2])
                for n in outs if n in moved]
        return make_model(pre + [node] + post, graph_inputs, out_info, inits, opset=opset)

    shapes = {n: feeds[n].shape for n in ["X", *states]} if dynamic_batch else None
    return build(False), build(True) if layout else None, feeds, shapes


CASES = {  # id: (op, rnn_model kwargs)
    **{f"{op}-{d}-{v}": (op, dict(direction=d, bias=v != "bare", init=v == "full"))
       for op in GATES for d, v in [("forward", "bare"), ("reverse", "bias"), ("bidirectional", "full")]},
    **{f"{op}-layout1": (op, dict(direction="bidirectional", layout=1)) for op in GATES},
    **{f"{op}-clip": (op, dict(direction="bidirectional", clip=0.4)) for op in GATES},
    **{f"{op}-only-Y_h": (op, dict(outputs=("Y_h",))) for op in GATES},
    "GRU-linear_before_reset": ("GRU", dict(direction="bidirectional", linear_before_reset=1, clip=0.8)),
    "LSTM-peepholes": ("LSTM", dict(direction="bidirectional", peepholes=True)),
    "LSTM-input_forget-opset7": ("LSTM", dict(input_forget=1, peepholes=True, opset=7)),
    "LSTM-only-Y_c-opset22": ("LSTM", dict(outputs=("Y_c",), opset=22, direction="reverse")),
    # alpha/beta are consumed in order by the functions that take them: HardSigmoid(.3,.6) LeakyRelu(.2)
    # ScaledTanh(.9,.8) | Sigmoid Affine(.7,.1) Relu.
    "LSTM-activations": ("LSTM", dict(direction="bidirectional", activation_alpha=[0.3, 0.2, 0.9, 0.7],
                                      activation_beta=[0.6, 0.8, 0.1], activations=[
                                          "HardSigmoid", "LeakyRelu", "ScaledTanh", "Sigmoid", "Affine", "Relu"])),
    "GRU-activations": ("GRU", dict(direction="bidirectional", linear_before_reset=1, activation_alpha=[0.25, 0.5],
                                    activation_beta=[0.45], activations=["HardSigmoid", "Softplus", "Sigmoid", "Elu"])),
    "RNN-activations": ("RNN", dict(direction="bidirectional", activations=["Softsign", "ThresholdedRelu"],
                                    activation_alpha=[0.1])),
    "LSTM-lens-const": ("LSTM", dict(direction="bidirectional", seq_lens=[5, 3, 1], peepholes=True)),
    "GRU-lens-runtime": ("GRU", dict(direction="bidirectional", seq_lens=[2, 0, 5], runtime_lens=True)),
    "RNN-lens-uniform": ("RNN", dict(direction="reverse", seq_lens=[5, 5, 5])),
    "LSTM-dynamic-batch": ("LSTM", dict(direction="bidirectional", dynamic_batch=True)),
}


@pytest.mark.parametrize("case", CASES)
def test_matches_onnxruntime(capsys, tmp_path, rng, case):
    op, kw = CASES[case]
    model, reference, inputs, shapes = rnn_model(op, rng, **kw)
    ours, ref = compile_and_compare(capsys, tmp_path, model, inputs, shapes=shapes, reference=reference)
    assert sorted(ours) == sorted(ref) == sorted(o.name for o in model.graph.output)
    for name in ref:
        assert ours[name].shape == ref[name].shape
        assert rel_err(ours[name], ref[name]) <= 1e-4, name


@pytest.mark.parametrize("op,kw,needle", [
    ("LSTM", dict(activations=["Affine", "Tanh", "Tanh"]), "activation Affine needs its alpha and beta"),
    ("GRU", dict(activations=["Sigmoid", "Swish"]), "unknown activation 'Swish'"),
    ("LSTM", dict(direction="bidirectional", activations=["Sigmoid", "Tanh", "Tanh"]),
     "3 activations given, expected 6"),
    ("RNN", dict(seq_lens=[5, 6, 1]), "sequence_lens [5, 6, 1] must lie in [0, 5]"),
])
def test_refused_with_clear_error(capsys, tmp_path, rng, op, kw, needle):
    model = rnn_model(op, rng, **kw)[0]
    r = run_cli(capsys, "compile", save(model, tmp_path / "m.onnx"), "--target", "cpu", "-o", tmp_path / "m.tvmpkg")
    assert r.code == 2 and r.err.count("\n") == 1, r.err
    assert needle in r.err and f"{op} node" in r.err, r.err
