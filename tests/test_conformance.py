"""ONNX node tests through the conformance runner: the converters and refusals it drove, and the committed results."""

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import onnx_conformance as conf  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "onnx_conformance.json"

# One or two node tests per converter tvmpipe adds or overrides (each was failing or wrong upstream).
FIXED = [
    "test_nllloss_NCd1d2d3_sum_weight_high_ii", "test_sce_NCd1_mean_weight_negative_ii_log_prob",
    "test_layer_normalization_3d_axis1_epsilon", "test_rms_normalization_2d_axis0", "test_l2normalization_axis_1",
    "test_mod_float_edge_cases_fmod_0_float32", "test_bitshift_right_int8_shift_ge_width", "test_isinf_negative",
    "test_pow_types_int64_int64", "test_pow_types_float32_int32", "test_celu", "test_swish",
    "test_spacetodepth_crd_mode_example", "test_attention_causal_boolmask_nan_robustness_expanded",
    "test_convtranspose_output_shape", "test_dft_rfft_opset19", "test_causal_conv_with_state_silu_fp16",
    "test_qlinearmatmul_3D_int8_float16", "test_rotary_embedding_interleaved", "test_tensorscatter_circular",
    "test_reversesequence_batch", "test_convinteger_with_padding", "test_bitcast_float32_to_int32",
    "test_reduce_max_default_axes_keepdim_example", "test_cast_DOUBLE_to_FLOAT", "test_castlike_FLOAT_to_DOUBLE",
    "test_clip_default_min", "test_shape_end_1", "test_tril_zero", "test_dropout_default_ratio",
    "test_reduce_l1_default_axes_keepdims_example",
    # ... and the CPU elementwise rule's cases (a select-based concat, gathers/scatters, cosh, zero-size tensors)
    "test_rotary_embedding_3d_input", "test_cosh", "test_scatter_elements_with_axis",
    "test_maxunpool_export_without_output_shape", "test_causal_conv_with_state_kernel_size_one",
    # small ConstantOfShape values folded (the expanded LayerNorm's reshape target)
    "test_layer_normalization_2d_axis0_expanded",
    # Attention's explicit path: softcap, qk_matmul_output, sliding windows, nonpad_kv_seqlen
    "test_attention_4d_softcap", "test_attention_4d_with_qk_matmul_softmax",
    "test_attention_local_window_gqa_rank4_mask", "test_attention_4d_causal_nonpad_batch_prefill",
    # Scan unrolled; function bodies expanded (the fp16 one: Q/K/V of different types are not fused attention)
    "test_scan9_sum", "test_linear_attention_gated_delta_gqa_expanded", "test_linear_attention_gated",
    "test_flexattention_fp16", "test_qlinearconv",
    # low-precision types, exactly (compiler/frontend/lowp.py); CastLike's saturate=0 survives the optimiser
    "test_cast_FLOAT_to_FLOAT8E4M3FN", "test_castlike_no_saturate_FLOAT16_to_FLOAT8E5M2FNUZ",
    "test_cast_e8m0_FLOAT_to_FLOAT8E8M0", "test_cast_INT4_to_INT8", "test_cast_FLOAT4E2M1_to_FLOAT16",
    "test_quantizelinear_int4", "test_dequantizelinear_e4m3fn_float16",
]
# Known-wrong or inexpressible cases that must be refused, never computed.
REFUSED = [
    "test_roialign_mode_max", "test_training_dropout", "test_equal_string", "test_nonzero_example",
]
# Refused as they are (a graph input decides a shape), right once the runner binds those inputs: test -> inputs.
BOUND = {"test_reshape_reordered_all_dims": ["shape"], "test_top_k": ["k"], "test_expand_dim_changed": ["new_shape"],
         "test_range_bfloat16_type_positive_delta": ["delta", "limit", "start"],
         "test_resize_upsample_scales_linear": ["scales"], "test_dft_axis": ["axis"],
         # tvmpipe's Resize (antialias, fractional scales, axes, keep_aspect_ratio_policy) and Upsample
         "test_resize_downsample_scales_linear_antialias": ["scales"],
         "test_resize_downsample_scales_linear": ["scales"],
         "test_resize_tf_crop_and_resize_axes_3_2": ["roi", "sizes"], "test_upsample_nearest": ["scales"],
         "test_resize_downsample_sizes_nearest_not_larger": ["sizes"],
         # Pad, CenterCropPad, Split, OneHot, AffineGrid, bool ReduceMax, Col2Im, MaxUnpool, uint64 TopK
         "test_constant_pad_axes": ["axes", "pads"], "test_center_crop_pad_crop_and_pad": ["shape"],
         "test_split_zero_size_splits_opset18": ["split"], "test_onehot_with_axis": ["depth"],
         "test_affine_grid_3d": ["size"], "test_reduce_max_bool_inputs": ["axes"],
         "test_affine_grid_2d_expanded": ["size"],  # a Split of the bound size folded
         "test_col2im_pads": ["block_shape", "image_shape"],
         "test_maxunpool_export_with_output_shape": ["output_shape"], "test_top_k_uint64": ["k"],
         "test_loop11": ["cond", "trip_count"],  # Loop unrolled
         "test_range_float_type_positive_delta_expanded": ["delta", "limit", "start"],
         "test_stft_with_window": ["frame_step"],  # MelWeightMatrix: all inputs bound, folded to a constant
         "test_melweightmatrix": ["dft_length", "lower_edge_hertz", "num_mel_bins", "sample_rate", "upper_edge_hertz"],
         # NonMaxSuppression with IoU == threshold kept, as ONNX says
         "test_nonmaxsuppression_iou_threshold_boundary":
             ["iou_threshold", "max_output_boxes_per_class", "score_threshold"]}


@pytest.fixture(scope="module")
def cases():
    return {c.name: c for c in conf.load_cases("^(" + "|".join(FIXED + REFUSED + list(BOUND)) + ")$")}


@pytest.mark.parametrize("name", FIXED)
def test_node_test_passes(cases, tmp_path, name):
    rec = conf.run_case(cases[name], str(tmp_path))
    assert rec["status"] == "pass", rec


@pytest.mark.parametrize("name", REFUSED)
def test_node_test_refused(cases, tmp_path, name):
    rec = conf.run_case(cases[name], str(tmp_path))
    assert rec["status"] == "unsupported", rec
    assert "tvmpipe" in rec["error"] or "cannot be compiled" in rec["error"] or "not supported" in rec["error"]


@pytest.mark.parametrize("name", BOUND)
def test_node_test_passes_with_bound_inputs(cases, tmp_path, name):
    rec = conf.run_case(cases[name], str(tmp_path), bind=False)
    assert rec["status"] == "unsupported" and "--bind-input" in rec["error"] and "bound_inputs" not in rec, rec
    rec = conf.run_case(cases[name], str(tmp_path))
    assert rec["status"] == "pass" and rec["bound_inputs"] == BOUND[name], rec


def test_bound_test_that_computes_wrong_is_a_mismatch(cases, tmp_path):
    """Binding must not hide a wrong answer: the same test with a perturbed expected output fails."""
    case = cases["test_top_k"]
    wrong = conf.Case(case.name, case.op, case.model, case.inputs, [case.outputs[0] + 1, case.outputs[1]])
    rec = conf.run_case(wrong, str(tmp_path))
    assert rec["status"] == "mismatch" and rec["bound_inputs"] == ["k"], rec


def test_summary_counts_bound_passes_apart():
    records = [{"test": "a", "op": "X", "status": "pass", "error": None},
               {"test": "b", "op": "X", "status": "pass", "error": None, "bound_inputs": ["k"]},
               {"test": "c", "op": "X", "status": "mismatch", "error": "1/1 elements differ", "bound_inputs": ["k"]},
               {"test": "d", "op": "X", "status": "unsupported", "error": "X (opset 1; node 'n'): no converter"}]
    s = conf.summarize(records, 1.0)
    assert (s["passed"], s["passed_without_binding"], s["passed_with_bound_inputs"]) == (2, 1, 1)
    assert (s["pass_rate"], s["pass_rate_without_binding"], s["retried_with_bound_inputs"]) == (0.5, 0.25, 2)


def test_compare_catches_wrong_answers():
    import ml_dtypes
    import numpy as np

    assert conf._compare(np.array([1.0, np.nan], np.float32), np.array([1.0, np.nan], np.float32)) is None
    assert "differ" in conf._compare(np.array([1.0, 2.0], np.float32), np.array([1.0, 2.01], np.float32))
    assert "dtype" in conf._compare(np.array([1], np.int32), np.array([1], np.int64))
    assert "shape" in conf._compare(np.zeros((2, 1), np.float32), np.zeros((2,), np.float32))
    # one-byte types exactly: a float8 one unit off (within the 2-eps tolerance of wider floats) differs
    f8 = np.array([0x38, 0x7F], np.uint8).view(ml_dtypes.float8_e4m3fn)  # 1.0, NaN
    assert conf._compare(f8, f8.copy()) is None
    assert "differ" in conf._compare((f8.view(np.uint8) + [1, 0]).astype(np.uint8).view(f8.dtype), f8)


def test_failure_categories():
    rec = {"status": "unsupported", "op": "X", "error": "m.onnx: 2 nodes cannot be compiled: "
           "Foo (opset 17; node 'a'): no converter; my.ops::Bar (opset 1; nodes 'b', 'c'): no converter"}
    assert conf.category(rec) == "no converter: Foo, my.ops::Bar"
    rec["error"] = "m.onnx: 1 node cannot be compiled: TopK (opset 11; node 'n'): its K ('k') must be a constant"
    assert conf.category(rec).startswith("needs a run-time value")


# Mismatches in the committed run that are understood and fixed elsewhere: test -> why, and where the fix is.
KNOWN_MISMATCHES: dict[str, str] = {}  # test name -> why its wrong answer is accepted (none today)


def test_committed_results_have_no_silent_mismatch():
    """The committed run covers every node test of the installed onnx, and every wrong answer in it is known."""
    records = json.loads(RESULTS.read_text())
    statuses = {"pass", "unsupported", "import_fail", "compile_fail", "run_fail", "mismatch"}
    assert {r["status"] for r in records} <= statuses
    assert {r["test"] for r in records if r["status"] == "mismatch"} <= set(KNOWN_MISMATCHES)
    assert len(records) == len(conf.load_cases(None))
