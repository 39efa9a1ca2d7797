"""FuseAttention: the exported scaled-dot-product attention subgraph becomes ONE ``relax.nn.attention`` op.

Exporters write attention as ``MatMul(Q, Kᵀ) -> Mul/Div by a scale -> (Add mask | Where mask) -> Softmax
-> MatMul(·, V)``, with the scale anywhere on that path or on Q and Kᵀ (PyTorch's SDPA export scales both
by sqrt(scale) and zeroes NaN probabilities, ``Where(IsNaN(P), 0, P)``, before P·V: a fully masked row gives
0, which the fused op reproduces with the same Where on its output; they differ only for a NaN or inf in V),
heads split by Reshape/Transpose, ``[batch, heads, seq, dim]`` (4-D) or ``[batch*heads, seq, dim]`` (3-D)
operands and additive masks that may come from an input or be a constant.
Unfused, that is five kernels and four ``seq_q x seq_k`` score tensors written and read back per head;
as one op it is one kernel that can keep the scores on chip (the flash-attention schedule).

The op takes BSNH operands ``[batch, seq, heads, dim]``: the transposes we insert around it cancel with the
exporter's head-split transposes in ``SimplifyLayout``. A constant mask that is exactly causal (0 where key
``j <= i + offset``, <= -1e4 or -inf elsewhere, or a boolean ``Where`` of that shape) becomes
``causal_mask="TopLeft"`` (offset 0) or ``"BottomRight"`` (offset ``seq_k - seq_q`` > 0, TVM's definition),
anything else the ``bias`` (4-D, broadcast to ``[batch, heads, seq_q, seq_k]``). Masks whose masked value
is finite but <= -1e4 give weights that are exactly 0 in float32 either way, so causal_mask is exact too.
A bias that is the same for every query row but spelled out over them (transformers' exports expand the
padding mask to ``[batch, 1, seq_q, seq_k]`` with an all-true constant) is given to the op as one row. Grouped-query
K and V heads that the graph repeats to Q's head count (transformers' ``repeat_kv``) are given to the op as they were
before the repeat (``_grouped``): its kernels read each K/V head once for its group.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax, topi
from tvm.relax.dpl import is_op, rewrite_call, wildcard

from .util import (BINARY_ELEMENTWISE, UNARY_ELEMENTWISE, const_array, dtype, private, scalar, sole_producer,
                   static_shape, users)

_SOFTMAX = is_op("relax.nn.softmax")(wildcard())
# 16-bit graphs (the frontend sums them in float32): softmax in float32 with its probabilities cast back,
# P·V with a float32 output cast back; the Q·Kᵀ side has the same casts, which ``_scores`` looks through
_PROBS = _SOFTMAX | is_op("relax.astype")(_SOFTMAX)
# PyTorch's SDPA export zeroes the probabilities softmax makes NaN (rows whose keys are all masked):
# where(isnan(P), 0, P)
_NAN_ZEROED = is_op("relax.where")(is_op("relax.isnan")(wildcard()), wildcard(), _PROBS)
# (under mixed precision the zeroed float32 probabilities are cast to 16 bits for P·V)
_PV = is_op("relax.matmul")(_PROBS | _NAN_ZEROED | is_op("relax.astype")(_NAN_ZEROED), wildcard())
_PATTERN = _PV | is_op("relax.astype")(_PV)
_MASKED = -1e4  # additive values at or below this give exp(.) == 0 in float32: a masked position
# ops whose output at an index depends only on their (broadcast) inputs at that index: the arithmetic ones the other
# passes move, and those masks are built of
_ELEMENTWISE = {*UNARY_ELEMENTWISE, *BINARY_ELEMENTWISE, *(f"relax.{name}" for name in (
    "where", "logical_and", "logical_or", "logical_not", "bitwise_and", "bitwise_or", "equal", "not_equal", "less",
    "less_equal", "greater", "greater_equal"))}


def _not_default_attention_dtypes(record: logging.LogRecord) -> bool:
    """Relax's FoldConstant lowers calls with TVM's own legalisation while it looks for constants; for the fused
    op with a float32 mask over 16-bit Q/K/V that lowering (discarded: ours replaces it) makes topi's
    batch_matmul warn about two dtypes. Drop exactly that message."""
    return not record.getMessage().startswith("tensor_a has different data type with tensor_b")


logging.getLogger("topi").addFilter(_not_default_attention_dtypes)


@dataclass
class _Scores:
    """What feeds the softmax: ``scale * q @ kt + sum(multiplier * mask)``."""

    q: relax.Expr
    kt: relax.Expr
    scale: float
    masks: list[tuple[relax.Expr, float, tuple[int, ...]]] = field(default_factory=list)  # (mask, mult, shape)


def _cast_source(x: relax.Expr, var2val: dict) -> relax.Expr | None:
    """What the ``astype`` that produced ``x`` casts, if an ``astype`` produced it."""
    cast = var2val.get(x)
    return cast.args[0] if isinstance(cast, relax.Call) and cast.op.name == "relax.astype" else None


def _scalar(x: relax.Expr, var2val: dict) -> float | None:
    """``scalar``, also of a constant cast to another type (mixed precision writes ``astype(0.125)``)."""
    source = _cast_source(x, var2val)
    return scalar(x if source is None else source)


def _scaled(call: relax.Call, var2val: dict) -> tuple[relax.Expr, float] | None:
    """``x * c``, ``c * x`` or ``x / c`` with a positive scalar constant ``c``: (x, the factor)."""
    if call.op.name not in ("relax.multiply", "relax.divide"):
        return None
    a, b = call.args
    if call.op.name == "relax.multiply" and _scalar(a, var2val) is not None:
        a, b = b, a
    c = _scalar(b, var2val)
    return None if c is None or c <= 0 else (a, c if call.op.name == "relax.multiply" else 1 / c)


def _scores(x: relax.Expr, mult: float, var2val: dict, uses) -> _Scores | None:
    """Walk back from the softmax input to the Q·Kᵀ matmul through scales and masks; None if it is not one."""
    call = sole_producer(x, var2val, uses)
    name = call.op.name if call is not None else ""
    if name == "relax.matmul":
        return _Scores(*call.args, scale=mult)
    if name == "relax.astype":  # the 16-bit round trip of the scores: the fused kernel keeps them in float32
        return _scores(call.args[0], mult, var2val, uses)
    if scaled := call is not None and _scaled(call, var2val):
        return _scores(scaled[0], mult * scaled[1], var2val, uses)
    if name == "relax.add":
        for s, mask in (call.args, call.args[::-1]):
            found = _scores(s, mult, var2val, uses)
            if found is not None:
                found.masks.append((mask, mult, static_shape(mask)))
                return found
    if name == "relax.where":
        cond, a, b = call.args
        for s, fill, keep in ((a, b, True), (b, a, False)):
            f = scalar(fill)
            found = _scores(s, mult, var2val, uses) if f is not None and f <= _MASKED else None
            if found is not None:
                found.masks.append((_where_mask(cond, keep, f, dtype(fill)), mult, static_shape(cond)))
                return found
    return None


def _where_mask(cond: relax.Expr, keep: bool, fill: float, dt: str) -> relax.Expr:
    """``where(cond, scores, fill)`` as an additive mask: 0 where the score is kept, ``fill`` elsewhere."""
    c = const_array(cond)
    if c is not None:
        return relax.const(np.where(c.astype(bool) == keep, 0.0, fill).astype(dt))
    zero, masked = relax.const(0.0, dt), relax.const(fill, dt)
    return relax.op.where(cond, *((zero, masked) if keep else (masked, zero)))


def _causal(mask: np.ndarray, sq: int, sk: int) -> str | None:
    """'TopLeft'/'BottomRight' if the constant additive mask is exactly causal, '' if it masks nothing."""
    rows = np.broadcast_to(mask, (*mask.shape[:-2], sq, sk)).reshape(-1, sq, sk)
    if not (rows == rows[:1]).all():
        return None
    allowed = rows[0] == 0
    if not (allowed | (rows[0] <= _MASKED)).all():
        return None
    if allowed.all():
        return ""
    for offset, name in ((0, "TopLeft"), (sk - sq, "BottomRight")):
        if offset >= 0 and (allowed == np.tril(np.ones((sq, sk), bool), offset)).all():
            return name
    return None


def _peel_scale(x: relax.Expr, var2val: dict, uses) -> tuple[relax.Expr, float]:
    """A scalar scale on a matmul operand, possibly under transposes/reshapes (Keras scales Q before the
    head transpose): the operand without it (same shape) and the factor, which goes into the op's scale."""
    call = sole_producer(x, var2val, uses)
    if call is None:
        return x, 1.0
    if call.op.name in ("relax.permute_dims", "relax.reshape"):
        inner, c = _peel_scale(call.args[0], var2val, uses)
        return (x, 1.0) if c == 1.0 else (relax.Call(call.op, [inner, *call.args[1:]], call.attrs), c)
    return _scaled(call, var2val) or (x, 1.0)


def _uniform(x: relax.Expr, axis: int, var2val: dict) -> bool:
    """Whether ``x`` is the same at every index of ``axis`` (from the end): extent 1 there, a constant equal along
    it, or an elementwise function of such tensors."""
    value = const_array(x)
    if value is not None:
        return value.ndim < -axis or bool((value == value.take([0], axis=axis)).all())
    call = x if isinstance(x, relax.Call) else var2val.get(x)
    if isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op) and call.op.name in _ELEMENTWISE:
        return all(_uniform(a, axis, var2val) for a in call.args)
    if isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.broadcast_to":
        return _uniform(call.args[0], axis, var2val)
    shape = static_shape(x)
    return shape is not None and (len(shape) < -axis or shape[axis] == 1)


def _bias(found: _Scores, sq: int, sk: int, dt: str,
          var2val: dict) -> tuple[relax.Expr | None, tuple[int, ...], str | None]:
    """Split the masks into one additive bias (or None), its shape, and a causal_mask (or None). A bias the same
    for every query row becomes one row: the kernels read a [b, h, 1, s_k] bias once per key (the CPU kernel holds
    query rows across its vector lanes and gathers a bias that varies along them: BERT-base's exported mask,
    [1, 1, 128, 128], took its attention from 0.128 to 0.14-0.15 ms)."""
    consts = [const_array(m).astype(np.float64) * k for m, k, _ in found.masks if isinstance(m, tvm.ir.GenericConst)]
    variable = [(m, k, shape) for m, k, shape in found.masks if not isinstance(m, tvm.ir.GenericConst)]
    # summed in the widest of their types and Q's, the bias's type (mixed precision leaves T5's float32 padding mask
    # beside its float16 position bias; the kernels read the bias in its own type, adding it to float32 scores): in
    # float16 the mask's -FLT_MAX would be -inf, or clamped, no longer absorb the scores of a row masked everywhere
    acc = max([dt, *(dtype(m) for m, _, _ in variable)], key=lambda t: np.finfo(t).bits)
    terms = []
    for m, k, shape in variable:
        t = m if dtype(m) == acc else relax.op.astype(m, acc)
        terms.append((t if k == 1 else relax.op.multiply(t, relax.const(k, acc)), shape))
    causal = None
    if consts:
        total = sum(consts[1:], consts[0])
        causal = _causal(total, sq, sk)
        if causal is None:
            terms.append((relax.const(np.maximum(total, np.finfo(acc).min).astype(acc)), total.shape))
    if not terms:
        return None, (), causal or None
    bias = terms[0][0]
    for t, _ in terms[1:]:
        bias = relax.op.add(bias, t)
    shape = np.broadcast_shapes(*(shape for _, shape in terms))
    if len(shape) >= 2 and shape[-2] > 1 and all(_uniform(t, -2, var2val) for t, _ in terms):
        bias = relax.op.strided_slice(bias, axes=[len(shape) - 2], begin=[0], end=[1])
        shape = (*shape[:-2], 1, shape[-1])
    return bias, shape, causal or None


def _call(x: relax.Expr, var2val: dict, name: str) -> relax.Call | None:
    """The ``relax.<name>`` call that computes ``x``, if one does."""
    value = x if isinstance(x, relax.Call) else var2val.get(x)
    ok = isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name == f"relax.{name}"
    return value if ok else None


def _is_transpose(x: relax.Expr, axes: list[int], var2val: dict) -> bool:
    value = _call(x, var2val, "permute_dims")
    return value is not None and value.attrs.axes is not None and [int(a) for a in value.attrs.axes] == axes


def _repeated_heads(x: relax.Expr, var2val: dict) -> relax.Expr | None:
    """``x0`` if ``x`` (``[b, g * r, s, d]``, or merged ``[b * g * r, s, d]``) is ``x0`` ``[b, g, s, d]`` with each
    head repeated r times in place (transformers' ``repeat_kv`` for grouped-query heads: ``x0[:, :, None].expand(b, g,
    r, s, d).reshape(b, g * r, s, d)``; PyTorch's SDPA with ``enable_gqa``), so that head h of x is head h // r of x0,
    as the attention op reads grouped K and V heads; else None."""
    reshape = _call(x, var2val, "reshape")
    bcast = None if reshape is None else _call(reshape.args[0], var2val, "broadcast_to")
    if bcast is None:
        return None
    unit = _call(bcast.args[0], var2val, "expand_dims")
    unit = _call(bcast.args[0], var2val, "reshape") if unit is None else unit
    if unit is None:
        return None
    x0 = unit.args[0]
    shapes = [static_shape(e) for e in (x0, unit, bcast, x)]
    if any(shape is None for shape in shapes) or len(shapes[0]) != 4:
        return None
    (b, g, s, d), r = shapes[0], shapes[2][2]
    return x0 if shapes[1:3] == [(b, g, 1, s, d), (b, g, r, s, d)] and shapes[3] in ((b, g * r, s, d),
                                                                                      (b * g * r, s, d)) else None


def _transposed(kt: relax.Expr, var2val: dict) -> relax.Expr | None:
    """K if ``kt`` is K's last two axes swapped: ``permute_dims(K, [0, 1, 3, 2])``, or (PyTorch's dynamo exports)
    ``reshape(permute_dims(K, [0, 2, 1]), [b, h, d, s])`` of K merged to ``[b * h, s, d]`` (the caller checks the
    shapes)."""
    if _is_transpose(kt, [0, 1, 3, 2], var2val):
        return _call(kt, var2val, "permute_dims").args[0]
    merged = _call(kt, var2val, "reshape")
    if merged is None or not _is_transpose(merged.args[0], [0, 2, 1], var2val):
        return None
    return _call(merged.args[0], var2val, "permute_dims").args[0]


def _grouped(kt: relax.Expr, v: relax.Expr, var2val: dict) -> tuple[relax.Expr, relax.Expr] | None:
    """K (not transposed) and V with their grouped heads as they were before the graph repeated them to Q's head
    count (4-D, both repeated alike): the kernel reads each K and V head once for its group, not once per query head."""
    k = _transposed(kt, var2val)
    k0, v0 = (None, None) if k is None else (_repeated_heads(k, var2val), _repeated_heads(v, var2val))
    if k0 is None or v0 is None:
        return None
    (b, g, s, d), vshape = static_shape(k0), static_shape(v)
    heads = vshape[1] if len(vshape) == 4 else None
    return (k0, v0) if static_shape(v0)[1] == g and static_shape(kt) == (b, heads, d, s) else None


def _to_bsnh(q, kt, v, bias, bshape, shapes, var2val) -> tuple[list[relax.Expr], relax.Expr | None, Callable]:
    """Q, K, V and the bias in the op's layout, and how to bring its output back to the graph's layout.

    4-D ``[b, h, s, d]``: transposes, which cancel with the exporter's head transposes. 3-D ``[n, s, d]``
    that is the transpose of ``[s, n, d]`` (sequence-first exports): batch 1 with n heads; other 3-D:
    batch n with one head. Either way the 3-D operands need only reshapes (views)."""
    (*lead, sq, d), (*_, sk), (*_, dv) = shapes
    op = relax.op
    b4 = (1,) * (len(lead) + 2 - len(bshape)) + tuple(bshape)  # the bias with the scores' rank
    if len(lead) == 2:
        ops = [op.permute_dims(q, [0, 2, 1, 3]), op.permute_dims(kt, [0, 3, 1, 2]), op.permute_dims(v, [0, 2, 1, 3])]
        if bias is not None and len(bshape) < 4:
            bias = op.reshape(bias, list(b4))
        return ops, bias, lambda o: op.permute_dims(o, [0, 2, 1, 3])
    n = lead[0]
    if _is_transpose(q, [1, 0, 2], var2val):
        ops = [op.reshape(op.permute_dims(q, [1, 0, 2]), [1, sq, n, d]),
               op.reshape(op.permute_dims(kt, [2, 0, 1]), [1, sk, n, d]),
               op.reshape(op.permute_dims(v, [1, 0, 2]), [1, sk, n, dv])]
        bias = None if bias is None else op.reshape(bias, [1, *b4])
        return ops, bias, lambda o: op.permute_dims(op.reshape(o, [sq, n, dv]), [1, 0, 2])
    ops = [op.reshape(q, [n, sq, 1, d]), op.reshape(op.permute_dims(kt, [0, 2, 1]), [n, sk, 1, d]),
           op.reshape(v, [n, sk, 1, dv])]
    bias = None if bias is None else op.reshape(bias, [b4[0], 1, *b4[1:]])
    return ops, bias, lambda o: op.reshape(o, [n, sq, dv])


def _uncast(x: relax.Expr, var2val: dict, uses) -> relax.Expr | None:
    """``x`` without a private ``astype`` that produced it (or None if the cast is read elsewhere)."""
    source = _cast_source(x, var2val)
    if source is None:
        return x
    return source if private(x, uses) else None


def _nan_zeroed(probs: relax.Expr | None, var2val: dict, uses) -> relax.Expr | None:
    """The probabilities under ``where(isnan(P), 0, P)``, if ``probs`` is that and nothing else reads its parts."""
    where = var2val.get(probs) if probs is not None else None
    if not (private(probs, uses) and isinstance(where, relax.Call) and where.op.name == "relax.where"):
        return None
    test, zero, p = where.args
    isnan = var2val.get(test)
    if scalar(zero) != 0.0 or not private(test, uses) or not isnan.args[0].same_as(p) or uses[p] != 2:
        return None
    return p


def _fused_is_faster(dt: str, head_dim: int, head_dim_v: int) -> bool:
    """Whether the fused kernel beats the chain it replaces on the current target. On CUDA only the
    tensor-core kernel does: with the CUDA-core fallback (fp32, odd head dims) BERT-base fp32 took 2.33 ms
    on the H200, unfused (tensor-core GEMMs, our softmax) 1.86 ms. On the CPU the fused kernel wins."""
    target = tvm.target.Target.current(allow_none=True)
    if target is None or target.kind.name != "cuda":
        return True
    from schedules.attention_cuda import tensor_cores  # (imported here: the schedules package imports compiler)

    return tensor_cores(dt, head_dim, head_dim_v, target)


def _fuse(out: relax.Call, matches: dict, var2val: dict, uses) -> relax.Expr:
    softmax, pv = matches[_SOFTMAX], matches[_PV]
    probs, v = pv.args
    rank = out.ty.ndim
    if rank not in (3, 4) or int(softmax.attrs.axis) % rank != rank - 1 or dtype(out) != dtype(v):
        return out  # (a P·V summed in float32 is taken at its cast back to V's type)
    nan_zeroed = _NAN_ZEROED in matches
    if nan_zeroed and (probs := _nan_zeroed(_uncast(probs, var2val, uses), var2val, uses)) is None:
        return out
    inner = [source] if (source := _cast_source(probs, var2val)) is not None else []
    lone = [] if nan_zeroed else [probs]  # (under the where, P has its two readers: isnan and the where)
    if not all(private(x, uses) for x in [*lone, *inner, *([out.args[0]] if out.op.name == "relax.astype" else [])]):
        return out
    found = _scores(softmax.args[0], 1.0, var2val, uses)
    if found is None:
        return out
    (q, qs), (kt, ks) = _peel_scale(found.q, var2val, uses), _peel_scale(found.kt, var2val, uses)
    if len({dtype(found.q), dtype(found.kt), dtype(v)}) != 1:  # the kernels take Q, K and V of one type
        return out
    shapes = [static_shape(e) for e in (found.q, found.kt, v, softmax.args[0])]
    if (grouped := _grouped(kt, v, var2val)) is not None:
        (k0, v), (b, g, sk, d) = grouped, static_shape(grouped[0])
        kt, shapes[1:3] = relax.op.permute_dims(k0, [0, 1, 3, 2]), [(b, g, d, sk), static_shape(v)]
    if any(s is None or len(s) != rank for s in shapes) or not _fused_is_faster(dtype(v), shapes[0][-1], shapes[2][-1]):
        return out
    (*lead, sq, _), (*klead, _, sk), (*vlead, _, _) = shapes[:3]
    # Same batch for Q, K, V; K/V heads equal to Q's, or grouped: a divisor of them (one: multi-query).
    if shapes[3] != (*lead, sq, sk) or klead != vlead or klead[0] != lead[0] or len(klead) != len(lead) or (
            rank == 4 and lead[1] % klead[1]):
        return out
    bias, bshape, causal = _bias(found, sq, sk, dtype(out), var2val)
    if bias is not None and (not bshape or bshape[-1] != sk):  # a scalar or a per-query bias: spell out its keys
        bshape = (*bshape[:-1], sk)
        bias = relax.op.broadcast_to(bias, bshape)
    (qb, kb, vb), bias, back = _to_bsnh(q, kt, v, bias, bshape, shapes[:3], var2val)
    fused = back(relax.op.nn.attention(qb, kb, vb, bias, scale=found.scale * qs * ks, causal_mask=causal))
    if nan_zeroed:  # a fully masked row: 0/0 in the kernel, P = 0 (so P·V = 0) in the graph it replaces
        fused = relax.op.where(relax.op.isnan(fused), relax.const(0, dtype(out)), fused)
    return fused


def _stock_legalize(name: str) -> Callable:
    """TVM's own legalisation of attention op ``name`` (``--no-custom-schedules``), which takes K and V with Q's head
    count: grouped-query K/V heads, which the graph keeps grouped for our kernels (one read of K and V per group), are
    repeated to it first."""
    stock = tvm.ir.Op.get(name).get_attr("FLegalize")

    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        q, k, v, *bias = call.args
        group = int(q.ty.shape[2]) // int(k.ty.shape[2])
        if group > 1:
            k, v = (bb.emit_te(topi.repeat, t, group, 2) for t in (k, v))
            call = relax.Call(call.op, [q, k, v, *bias], call.attrs)
        return stock(bb, call)

    return legalize


STOCK_LEGALIZE = {name: _stock_legalize(name) for name in ("relax.nn.attention", "relax.nn.attention_bias")}


@relax.transform.function_pass(opt_level=0, name="FuseAttention")
class FuseAttention:
    def transform_function(self, func: relax.Function, mod: tvm.IRModule, ctx) -> relax.Function:
        var2val, uses = relax.analysis.get_var2val(func), users(func)
        return rewrite_call(_PATTERN, lambda e, m: _fuse(e, m, var2val, uses), func)
