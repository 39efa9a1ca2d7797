"""Cast / CastLike to and from float8 (E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ, E8M0), float4 E2M1, int4/uint4 and
int2/uint2 (``compiler/frontend/lowp.py``), bit for bit against ONNX's reference implementation
(``onnx.reference.ReferenceEvaluator``, ml_dtypes underneath): every code decoded; encoded from every
float16, and from float32/float64 edge values (each format's values, the halfway points between them and
one ulp either side, max, overflow, subnormals, -0, inf, NaN) plus random bit patterns; QuantizeLinear /
DequantizeLinear to and from them; the manifest and the runtime's ml_dtypes arrays; refusals."""

import ml_dtypes
import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto as TP
from onnx import helper
from onnx.reference import ReferenceEvaluator

from compiler.errors import TvmpipeError
from compiler.frontend.support import Unsupported
from helpers import make_model, save

FLOAT8 = [TP.FLOAT8E4M3FN, TP.FLOAT8E4M3FNUZ, TP.FLOAT8E5M2, TP.FLOAT8E5M2FNUZ]
FLOATS = [*FLOAT8, TP.FLOAT4E2M1]
INTS = [TP.INT4, TP.UINT4, TP.INT2, TP.UINT2]
LOWP = [*FLOATS, TP.FLOAT8E8M0, *INTS]
OPSET = 25


def _np(elem: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem))


def _codes(elem: int) -> np.ndarray:
    """Every valid storage byte of a low-precision type (ml_dtypes keeps 4/2-bit values in the low bits)."""
    bits = 4 if elem in (TP.FLOAT4E2M1, TP.INT4, TP.UINT4) else 2 if elem in (TP.INT2, TP.UINT2) else 8
    return np.arange(1 << bits, dtype=np.uint8).view(_np(elem))


def _run_both(tmp_path, nodes, inputs: dict[str, np.ndarray], outputs: dict[str, int]):
    """Compile a graph of ``nodes`` with tvmpipe and run it, and run ONNX's reference on it: both outputs."""
    from compiler import compile_model, load

    elem = {n: helper.np_dtype_to_tensor_dtype(a.dtype) for n, a in inputs.items()}
    shape = inputs["x"].shape
    model = make_model(nodes, [(n, elem[n], list(a.shape)) for n, a in inputs.items()],
                       [(n, t, list(shape)) for n, t in outputs.items()], opset=OPSET)
    model.ir_version = 11
    manifest = compile_model(save(model, tmp_path / "m.onnx"), "cpu", tmp_path / "m.tvmpkg")
    ours = load(tmp_path / "m.tvmpkg")(**inputs)
    ref = dict(zip(outputs, ReferenceEvaluator(model).run(None, inputs)))
    return ours, ref, manifest


def _assert_same(ours: np.ndarray, ref: np.ndarray, x: np.ndarray, what: str, any_nan: bool = False) -> None:
    """Same dtype and, element for element, the same bits; any NaN for NaN in a float target wider than a
    byte, or in any float target with ``any_nan`` (ml_dtypes' float8 -> float8 keeps NaN payload bits, which
    ONNX leaves open)."""
    assert ours.dtype == ref.dtype, what
    same = ours.view(f"u{ref.dtype.itemsize}") == ref.view(f"u{ref.dtype.itemsize}")
    if ref.dtype not in (ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.int2, ml_dtypes.uint2) and \
            (any_nan or ref.dtype.itemsize > 1):
        same |= np.isnan(ours.astype(np.float32)) & np.isnan(ref.astype(np.float32))
    bad = np.flatnonzero(~same)
    assert not bad.size, (f"{what}: {bad.size}/{x.size} differ, e.g. {x.reshape(-1)[bad[:5]]!r} -> "
                          f"{ours.reshape(-1)[bad[:5]]!r}, reference {ref.reshape(-1)[bad[:5]]!r}")


def _edges(dtype: np.dtype) -> np.ndarray:
    """Every finite value of each float8/float4 format, the midpoints between neighbours and one ulp of
    ``dtype`` either side of them all, both signs, and inf, NaN, -0, max, the float's subnormals."""
    values = []
    for elem in FLOATS:
        v = _codes(elem).astype(np.float64)
        v = np.unique(v[np.isfinite(v)])
        values += [v, (v[1:] + v[:-1]) / 2, [2 * v[-1] - (v[-1] + v[-2]) / 2]]  # the overflow midpoint too
    for e in range(-135, 128):
        values.append([2.0**e, 1.5 * 2.0**e, 1.75 * 2.0**e])  # E8M0's rounding boundaries
    v = np.concatenate(values).astype(dtype)
    info = np.finfo(dtype)
    special = np.array([0, np.inf, np.nan, info.max, info.tiny, info.smallest_subnormal, 1e10], dtype)
    v = np.concatenate([v, np.nextafter(v, dtype.type(np.inf)), np.nextafter(v, dtype.type(0)), special])
    return np.concatenate([v, -v])


def _encode_nodes(like: dict[str, np.ndarray]) -> tuple[list, dict[str, int]]:
    """Casts of x to every low-precision type: saturate on and off, E8M0's rounding modes, and a CastLike
    with saturate=0 (onnxscript's optimiser turns it into a Cast and dropped the attribute)."""
    nodes, outputs = [], {}
    for elem in [*FLOATS, *INTS]:
        for sat in (1, 0) if elem in FLOATS else (1,):
            name = f"{TP.DataType.Name(elem)}_s{sat}"
            nodes.append(helper.make_node("Cast", ["x"], [name], to=elem, saturate=sat))
            outputs[name] = elem
    for mode in ("up", "down", "nearest"):
        for sat in (1, 0):
            name = f"E8M0_{mode}_s{sat}"
            nodes.append(helper.make_node("Cast", ["x"], [name], to=TP.FLOAT8E8M0, saturate=sat, round_mode=mode))
            outputs[name] = TP.FLOAT8E8M0
    for elem in (TP.FLOAT8E4M3FN, TP.FLOAT8E5M2):
        name = f"like_{TP.DataType.Name(elem)}_s0"
        like[f"like_{elem}"] = np.zeros(0, _np(elem))
        nodes.append(helper.make_node("CastLike", ["x", f"like_{elem}"], [name], saturate=0))
        outputs[name] = elem
    return nodes, outputs


@pytest.mark.parametrize("source", ["float32", "float16", "float64", "bfloat16", "int32"])
def test_encode_matches_reference(tmp_path, rng, source):
    dtype = np.dtype(ml_dtypes.bfloat16 if source == "bfloat16" else source)
    if source == "float16":  # every float16
        x = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    elif source == "int32":
        x = np.concatenate([np.arange(-600, 600), rng.integers(-2**31, 2**31, 10000), [2**31 - 1, -2**31]])
        x = x.astype(np.int32)
    else:
        bits = rng.integers(0, 1 << (8 * dtype.itemsize), 100_000, dtype=np.uint64).astype(f"u{dtype.itemsize}")
        wide = np.float32 if source == "bfloat16" else dtype
        x = np.concatenate([_edges(np.dtype(wide)).astype(dtype), bits.view(dtype)])
    inputs = {"x": x}
    nodes, outputs = _encode_nodes(inputs)
    ours, ref, _ = _run_both(tmp_path, nodes, inputs, outputs)
    for name in outputs:
        _assert_same(ours[name], ref[name], x, f"{source} -> {name}")


def test_castlike_saturate_off_inside_a_local_function(tmp_path, rng):
    """A CastLike with saturate=0 in a model-local function keeps it (inlined before the optimiser, which
    would turn it into a Cast without the attribute): out-of-range values become NaN / infinity, not the
    format's maximum."""
    from compiler import compile_model, load

    body = helper.make_node("CastLike", ["a", "like"], ["b"], saturate=0)
    fn = helper.make_function("local", "ToF8", ["a", "like"], ["b"], [body], [helper.make_opsetid("", OPSET)])
    x = np.concatenate([rng.standard_normal(61) * 300, [1e4, -1e5, 448, 57344, np.inf, np.nan]]).astype(np.float32)
    like = {TP.FLOAT8E4M3FN: "like4", TP.FLOAT8E5M2: "like5"}
    nodes = [helper.make_node("ToF8", ["x", name], [f"y{elem}"], domain="local") for elem, name in like.items()]
    model = make_model(nodes, [("x", TP.FLOAT, [x.size])], [(f"y{e}", e, [x.size]) for e in like],
                       {name: np.zeros(1, _np(elem)) for elem, name in like.items()}, opset=OPSET,
                       extra_opsets={"local": 1})
    model.functions.append(fn)
    model.ir_version = 11
    compile_model(save(model, tmp_path / "m.onnx"), "cpu", tmp_path / "m.tvmpkg")
    ours = load(tmp_path / "m.tvmpkg")(x=x)
    ref = dict(zip([f"y{e}" for e in like], ReferenceEvaluator(model).run(None, {"x": x})))
    for name in ref:
        _assert_same(ours[name], ref[name], x, name)
    assert np.isnan(ours[f"y{TP.FLOAT8E4M3FN}"].astype(np.float32)[-6]), "1e4 saturated to 448"


def _cuda_kernel_output(tmp_path, node: onnx.NodeProto, x: np.ndarray, elem: int) -> np.ndarray:
    """The one kernel of a one-node model, compiled for cuda-sm90 as a package gets it (DLight's schedule),
    built by NVRTC and run on the CPU emulator."""
    from compiler import cuda_binary, pipeline, tuning
    from tests import cuda_emu

    model = make_model([node], [("x", helper.np_dtype_to_tensor_dtype(x.dtype), [x.size])], [("y", elem, [x.size])],
                       opset=OPSET)
    model.ir_version = 11
    prep = pipeline.prepare(save(model, tmp_path / "m.onnx"), "cuda-sm90")
    (func,) = [f for f in prep.mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    with prep.target.target:
        func, _ = tuning.default_schedule(func, prep.target)
    cuda_binary.compile_source(cuda_emu.cuda_source(func, prep.target.target), "sm_90")
    out = np.zeros(x.size, np.uint8 if _np(elem).itemsize == 1 else _np(elem))
    arrays = {func.params[0].name: x.view(np.uint8) if x.dtype.itemsize == 1 else x, func.params[1].name: out}
    cuda_emu.run(func, prep.target.target, arrays)
    return out.view(_np(elem))


# one type per encoding family (the kernels are the CPU's TIR; what differs on CUDA is the codegen): float8,
# the packed float4, the exponent-only E8M0 and a packed integer. ~15 s each: emulated kernels compile slowly.
@pytest.mark.slow
@pytest.mark.parametrize("elem", [TP.FLOAT8E4M3FN, TP.FLOAT4E2M1, TP.FLOAT8E8M0, TP.INT4], ids=TP.DataType.Name)
def test_cuda_kernels_match_reference(tmp_path, rng, elem):
    """On CUDA (built by NVRTC, run on the emulator): float32 -> elem (saturating, and not, for float8) and
    elem -> float32, bit for bit against ONNX's reference, on the rounding edges and random floats."""
    pytest.importorskip("cuda.bindings")
    edges = _edges(np.dtype(np.float32))
    x = np.concatenate([edges[:: max(1, edges.size // 1500)], rng.standard_normal(500) * 100]).astype(np.float32)
    for sat in (1, 0) if elem in FLOAT8 else (1,):
        node = helper.make_node("Cast", ["x"], ["y"], to=elem, saturate=sat)
        ref = ReferenceEvaluator(make_model([node], [("x", TP.FLOAT, [x.size])], [("y", elem, [x.size])],
                                            opset=OPSET)).run(None, {"x": x})[0]
        _assert_same(_cuda_kernel_output(tmp_path, node, x, elem), ref, x, f"float32 -> {TP.DataType.Name(elem)} s{sat}")
    codes = _codes(elem)
    node = helper.make_node("Cast", ["x"], ["y"], to=TP.FLOAT)
    ref = codes.astype(np.float32)
    _assert_same(_cuda_kernel_output(tmp_path, node, codes, TP.FLOAT), ref, codes, f"{TP.DataType.Name(elem)} -> float32")


@pytest.mark.parametrize("elem", LOWP, ids=TP.DataType.Name)
def test_decode_matches_reference(tmp_path, elem):
    x = _codes(elem)
    targets = [TP.FLOAT, TP.FLOAT16, TP.DOUBLE, TP.BFLOAT16] + ([TP.INT8, TP.UINT8, TP.INT32] if elem in INTS else [])
    if elem not in INTS:  # low to low (ml_dtypes casts no int4 to another small int, nor float NaN to int)
        targets += [t for t in (TP.FLOAT8E5M2, TP.FLOAT8E4M3FNUZ) if t != elem]
    outputs = {f"y{t}": t for t in targets}
    nodes = [helper.make_node("Cast", ["x"], [n], to=t) for n, t in outputs.items()]
    ours, ref, manifest = _run_both(tmp_path, nodes, {"x": x}, outputs)
    for name, t in outputs.items():
        _assert_same(ours[name], ref[name], x, f"{TP.DataType.Name(elem)} -> {TP.DataType.Name(t)}", any_nan=True)
    assert manifest["inputs"][0] == {"name": "x", "shape": [x.size], "dtype": x.dtype.name, "storage": "uint8"}


def test_manifest_and_runtime_dtypes(tmp_path):
    """Inputs and outputs of a low-precision type are described by their ONNX type; the runtime takes and
    gives ml_dtypes arrays, and a float32 or raw uint8 array for a float8 input is one clear error."""
    from compiler import load

    x = np.array([0.5, -3, 1000, np.nan], np.float32)
    nodes = [helper.make_node("Cast", ["x"], ["y"], to=TP.FLOAT8E4M3FN)]
    ours, ref, manifest = _run_both(tmp_path, nodes, {"x": x}, {"y": TP.FLOAT8E4M3FN})
    assert manifest["outputs"] == [{"name": "y", "shape": [4], "dtype": "float8_e4m3fn", "storage": "uint8"}]
    assert ours["y"].dtype == ml_dtypes.float8_e4m3fn
    np.testing.assert_array_equal(ours["y"].view(np.uint8), [0x30, 0xC4, 0x7E, 0x7F])  # 1000 saturates to 448
    np.testing.assert_array_equal(ours["y"].view(np.uint8), ref["y"].view(np.uint8))

    nodes = [helper.make_node("Cast", ["x"], ["y"], to=TP.FLOAT)]
    f8 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
    _run_both(tmp_path, nodes, {"x": f8}, {"y": TP.FLOAT})
    run = load(tmp_path / "m.tvmpkg")
    for wrong in (f8.astype(np.float32), f8.view(np.uint8)):
        with pytest.raises(TvmpipeError, match=rf"^input 'x' has dtype {wrong.dtype.name}, expected float8_e4m3fn "):
            run(x=wrong)


@pytest.mark.parametrize("case", ["add", "cast_then_neg", "subgraph"])
def test_other_uses_refused(tmp_path, case):
    """Only Cast / CastLike / Quantize- / DequantizeLinear compute on these types: anything else is refused,
    naming the value, the node and the type."""
    from compiler import compile_model

    f8 = ("x", TP.FLOAT8E4M3FN, [4])
    if case == "add":
        model = make_model([helper.make_node("Add", ["x", "x"], ["y"], name="add0")], [f8],
                           [("y", TP.FLOAT8E4M3FN, [4])], opset=OPSET)
        want = r"'x' of Add 'add0' \(only Cast/CastLike/QuantizeLinear/DequantizeLinear compute on it\): FLOAT8E4M3FN"
    elif case == "cast_then_neg":
        nodes = [helper.make_node("Cast", ["x"], ["t"], to=TP.FLOAT8E5M2),
                 helper.make_node("Neg", ["t"], ["y"], name="neg0")]
        model = make_model(nodes, [("x", TP.FLOAT, [4])], [("y", TP.FLOAT8E5M2, [4])], opset=OPSET)
        want = r"'t' of Neg 'neg0' \(only Cast/CastLike/QuantizeLinear/DequantizeLinear compute on it\): FLOAT8E5M2"
    else:
        body = helper.make_graph([helper.make_node("Cast", ["x"], ["t"], to=TP.FLOAT)], "b", [],
                                 [helper.make_tensor_value_info("t", TP.FLOAT, [4])])
        node = helper.make_node("If", ["c"], ["y"], name="if0", then_branch=body, else_branch=body)
        model = make_model([node], [f8, ("c", TP.BOOL, [])], [("y", TP.FLOAT, [4])], opset=OPSET)
        want = r"a subgraph of If 'if0': low-precision types"
    model.ir_version = 11
    with pytest.raises(Unsupported, match=rf"element types tvmpipe cannot compute exactly \(.*{want}"):
        compile_model(save(model, tmp_path / "m.onnx"), "cpu", tmp_path / "m.tvmpkg")


@pytest.mark.parametrize("elem", [*FLOAT8, TP.FLOAT4E2M1, *INTS], ids=TP.DataType.Name)
def test_quantize_dequantize_match_reference(tmp_path, rng, elem):
    """QuantizeLinear to and DequantizeLinear from each type, per-axis scales and zero points, against ONNX's
    reference: values on and next to the rounding ties, past the range (clipped or saturated), NaN-free
    (float -> int of NaN is undefined); float8 with saturate on and off."""
    scale = np.array([0.5, 1.0, 3.0], np.float32)
    x = np.concatenate([rng.uniform(-20, 20, (3, 40)), (np.arange(-30, 30) / 2)[None].repeat(3, 0)], 1)
    x = np.concatenate([x, x * 1e3, np.nextafter(x, np.inf), np.nextafter(x, -np.inf)], 1).astype(np.float32)
    zp = _codes(elem)[rng.integers(0, _codes(elem).size, 3)] if elem in (*INTS, TP.FLOAT4E2M1) else np.zeros(3, _np(elem))
    if elem == TP.FLOAT4E2M1:  # a finite zero point
        zp = np.array([0.5, -1, 0], np.float32).astype(_np(elem))
    inputs = {"x": x, "s": scale, "z": zp}
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], axis=0),
             helper.make_node("DequantizeLinear", ["y", "s", "z"], ["d"], axis=0)]
    outputs = {"y": elem, "d": TP.FLOAT}
    if elem in FLOAT8:
        nodes.append(helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y0"], axis=0, saturate=0))
        outputs["y0"] = elem
    from compiler import compile_model, load

    model = make_model(nodes, [("x", TP.FLOAT, list(x.shape)), ("s", TP.FLOAT, [3]), ("z", elem, [3])],
                       [(n, t, list(x.shape)) for n, t in outputs.items()], opset=OPSET)
    model.ir_version = 11
    compile_model(save(model, tmp_path / "m.onnx"), "cpu", tmp_path / "m.tvmpkg")
    ours = load(tmp_path / "m.tvmpkg")(**inputs)
    ref = dict(zip(outputs, ReferenceEvaluator(model).run(None, inputs)))
    for name in outputs:
        _assert_same(ours[name], ref[name], x, f"{name} ({TP.DataType.Name(elem)})")
