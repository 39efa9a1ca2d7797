"""NonMaxSuppression (``compiler/frontend/converters_ops.py``) against onnxruntime: random boxes in both box
formats, and boxes whose IoU equals the threshold exactly (ONNX keeps them; TOPI alone would suppress)."""

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper

from helpers import make_model, ort_run, save


def _check(tmp_path, boxes: np.ndarray, scores: np.ndarray, consts: dict, center: int) -> None:
    from compiler import compile_model, load

    node = helper.make_node("NonMaxSuppression", ["boxes", "scores", "maxb", "iou", "score"], ["sel"],
                            center_point_box=center)
    model = make_model([node], [("boxes", TP.FLOAT, list(boxes.shape)), ("scores", TP.FLOAT, list(scores.shape))],
                       [("sel", TP.INT64, ["k", 3])], consts, opset=11)
    src = save(model, tmp_path / "m.onnx")
    feeds = {"boxes": boxes, "scores": scores}
    compile_model(src, "cpu", tmp_path / "m.tvmpkg")
    np.testing.assert_array_equal(load(tmp_path / "m.tvmpkg")(**feeds)["sel"], ort_run(src, feeds)["sel"])


def _consts(max_boxes: int, iou: float, score: float) -> dict:
    return {"maxb": np.array([max_boxes], np.int64), "iou": np.array([iou], np.float32),
            "score": np.array([score], np.float32)}


@pytest.mark.parametrize("center", [0, 1])
def test_nms_random(tmp_path, rng, center):
    corner = rng.uniform(0, 10, (2, 13, 2))
    boxes = np.concatenate([corner, corner + rng.uniform(1, 4, (2, 13, 2))], axis=2).astype(np.float32)
    scores = rng.random((2, 3, 13)).astype(np.float32)
    _check(tmp_path, boxes, scores, _consts(4, 0.3, 0.2), center)


def test_nms_iou_equal_to_threshold_kept(tmp_path):
    boxes = np.array([[[0, 0, 1, 1], [0, 0, 1, 0.5], [0, 0.5, 1, 1]]], np.float32)  # IoU(0, 1) = IoU(0, 2) = 0.5
    scores = np.array([[[0.9, 0.8, 0.7]]], np.float32)
    _check(tmp_path, boxes, scores, _consts(3, 0.5, 0.0), 0)
