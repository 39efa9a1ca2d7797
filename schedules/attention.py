"""Fused attention: Relax's ``nn.attention`` as ONE kernel that never writes the score matrix.

Two halves, joined by a function attribute:

* ``legalize`` (registered in ``schedules.LEGALIZE`` for ``relax.nn.attention`` and
  ``relax.nn.attention_bias``) lowers the op to a call_tir of a *canonical* PrimFunc: the plain
  definition in TE (scores, mask, softmax, weighted sum), marked ``tvmpipe.kernel = "attention"``
  with its scale and causal mode, and ``op_pattern = kOpaque`` so FuseOps leaves it alone.
* ``Attention`` (a DLight rule in ``schedules.RULES``) recognises that attribute and replaces the
  canonical function with a hand-written kernel of the same signature: the tensor-core flash kernel
  (``attention_cuda``) or a SIMT fallback on CUDA, the tiled online-softmax kernel on CPU
  (``attention_cpu``). The kernels are written directly in TVMScript (explicit tiling, shared
  memory, mma/ldmatrix/cp.async) rather than derived by schedule primitives from the canonical
  compute: the rule returns ``Schedule(kernel)``.

Semantics (layout BSNH; equal to TVM's default legalisation, which is what the unfused graph gives):
``out[b,i,h,:] = softmax_j(scale * q[b,i,h,:]·k[b,j,h/g,:] + bias[b,h,i,j], masked) @ v[b,:,h/g,:]``
with ``scale = 1/sqrt(head_dim)`` unless given, ``g = heads / kv_heads`` (grouped-query heads),
``bias`` broadcast over any of its first three axes, and a causal mask keeping ``j <= i + offset``
(``offset = 0`` for "TopLeft", ``|seq_q - seq_kv|`` for "BottomRight", as TVM defines it). A row
whose every score is ``-inf`` (fully masked by the bias) comes out NaN, as the unfused softmax gives.
K and V that the graph transposes from a KV cache's [batch, heads, seq, dim] are given to the canonical function as
they are (``kv_layout = "BHSD"``, ``_cache_sources``) where the target's kernel reads them in place (the CPU kernels,
the CUDA decode kernel: ``_reads_in_place``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import relax, te, tirx, topi
from tvm.s_tir.dlight.base import ScheduleRule
from tvm.script import tirx as T

from compiler.errors import TvmpipeError

# ``legalize`` runs inside LegalizeOps (C++): registered, a TvmpipeError it raises reaches the CLI as itself
tvm_ffi.register_error(TvmpipeError)

KERNEL_ATTR = "tvmpipe.kernel"
KV_LAYOUT_ATTR = "tvmpipe.attention.kv_layout"  # "BHSD": K and V as a KV cache holds them (absent: "BSNH")
_OPAQUE = 8  # relax OpPatternKind::kOpaque: FuseOps never fuses the call with its neighbours


def static(x):
    """A static extent as a Python int (index arithmetic stays 32-bit); a symbolic one as it is."""
    return int(x) if isinstance(x, tirx.IntImm) else x


def causal_offset(seq_q, seq_kv, causal: str):
    """Query row i sees key j iff ``j <= i + offset``: 0 for "TopLeft", ``|seq_q - seq_kv|`` for "BottomRight"."""
    if causal != "BottomRight":
        return 0
    if isinstance(seq_q, int) and isinstance(seq_kv, int):
        return abs(seq_q - seq_kv)
    return tirx.max(seq_q - seq_kv, seq_kv - seq_q)


def kv_index(layout: str, b, key, hk, d) -> tuple:
    """Index of element (key, d) of key/value head hk in K or V laid out as ``layout`` (of extents: their shape)."""
    return (b, key, hk, d) if layout == "BSNH" else (b, hk, key, d)


def broadcast_index(shape, b, h, i) -> list:
    """Index of a bias broadcast over its extent-1 leading axes."""
    return [0 if isinstance(n, int) and n == 1 else x for x, n in zip((b, h, i), shape[:3])]


@dataclass(frozen=True)
class AttentionSpec:
    """Everything a kernel generator needs, read back from a canonical function (static extents as ints)."""

    batch: int | tirx.PrimExpr
    seq_q: int | tirx.PrimExpr
    seq_kv: int | tirx.PrimExpr
    heads: int
    kv_heads: int
    head_dim: int
    head_dim_v: int
    dtype: str
    scale: float
    causal: str  # "none", "TopLeft" or "BottomRight"
    bias_shape: tuple | None  # the bias buffer's shape (4-D, broadcastable) or None
    bias_dtype: str | None
    kv_layout: str = "BSNH"  # K and V as [batch, seq, heads, dim], or "BHSD" (a KV cache's [batch, heads, seq, dim])

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    def visible(self, row, key):
        """Whether key ``key`` exists and query row ``row`` may attend to it."""
        if self.causal == "none":
            return key < self.seq_kv
        return tirx.all(key < self.seq_kv, key <= row + causal_offset(self.seq_q, self.seq_kv, self.causal))

    def bias_at(self, bias, b, h, row, key):
        """The bias for (b, h, row, key) in fp32 (``key`` a vector of keys: a vector of biases); rows / keys past the
        end are clamped (their scores are unused)."""
        idx = broadcast_index(self.bias_shape, b, h, tirx.min(row, self.seq_q - 1))
        key = tirx.min(key, self.seq_kv - 1)
        return bias[(*idx, key)].astype(tvm.DataType("float32").with_lanes(key.ty.dtype.lanes))

    def kv_at(self, x, b, key, hk, d):
        """Element (key, d) of K or V ``x`` for key/value head hk in fp32; keys past the end are clamped."""
        return x[self.kv_element(b, tirx.min(key, self.seq_kv - 1), hk, d)].astype("float32")

    def kv_element(self, b, key, hk, d) -> list:
        """K's or V's index of element (key, d) of key/value head hk (a kernel's copy takes its address)."""
        return list(kv_index(self.kv_layout, b, key, hk, d))

    @staticmethod
    def of(func: tirx.PrimFunc) -> AttentionSpec | None:
        attrs = func.attrs
        if attrs is None or attrs.get(KERNEL_ATTR) != "attention":
            return None
        q, k, v = func.params[:3]
        bias = func.params[3] if len(func.params) == 5 else None
        layout = str(attrs.get(KV_LAYOUT_ATTR, "BSNH"))
        seq_axis = 1 if layout == "BSNH" else 2
        return AttentionSpec(
            batch=static(q.shape[0]), seq_q=static(q.shape[1]), seq_kv=static(k.shape[seq_axis]),
            heads=int(q.shape[2]), kv_heads=int(k.shape[3 - seq_axis]), head_dim=int(q.shape[3]),
            head_dim_v=int(v.shape[3]), dtype=str(q.dtype),
            scale=float(attrs["tvmpipe.attention.scale"]), causal=str(attrs["tvmpipe.attention.causal"]),
            bias_shape=tuple(static(n) for n in bias.shape) if bias is not None else None,
            bias_dtype=str(bias.dtype) if bias is not None else None, kv_layout=layout,
        )


def _canonical(q: te.Tensor, k: te.Tensor, v: te.Tensor, bias: te.Tensor | None, scale: float, causal: str,
               layout: str):
    """The definition, in TE, with fp32 scores: what the fused kernels must reproduce."""
    batch, seq_q, heads, head_dim = q.shape
    _, seq_kv, kv_heads, head_dim_v = kv_index(layout, *v.shape)  # (the index permutation is its own inverse)
    group = int(heads) // int(kv_heads)
    f32 = "float32"
    d = te.reduce_axis((0, head_dim), "d")
    score = te.compute(
        (batch, heads, seq_q, seq_kv),
        lambda b, h, i, j: te.sum(q[b, i, h, d].astype(f32) * k[kv_index(layout, b, j, h // group, d)].astype(f32),
                                  axis=d),
        name="score",
    )

    def logit(b, h, i, j):
        x = score[b, h, i, j] * tirx.const(scale, f32)
        return x + bias[(*broadcast_index([static(n) for n in bias.shape], b, h, i), j)].astype(f32) if bias is not None else x

    offset = causal_offset(static(seq_q), static(seq_kv), causal)
    logits = te.compute(
        score.shape,
        lambda b, h, i, j: logit(b, h, i, j) if causal == "none"
        else tirx.Select(j <= i + offset, logit(b, h, i, j), tirx.const(-math.inf, f32)),
        name="logits",
    )
    row_max = topi.max(logits, axis=-1)
    e = te.compute(logits.shape, lambda b, h, i, j: tirx.exp(logits[b, h, i, j] - row_max[b, h, i]), name="e")
    row_sum = topi.sum(e, axis=-1)
    jj = te.reduce_axis((0, seq_kv), "j")
    acc = te.compute(
        (batch, seq_q, heads, head_dim_v),
        lambda b, i, h, c: te.sum(e[b, h, i, jj] * v[kv_index(layout, b, jj, h // group, c)].astype(f32), axis=jj),
        name="acc",
    )
    return te.compute(acc.shape, lambda b, i, h, c: (acc[b, i, h, c] / row_sum[b, h, i]).astype(q.dtype), name="out")


def canonical_attention(q, k, v, bias, scale: float, causal: str, layout: str = "BSNH") -> tirx.PrimFunc:
    """The canonical PrimFunc for these argument tensors (te placeholders; K and V in ``layout``), marked for the
    rule."""
    out = _canonical(q, k, v, bias, scale, causal, layout)
    args = [q, k, v] + ([bias] if bias is not None else []) + [out]
    attrs = {KERNEL_ATTR: "attention", "tvmpipe.attention.scale": scale, "tvmpipe.attention.causal": causal,
             "op_pattern": _OPAQUE}
    return te.create_prim_func(args).with_attrs(attrs if layout == "BSNH" else {**attrs, KV_LAYOUT_ATTR: layout})


def kernel_signature(spec, body) -> tirx.PrimFunc:
    """Wrap TVMScript macro ``body(q, k, v, bias, out)`` in a PrimFunc with the canonical function's signature."""
    H, HKV, D, DV, dtype = spec.heads, spec.kv_heads, spec.head_dim, spec.head_dim_v, spec.dtype
    batch, sq, skv, bias_shape, layout = spec.batch, spec.seq_q, spec.seq_kv, spec.bias_shape, spec.kv_layout
    if bias_shape is not None:

        @T.prim_func(private=True, s_tir=True)
        def attention(q_h: T.handle, k_h: T.handle, v_h: T.handle, b_h: T.handle, o_h: T.handle):
            q = T.match_buffer(q_h, (batch, sq, H, D), dtype)
            k = T.match_buffer(k_h, kv_index(layout, batch, skv, HKV, D), dtype)
            v = T.match_buffer(v_h, kv_index(layout, batch, skv, HKV, DV), dtype)
            bias = T.match_buffer(b_h, bias_shape, spec.bias_dtype)
            out = T.match_buffer(o_h, (batch, sq, H, DV), dtype)
            body(q, k, v, bias, out)

    else:

        @T.prim_func(private=True, s_tir=True)
        def attention(q_h: T.handle, k_h: T.handle, v_h: T.handle, o_h: T.handle):
            q = T.match_buffer(q_h, (batch, sq, H, D), dtype)
            k = T.match_buffer(k_h, kv_index(layout, batch, skv, HKV, D), dtype)
            v = T.match_buffer(v_h, kv_index(layout, batch, skv, HKV, DV), dtype)
            out = T.match_buffer(o_h, (batch, sq, H, DV), dtype)
            body(q, k, v, None, out)

    return attention


def by_query_rows(spec, most: int, few, many) -> tirx.PrimFunc:
    """One kernel of two bodies (TVMScript macros): ``few`` for at most ``most`` query rows, ``many`` for more, chosen
    per call (a model exported with a symbolic query length serves prompt and decoding steps alike)."""

    @T.macro
    def either(q, k, v, bias, out):
        if spec.seq_q <= most:
            few(q, k, v, bias, out)
        else:
            many(q, k, v, bias, out)

    return kernel_signature(spec, either)


def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """``relax.nn.attention[_bias]`` -> call_tir of the canonical attention PrimFunc."""
    attrs = call.attrs
    if attrs.window_size is not None:
        raise TvmpipeError("attention with a sliding window (window_size) is not supported")
    args = list(call.args)
    sinfo = [a.ty for a in args]
    q_shape, k_shape, v_shape = (s.shape.values for s in sinfo[:3])
    if not all(isinstance(n, tirx.IntImm) for n in (*q_shape[2:], *k_shape[2:], *v_shape[2:])):
        raise TvmpipeError("attention needs static head counts and head dims (only batch / sequence may vary)")
    heads, kv_heads, head_dim = int(q_shape[2]), int(k_shape[2]), int(q_shape[3])
    if heads % kv_heads or int(v_shape[2]) != kv_heads:
        raise TvmpipeError(f"attention: {heads} query heads cannot share {kv_heads} key/value heads")
    scale = float(attrs.scale.value) if attrs.scale is not None else 1.0 / math.sqrt(head_dim)
    causal = str(attrs.causal_mask) if attrs.causal_mask is not None else "none"

    def canonical(tensors: list, layout: str) -> tirx.PrimFunc:
        placeholders = [te.placeholder(x.ty.shape.values, x.ty.dtype, name) for x, name in zip(tensors, "qkvb")]
        return canonical_attention(*placeholders[:3], placeholders[3] if len(args) == 4 else None, scale, causal, layout)

    cache = _cache_sources(bb, args[1], args[2])
    func = canonical([args[0], *cache, *args[3:]], "BHSD") if cache is not None else None
    if func is not None and _reads_in_place(func):
        args[1:3] = cache  # K and V read where the KV cache holds them: their transposes go dead
    else:
        func = canonical(args, "BSNH")
    gvar = bb.add_func(func, "attention")
    out = relax.TensorType([*q_shape[:3], v_shape[3]], sinfo[0].dtype)
    return relax.call_tir(gvar, args, out)


def _cache_sources(bb: relax.BlockBuilder, k: relax.Expr, v: relax.Expr) -> list[relax.Expr] | None:
    """The [batch, heads, seq, dim] tensors that K and V were transposed from (both, each by a kernel that does only
    that: a legalised ``permute_dims(x, [0, 2, 1, 3])``); else None. A KV cache is held so (transformers), and
    transposing it every decoding step cost twice what the kernel spends reading it."""
    sources = []
    for x in (k, v):
        call = bb.lookup_binding(x) if isinstance(x, relax.Var) else None
        if not (isinstance(call, relax.Call) and call.op.same_as(tvm.ir.Op.get("relax.call_tir"))
                and len(call.args[1].fields) == 1):
            return None
        source = call.args[1].fields[0]
        if not isinstance(source.ty, relax.TensorType) or source.ty.ndim != 4:
            return None
        a = te.placeholder(source.ty.shape.values, source.ty.dtype, "x")
        swap = te.create_prim_func([a, topi.transpose(a, [0, 2, 1, 3])])
        if not tvm_ffi.structural_equal(bb.get()[call.args[0]].body, swap.body, map_free_vars=True):
            return None
        sources.append(source)
    return sources


def _reads_in_place(func: tirx.PrimFunc) -> bool:
    """Whether the target's kernel for ``func`` (K and V in a KV cache's layout) reads them so: the CPU kernels
    (through ``AttentionSpec.kv_at``) and the CUDA decode kernel (``kv_element``), for a query length known here."""
    target, spec = tvm.target.Target.current(allow_none=True), AttentionSpec.of(func)
    if target is None or spec is None:
        return False
    if target.kind.name == "cuda":
        from . import attention_cuda_decode

        return isinstance(spec.seq_q, int) and attention_cuda_decode.fits(spec, target)
    return target.kind.name == "llvm"


class Attention(ScheduleRule):
    """Swap the canonical attention function for the fused kernel of the target."""

    def apply(self, func: tirx.PrimFunc, target: tvm.target.Target, tunable: bool):
        spec = AttentionSpec.of(func)
        if spec is None:
            return None
        if target.kind.name == "cuda":
            from . import attention_cuda

            kernel = attention_cuda.kernel(spec, target)
        elif target.kind.name == "llvm":
            from . import attention_cpu_decode

            kernel = attention_cpu_decode.cpu_kernel(spec, target)
        else:  # another GPU API: the canonical function is left to the generic schedulers
            return None
        return tvm.s_tir.Schedule(kernel.with_attrs(dict(func.attrs)))
