"""Low-precision element types (float8 x5, float4, int4/uint4, int2/uint2), computed exactly.

Such a tensor is carried in the compiled graph as its storage byte, one element per ``uint8``: the bit pattern
ml_dtypes (and so numpy, onnx and the ONNX test data) keeps for it. Only Cast / CastLike to and from these
types are compiled, each as integer bit arithmetic in TE that follows ONNX's reference
(``onnx.reference.ops.op_cast``): round to nearest even, the ``saturate`` tables, NaN / infinity per format,
no negative zero in the FNUZ formats, E8M0's ``round_mode``, integers wrapped to their width (a float out of
range: 0); and QuantizeLinear / DequantizeLinear (not blocked) built on them. Any other use of these types stays refused
(``problems``).

Why not TVM's own float8/float4 dtypes: TVM 0.27 casts to them with the hardware/LLVM conversion (or its
FP8 legalisation), which has no ``saturate`` mode, knows neither the FNUZ encodings nor E8M0, and holds int4
packed two to a byte where ml_dtypes keeps one per byte; so none of it is used here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from tvm import relax, te, tirx

from ..errors import TvmpipeError
from .converters_math import dtype_of
from .converters_nn import shape
from .registry import register_converter

_DT = onnx.TensorProto
DOMAIN = "tvmpipe.lowp"  # the domain of the nodes ``lower`` writes
STORAGE = "uint8"


@dataclass(frozen=True)
class FloatFormat:
    """A sign + ``ebits`` exponent + ``mbits`` mantissa float of one byte or less (codes as magnitudes)."""

    ebits: int
    mbits: int
    bias: int
    max_code: int  # the largest finite magnitude
    nan: int | None = None  # the magnitude code written for NaN (None: the format has no NaN of that form)
    inf: int | None = None
    fnuz: bool = False  # no negative zero: 0x80 is the one NaN
    saturates: bool = False  # always saturates (ONNX's reference ignores ``saturate`` for float4)

    @property
    def sign_shift(self) -> int:
        return self.ebits + self.mbits


FLOATS: dict[int, FloatFormat] = {
    _DT.FLOAT8E4M3FN: FloatFormat(4, 3, 7, 0x7E, nan=0x7F),
    _DT.FLOAT8E4M3FNUZ: FloatFormat(4, 3, 8, 0x7F, fnuz=True),
    _DT.FLOAT8E5M2: FloatFormat(5, 2, 15, 0x7B, nan=0x7E, inf=0x7C),
    _DT.FLOAT8E5M2FNUZ: FloatFormat(5, 2, 16, 0x7F, fnuz=True),
    _DT.FLOAT4E2M1: FloatFormat(2, 1, 1, 0x7, saturates=True),
}
INTS: dict[int, tuple[int, bool]] = {_DT.INT4: (4, True), _DT.UINT4: (4, False), _DT.INT2: (2, True),
                                     _DT.UINT2: (2, False)}  # bits, signed
E8M0 = _DT.FLOAT8E8M0
LOWP = {*FLOATS, *INTS, E8M0}


def dtype_name(elem: int) -> str:
    """The numpy (ml_dtypes) name of an ONNX element type: 'float8_e4m3fn', 'int4' ..."""
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem)).name


# --- bit arithmetic (TIR expressions on one element) ---------------------------------------------------


def _i(value: int, dtype: str = "int32") -> tirx.PrimExpr:
    return tirx.const(value, dtype)


def _dtype(v: tirx.PrimExpr) -> str:
    return str(v.ty)


def _is_float(v: tirx.PrimExpr) -> bool:
    return _dtype(v).startswith("float") or _dtype(v) == "bfloat16"


def _f32(bits: tirx.PrimExpr) -> tirx.PrimExpr:
    return tirx.reinterpret("float32", tirx.Cast("uint32", bits))


def decode_float(code: tirx.PrimExpr, fmt: FloatFormat) -> tirx.PrimExpr:
    """A float8/float4 code -> its exact float32 value (every such value is a float32)."""
    c = tirx.Cast("int32", code)
    sign = (c >> fmt.sign_shift) & 1
    mag = c & ((1 << fmt.sign_shift) - 1)
    e, m = mag >> fmt.mbits, mag & ((1 << fmt.mbits) - 1)
    normal = ((e - fmt.bias + 127) << 23) | (m << (23 - fmt.mbits))
    # subnormal: m quanta of 2^(1 - bias - mbits), a product exact in float32
    sub = tirx.reinterpret("int32", tirx.Cast("float32", m) * tirx.const(2.0 ** (1 - fmt.bias - fmt.mbits), "float32"))
    bits = tirx.Select(mag > fmt.max_code, _i(0x7FC00000), tirx.Select(e == 0, sub, normal))
    if fmt.inf is not None:
        bits = tirx.Select(mag == fmt.inf, _i(0x7F800000), bits)
    if fmt.fnuz:  # the "negative zero" code: a NaN, negative as ml_dtypes gives it
        bits = tirx.Select(c == 0x80, _i(0x7FC00000), bits)
    return _f32(bits | (sign << 31))


# The IEEE layouts an encoder reads: total bits, exponent bits, mantissa bits.
_IEEE = {"float32": (32, 8, 23), "float64": (64, 11, 52)}


def encode_float(x: tirx.PrimExpr, fmt: FloatFormat, saturate: bool) -> tirx.PrimExpr:
    """A float32 or float64 value -> the int32 code of ``fmt`` nearest to it (ties to even), with ONNX's
    saturate / NaN / infinity rules, from the bits of ``x`` (integer arithmetic only, rounded once: a float64
    is not rounded to float32 first, which would move values within a float32 ulp of a tie)."""
    width, ebits, mbits = _IEEE[_dtype(x)]
    wide = f"int{width}"
    u = tirx.reinterpret(wide, x)
    sign = tirx.Cast("int32", (u >> (width - 1)) & 1)
    e = tirx.Cast("int32", (u >> mbits) & ((1 << ebits) - 1))
    m = u & _i((1 << mbits) - 1, wide)
    full = tirx.Select(e == 0, m, m | _i(1 << mbits, wide))  # the significand as an integer
    exp = tirx.max(e, 1) - ((1 << (ebits - 1)) - 1)  # its unbiased exponent: value = full * 2^(exp - mbits)
    binade = tirx.max(exp, 1 - fmt.bias)  # the target binade (the subnormal one below the normals)
    # drop the bits below the target's last mantissa bit; past mbits + 2 everything rounds to 0 anyway
    shift = tirx.Cast(wide, tirx.min(binade - fmt.mbits - exp + mbits, mbits + 2))
    kept = full >> shift
    rest = full - (kept << shift)
    half = _i(1, wide) << (shift - 1)
    up = tirx.Or(rest > half, tirx.And(rest == half, (kept & 1) == 1))
    # kept counts quanta of the binade; a carry past 2^(mbits+1) lands in the next binade by itself
    code = ((binade + fmt.bias - 1) << fmt.mbits) + tirx.Cast("int32", kept) + tirx.Select(up, _i(1), _i(0))

    def signed(mag: tirx.PrimExpr) -> tirx.PrimExpr:
        return mag | (sign << fmt.sign_shift)

    if saturate or fmt.saturates:
        big = signed(_i(fmt.max_code))
    elif fmt.inf is not None:
        big = signed(_i(fmt.inf))
    else:
        big = _i(0x80) if fmt.fnuz else signed(_i(fmt.nan))
    if fmt.fnuz:
        nan, finite = _i(0x80), tirx.Select(code == 0, _i(0), signed(code))
    elif fmt.nan is not None:
        nan, finite = signed(_i(fmt.nan)), signed(code)
    else:  # float4 has no NaN: ml_dtypes (ONNX's reference) writes the zero of the opposite sign
        nan, finite = (1 - sign) << fmt.sign_shift, signed(code)
    special = e == (1 << ebits) - 1
    is_nan = tirx.And(special, m != 0)
    return tirx.Select(is_nan, nan, tirx.Select(tirx.Or(special, code > fmt.max_code), big, finite))


def decode_e8m0(code: tirx.PrimExpr) -> tirx.PrimExpr:
    """2^(code - 127) as float32; 0xFF is NaN, code 0 (2^-127) a float32 subnormal."""
    c = tirx.Cast("int32", code)
    return _f32(tirx.Select(c == 0xFF, _i(0x7FC00000), tirx.Select(c == 0, _i(0x00400000), c << 23)))


def encode_e8m0(x: tirx.PrimExpr, saturate: bool, round_mode: str) -> tirx.PrimExpr:
    """float32 -> E8M0 as ``onnx.numpy_helper.to_float8e8m0`` (ONNX's reference) does it, bit for bit: the
    exponent field, rounded by ``round_mode`` from the mantissa bits, the sign ignored; NaN and infinity
    give 0xFF. (The Cast spec's table maps infinity to E8M0_MAX under saturate; the reference, which made
    the test data, does not: the reference is followed.)"""
    u = tirx.reinterpret("int32", x)
    e = (u >> 23) & 0xFF
    if round_mode == "nearest":  # guard bit, and round, sticky or the exponent's own last bit
        up = tirx.And((u & 0x400000) != 0, tirx.Or(tirx.Or((u & 0x200000) != 0, (u & 0x1FFFFF) != 0), e > 0))
    elif round_mode == "up":
        up = (u & 0x7FFFFF) != 0
    elif round_mode == "down":
        up = tirx.const(False, "bool")
    else:
        raise TvmpipeError(f"round_mode '{round_mode}' is none of ONNX's up, down, nearest")
    if saturate:
        up = tirx.And(up, e != 0xFE)
    return tirx.Select(e == 0xFF, _i(0xFF), e + tirx.Select(up, _i(1), _i(0)))


def decode_int(code: tirx.PrimExpr, bits: int, signed: bool) -> tirx.PrimExpr:
    """ml_dtypes keeps an int4/int2 as its low bits, not sign-extended: sign-extend here."""
    low = tirx.Cast("int32", code) & ((1 << bits) - 1)
    half = 1 << (bits - 1)
    return ((low ^ half) - half) if signed else low


def encode_int(x: tirx.PrimExpr, bits: int, signed: bool) -> tirx.PrimExpr:
    """Integers keep their low ``bits`` (ONNX: discard the higher bits). Floats are truncated toward zero, as
    ml_dtypes (ONNX's reference) does; a float whose truncation is outside the type's range (undefined in
    ONNX: NaN and infinities too) gives 0, as ml_dtypes >= 0.7 does (0.6 wrapped the int32 truncation)."""
    if _is_float(x):
        lo = -(1 << (bits - 1)) if signed else 0
        t = tirx.trunc(tirx.Cast("float64", x))
        ok = tirx.And(t >= tirx.const(lo, "float64"), t <= tirx.const(lo + (1 << bits) - 1, "float64"))
        x = tirx.Select(ok, tirx.Cast("int32", t), _i(0))
    return tirx.Cast("int32", tirx.Cast("int64", x) & ((1 << bits) - 1))


def _to_plain(v: tirx.PrimExpr, src: int) -> tirx.PrimExpr:
    """A stored low-precision element -> its exact value as float32 (floats) or int32 (integers)."""
    if src in FLOATS:
        return decode_float(v, FLOATS[src])
    if src == E8M0:
        return decode_e8m0(v)
    if src in INTS:
        return decode_int(v, *INTS[src])
    return v


def _wide(v: tirx.PrimExpr, dst: int) -> tirx.PrimExpr:
    """The value an encoder into ``dst`` starts from. Integer targets: the float64 or int64 value. Float8 /
    float4 targets: a float64 as it is (ml_dtypes >= 0.7, ONNX's reference, rounds it once; onnxruntime and
    ml_dtypes 0.6 round it to float32 first), anything else as float32 (exact for float16 / bfloat16).
    E8M0: float32, as the reference's ``to_float8e8m0`` converts any input first."""
    if dst in INTS:
        return tirx.Cast("float64" if _is_float(v) else "int64", v)
    if dst in FLOATS and _dtype(v) == "float64":
        return v
    return tirx.Cast("float32", v)


def _encode(v: tirx.PrimExpr, dst: int, saturate: bool, round_mode: str) -> tirx.PrimExpr:
    """A ``_wide`` value -> the storage byte of ``dst``."""
    if dst in INTS:
        code = encode_int(v, *INTS[dst])
    elif dst == E8M0:
        code = encode_e8m0(v, saturate, round_mode)
    else:
        code = encode_float(v, FLOATS[dst], saturate)
    return tirx.Cast(STORAGE, code)


def _plain_cast(v: tirx.PrimExpr, dst: int) -> tirx.PrimExpr:
    """A decoded value (float32/int32) -> an ordinary type: TIR's cast, exact or one rounding (bool: != 0)."""
    to = dtype_name(dst)
    return v != tirx.const(0, _dtype(v)) if to == "bool" else tirx.Cast(to, v)


def lowp_cast(bb, inputs, attrs, params) -> relax.Expr:
    """``tvmpipe.lowp::LowpCast`` (written by ``lower``): Cast from ``from`` to ``to``, one of them a
    low-precision type held as its storage byte; elementwise bit arithmetic.

    Encoding reads its input's bits many times, and a TE expression is a tree that copies an operand into
    each use: so the value to encode is computed in a stage of its own and the encoder reads it back (a
    float8 -> float8 cast written as one expression took 15 s to compile)."""
    src, dst = attrs["from"], attrs["to"]
    saturate = bool(attrs.get("saturate", 1))
    mode = attrs.get("round_mode", "up")
    mode = mode.decode() if isinstance(mode, bytes) else mode

    def compute(t: te.Tensor) -> te.Tensor:
        if dst not in LOWP:
            return te.compute(t.shape, lambda *i: _plain_cast(_to_plain(t(*i), src), dst), name="lowp_decode")
        wide = te.compute(t.shape, lambda *i: _wide(_to_plain(t(*i), src), dst), name="lowp_wide")
        return te.compute(t.shape, lambda *i: _encode(wide(*i), dst, saturate, mode), name="lowp_encode")

    return bb.emit_te(compute, inputs[0])


def _per_axis(bb, v: relax.Expr, rank: int, axis: int) -> relax.Expr:
    """A scale / zero point broadcast along ``axis`` of a rank-``rank`` tensor (a scalar or one element:
    everywhere), as ONNX's reference reshapes it."""
    v = bb.normalize(v)
    n = int(np.prod(shape(v)))
    if n == 1:
        return relax.op.reshape(v, [])
    return relax.op.reshape(v, [n if k == axis % rank else 1 for k in range(rank)])


def _cast(bb, x: relax.Expr, src: int, dst: int, saturate: bool = True) -> relax.Expr:
    return bb.normalize(lowp_cast(bb, [x], {"from": src, "to": dst, "saturate": int(saturate)}, None))


def _onnx_type(x: relax.Expr) -> int:
    return onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype_of(x)))


def lowp_dequantize(bb, inputs, attrs, params) -> relax.Expr:
    """DequantizeLinear of a low-precision ``x`` as ONNX's reference computes it: float32(x) (- zero point,
    for the integer types only: the float8 one must be 0 and float4's is not read), times the scale in
    float32, rounded once to the scale's type (or ``output_dtype``)."""
    x, scale = inputs[:2]
    zp = inputs[2] if len(inputs) > 2 else None
    elem, rank, axis = attrs["type"], len(shape(x)), attrs.get("axis", 1)
    y = _cast(bb, x, elem, _DT.FLOAT)
    if zp is not None and elem in INTS:
        y = relax.op.subtract(y, _per_axis(bb, _cast(bb, zp, elem, _DT.FLOAT), rank, axis))
    y = relax.op.multiply(y, _per_axis(bb, relax.op.astype(scale, "float32"), rank, axis))
    out = dtype_name(attrs["output_dtype"]) if attrs.get("output_dtype") else dtype_of(scale)
    return relax.op.astype(y, out) if out != "float32" else y


def lowp_quantize(bb, inputs, attrs, params) -> relax.Expr:
    """QuantizeLinear to a low-precision type as ONNX's reference computes it: x / scale (in numpy's common
    type), then float8: cast with ``saturate`` (the zero point, 0 by definition, is not read); integers:
    rounded half to even, plus the zero point, clipped to the type's range; float4: plus the zero point,
    cast (float4 always saturates)."""
    from .converters_ops import rint

    x, scale = inputs[:2]
    zp = inputs[2] if len(inputs) > 2 else None
    elem, rank, axis = attrs["type"], len(shape(x)), attrs.get("axis", 1)
    common = np.result_type(np.dtype(dtype_of(x)), np.dtype(dtype_of(scale))).name
    scale = _per_axis(bb, relax.op.astype(scale, common), rank, axis)
    q = bb.normalize(relax.op.divide(relax.op.astype(x, common), scale))
    if elem in INTS:  # clipped in float: the same wherever rint(q) fits int32, ONNX's reference's domain
        bits, signed = INTS[elem]
        lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
        q = relax.op.astype(rint(bb, relax.op.astype(q, "float32")), "float32")
        if zp is not None:
            q = relax.op.add(q, _per_axis(bb, _cast(bb, zp, elem, _DT.FLOAT), rank, axis))
        q = bb.normalize(relax.op.astype(relax.op.clip(q, lo, hi), "int32"))
    elif elem == _DT.FLOAT4E2M1 and zp is not None:
        zp = _per_axis(bb, _cast(bb, zp, elem, _DT.FLOAT), rank, axis)
        q = bb.normalize(relax.op.add(relax.op.astype(q, "float32"), zp))
    return _cast(bb, q, _onnx_type(q), elem, bool(attrs.get("saturate", 1)))


# --- the ONNX graph: where these types may appear, and their rewrite to storage bytes --------------------

_CASTS = ("Cast", "CastLike")
_QUANT = ("QuantizeLinear", "DequantizeLinear")
_TYPE_ATTRS = ("to", "output_dtype", "dtype")


def _mentions(graph: onnx.GraphProto) -> bool:
    """Whether any declared value, weight, attribute or cast target of the graph (subgraphs too) is of a
    low-precision type: only then is the graph's typing worked out."""
    infos = [*graph.input, *graph.output, *graph.value_info]
    if any(vi.type.tensor_type.elem_type in LOWP for vi in infos if vi.type.HasField("tensor_type")):
        return True
    if any(t.data_type in LOWP for t in graph.initializer):
        return True
    for node in graph.node:
        for attr in node.attribute:
            if attr.name in _TYPE_ATTRS and attr.type == onnx.AttributeProto.INT and attr.i in LOWP:
                return True
            if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type in LOWP:
                return True
            if attr.type == onnx.AttributeProto.GRAPH and _mentions(attr.g):
                return True
            if attr.type == onnx.AttributeProto.GRAPHS and any(_mentions(g) for g in attr.graphs):
                return True
    return False


def _types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every value of the main graph that shape inference (or a cast) can tell."""
    graph = onnx.shape_inference.infer_shapes(model).graph
    types = {vi.name: vi.type.tensor_type.elem_type for vi in [*graph.input, *graph.output, *graph.value_info]
             if vi.type.HasField("tensor_type")}
    types.update({t.name: t.data_type for t in graph.initializer})
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute[0].type == onnx.AttributeProto.TENSOR:
            types[node.output[0]] = node.attribute[0].t.data_type
        elif node.op_type == "Cast":
            types[node.output[0]] = next(a.i for a in node.attribute if a.name == "to")
        elif node.op_type == "CastLike" and node.input[1] in types:
            types[node.output[0]] = types[node.input[1]]
    return types


def problems(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """(what, element type name) for each use of a low-precision type that ``lower`` cannot compile: any
    node but Cast / CastLike / Constant / QuantizeLinear / DequantizeLinear (without ``precision``; blocked
    ones are refused by ``support.REFUSALS``) reading or writing one, and any use inside a subgraph."""
    if not _mentions(model.graph):
        return []
    from .support import iter_nodes

    found = []
    types = _types(model)
    for node in model.graph.node:
        for attr in node.attribute:
            if attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
                subgraphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
                outer = any(types.get(v) in LOWP for sub in subgraphs for n in iter_nodes(sub) for v in n.input)
                if outer or any(_mentions(sub) for sub in subgraphs):
                    found.append((f"a subgraph of {node.op_type} '{node.name}'", "low-precision types"))
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type in (*_CASTS, "Constant"):
            continue
        if node.op_type in _QUANT and not any(a.name == "precision" for a in node.attribute):
            continue
        for name in [*node.input, *node.output]:
            if types.get(name) in LOWP:
                found.append((f"'{name}' of {node.op_type} '{node.name}' (only Cast/CastLike/QuantizeLinear/"
                               "DequantizeLinear compute on it)",
                              _DT.DataType.Name(types[name])))
                break
    for node in model.graph.node:  # a cast whose source type is not known cannot be lowered
        if node.op_type in _CASTS and types.get(node.output[0]) in LOWP and node.input[0] not in types:
            found.append((f"the input of {node.op_type} '{node.name}' (its type is unknown)",
                          _DT.DataType.Name(types[node.output[0]])))
    return found


def _storage_tensor(t: onnx.TensorProto) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(t).view(STORAGE), t.name)


def _lower_quant(node: onnx.NodeProto, types: dict[str, int]) -> None:
    """A Quantize/DequantizeLinear to or from a low-precision type -> LowpQuantize / LowpDequantize, which
    carry that type (``type``) since their storage-byte operands no longer say it."""
    quantize = node.op_type == "QuantizeLinear"
    elem = types.get(node.output[0] if quantize else node.input[0])
    if elem not in LOWP:
        return
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    attrs.pop("block_size", None)
    lowered = onnx.helper.make_node("LowpQuantize" if quantize else "LowpDequantize", list(node.input),
                                    list(node.output), node.name, domain=DOMAIN, type=elem, **attrs)
    node.CopyFrom(lowered)


def lower(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` (checked by ``problems``) where low-precision values are ``uint8`` storage, the
    casts to or from them ``tvmpipe.lowp::LowpCast`` nodes and the (de)quantisations LowpQuantize /
    LowpDequantize (converted by ``lowp_cast`` / ``lowp_quantize`` / ``lowp_dequantize``)."""
    if not _mentions(model.graph):
        return model
    types = _types(model)
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    for vi in [*graph.input, *graph.output, *graph.value_info]:
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type in LOWP:
            vi.type.tensor_type.elem_type = _DT.UINT8
    for k, t in enumerate(graph.initializer):
        if t.data_type in LOWP:
            graph.initializer[k].CopyFrom(_storage_tensor(t))
    for k, node in enumerate(graph.node):
        if node.op_type == "Constant" and node.attribute[0].t.data_type in LOWP:
            node.attribute[0].t.CopyFrom(_storage_tensor(node.attribute[0].t))
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type in _QUANT:
            _lower_quant(node, types)
        if node.op_type not in _CASTS:
            continue
        src, dst = types.get(node.input[0]), types.get(node.output[0])
        if src not in LOWP and dst not in LOWP:
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute if a.name != "to"}
        lowered = onnx.helper.make_node("LowpCast", [node.input[0]], list(node.output), node.name, domain=DOMAIN,
                                        **{"from": src, "to": dst, **attrs})
        graph.node[k].CopyFrom(lowered)
    model.opset_import.append(onnx.helper.make_opsetid(DOMAIN, 1))
    return model


register_converter(DOMAIN, "LowpCast", lowp_cast)
register_converter(DOMAIN, "LowpQuantize", lowp_quantize)
register_converter(DOMAIN, "LowpDequantize", lowp_dequantize)
