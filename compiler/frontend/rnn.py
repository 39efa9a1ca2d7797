"""ONNX LSTM / GRU / RNN as unrolled Relax graphs (upstream TVM 0.27 has no converter for them).

Shapes are static once the frontend has bound them, so each time step becomes a handful of Relax ops that
fuse well: the input projection X·Wᵀ + Wb is one matmul over all steps, leaving only H·Rᵀ per step. One
driver (``_convert``) owns everything the three ops share (layout, directions, initial states, the
activation list, ``sequence_lens`` masking, output assembly); each op only supplies its cell's step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from ..errors import TvmpipeError
from .registry import register_converter

Expr = relax.Expr
Act = Callable[[Expr], Expr]

# Activation name (lower case) -> (default alpha, default beta): None = the function takes no such value,
# nan = it takes one but ONNX defines no default (Affine and ScaledTanh are retired operators). The others
# default as the ONNX operators of the same name (onnxruntime differs for ThresholdedRelu: alpha 0, not 1).
_ACT_PARAMS: dict[str, tuple[float | None, float | None]] = {
    "sigmoid": (None, None), "tanh": (None, None), "relu": (None, None),
    "softsign": (None, None), "softplus": (None, None),
    "leakyrelu": (0.01, None), "thresholdedrelu": (1.0, None), "elu": (1.0, None),
    "hardsigmoid": (0.2, 0.5), "scaledtanh": (math.nan, math.nan), "affine": (math.nan, math.nan),
}


def _act(name: str, alpha: float | None, beta: float | None, clip: float | None, dtype: str) -> Act:
    """One ONNX RNN activation as an Expr -> Expr function; ``clip`` bounds its input."""
    op = relax.op

    def c(v: float) -> Expr:
        return relax.const(v, dtype)

    fns: dict[str, Act] = {
        "sigmoid": op.sigmoid,
        "tanh": op.tanh,
        "relu": op.nn.relu,
        "softsign": lambda x: x / (op.abs(x) + c(1.0)),
        "softplus": op.nn.softplus,
        "leakyrelu": lambda x: op.nn.leakyrelu(x, alpha),
        "thresholdedrelu": lambda x: op.where(op.greater(x, c(alpha)), x, c(0.0)),
        "elu": lambda x: op.where(op.greater(x, c(0.0)), x, c(alpha) * (op.exp(x) - c(1.0))),
        "hardsigmoid": lambda x: op.clip(c(alpha) * x + c(beta), 0.0, 1.0),
        "scaledtanh": lambda x: c(alpha) * op.tanh(c(beta) * x),
        "affine": lambda x: c(alpha) * x + c(beta),
    }
    fn = fns[name]
    return fn if clip is None else (lambda x: fn(op.clip(x, -clip, clip)))


@dataclass
class _Dir:
    """One direction's recurrent weights: Rᵀ split into the column groups its cell multiplies separately."""

    rt: list[Expr]  # [hidden, k*hidden] per group of the cell's ``r_groups``
    rb: Expr | None  # recurrent bias [gates*hidden], when the cell keeps it out of the input projection
    p: list[Expr] | None  # LSTM peepholes [hidden] each: i, o, f
    acts: list[Act]


class _Recurrent(OnnxOpConverter):
    """The shared driver; subclasses describe their cell."""

    gates: int  # gate blocks stacked in W, R and each half of B
    default_acts: tuple[str, ...]  # activations of one direction
    n_states: int = 1  # h, or h and c
    unclipped: tuple[int, ...] = ()  # activations (index within a direction) whose input ``clip`` leaves alone
    extra_inputs = ("initial_h",)  # inputs after sequence_lens (index 5 on)

    @classmethod
    def r_groups(cls, attr: dict) -> tuple[int, ...]:
        """How many gate blocks each separate H·Rᵀ product of a step covers."""
        return (cls.gates,)

    @classmethod
    def fold_rb(cls, attr: dict) -> bool:
        """Whether Rb may be added once, with Wb, to the input projection."""
        return True

    @classmethod
    def step(cls, bb: relax.BlockBuilder, x: Expr, state: list[Expr], w: _Dir, attr: dict) -> list[Expr]:
        """New state (h first) from x = Xt·Wᵀ + biases [batch, gates*hidden] and the previous state."""
        raise NotImplementedError

    @classmethod
    def _impl_v7(cls, bb, inputs, attr, params):  # covers opsets 7, 14 (adds layout) and 22 (adds bf16)
        return _convert(cls, bb, list(inputs), attr)


def _hr(bb: relax.BlockBuilder, h: Expr, rt: Expr, rb: Expr | None = None) -> Expr:
    """H·Rᵀ (+ Rb)."""
    out = relax.op.matmul(h, rt)
    return bb.emit(out if rb is None else out + rb)


def _chunks(bb: relax.BlockBuilder, x: Expr, n: int | list[int]) -> list[Expr]:
    """Split the last axis into n equal parts (or at the given indices)."""
    if n == []:  # one group: nothing to split
        return [x]
    parts = bb.emit(relax.op.split(x, n, axis=-1))
    return [bb.emit(relax.TupleGetItem(parts, k)) for k in range(len(parts.ty.fields))]


class RNN(_Recurrent):
    gates, default_acts = 1, ("Tanh",)

    @classmethod
    def step(cls, bb, x, state, w, attr):
        return [bb.emit(w.acts[0](x + _hr(bb, state[0], w.rt[0], w.rb)))]


class GRU(_Recurrent):
    gates, default_acts = 3, ("Sigmoid", "Tanh")

    @classmethod
    def r_groups(cls, attr):
        # linear_before_reset=0 multiplies (r ⊙ H) by R_h, so R_zr and R_h are separate products.
        return (3,) if attr.get("linear_before_reset", 0) else (2, 1)

    @classmethod
    def fold_rb(cls, attr):
        return not attr.get("linear_before_reset", 0)  # Rb_h is scaled by r when linear_before_reset=1

    @classmethod
    def step(cls, bb, x, state, w, attr):
        f, g = w.acts
        h = state[0]
        xz, xr, xh = _chunks(bb, x, 3)
        if attr.get("linear_before_reset", 0):
            hz, hr, hh = _chunks(bb, _hr(bb, h, w.rt[0], w.rb), 3)
            z, r = bb.emit(f(xz + hz)), bb.emit(f(xr + hr))
            cand = bb.emit(g(xh + r * hh))
        else:
            hz, hr = _chunks(bb, _hr(bb, h, w.rt[0]), 2)
            z, r = bb.emit(f(xz + hz)), bb.emit(f(xr + hr))
            cand = bb.emit(g(xh + _hr(bb, bb.emit(r * h), w.rt[1])))
        one = relax.const(1.0, x.ty.dtype)
        return [bb.emit((one - z) * cand + z * h)]


class LSTM(_Recurrent):
    gates, default_acts, n_states = 4, ("Sigmoid", "Tanh", "Tanh"), 2
    unclipped = (2,)  # clip bounds the gate inputs, not the cell state fed to h (as onnxruntime does)
    extra_inputs = ("initial_h", "initial_c", "P")

    @classmethod
    def step(cls, bb, x, state, w, attr):
        f, g, hact = w.acts
        h, c = state
        i, o, fg, cand = _chunks(bb, bb.emit(x + _hr(bb, h, w.rt[0])), 4)
        if w.p is not None:
            pi, po, pf = w.p
            i, fg = i + pi * c, fg + pf * c
        i = bb.emit(f(i))
        fg = bb.emit(relax.const(1.0, x.ty.dtype) - i if attr.get("input_forget", 0) else f(fg))
        c = bb.emit(fg * c + i * g(cand))
        o = bb.emit(f(o if w.p is None else o + po * c))
        return [bb.emit(o * hact(c)), c]


def _static_shape(e: Expr, what: str, where: str) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in e.ty.shape)
    except (TypeError, AttributeError):
        raise TvmpipeError(f"{where}: {what} has no static shape ({e.ty})") from None


def _activations(
    cls: type[_Recurrent], attr: dict, num_dir: int, clip: float | None, dtype: str, where: str
) -> list[list[Act]]:
    """Per-direction activation functions. alpha/beta values are consumed in order only by the functions that
    take them (as onnxruntime does); a function past the end of the list gets its default."""
    names = [n.decode() if isinstance(n, bytes) else n for n in attr.get("activations", cls.default_acts * num_dir)]
    per_dir = len(cls.default_acts)
    if len(names) != per_dir * num_dir:
        raise TvmpipeError(
            f"{where}: {len(names)} activations given, expected {per_dir * num_dir} ({per_dir} per direction)"
        )
    alphas, betas = list(attr.get("activation_alpha", ())), list(attr.get("activation_beta", ()))
    acts = []
    for k, name in enumerate(names):
        if name.lower() not in _ACT_PARAMS:
            raise TvmpipeError(f"{where}: unknown activation '{name}' (supported: {', '.join(sorted(_ACT_PARAMS))})")
        da, db = _ACT_PARAMS[name.lower()]
        alpha = None if da is None else (alphas.pop(0) if alphas else da)
        beta = None if db is None else (betas.pop(0) if betas else db)
        if (alpha is not None and math.isnan(alpha)) or (beta is not None and math.isnan(beta)):
            raise TvmpipeError(f"{where}: activation {name} needs its alpha and beta in activation_alpha/"
                               "activation_beta (ONNX defines no default for them)")
        acts.append(_act(name.lower(), alpha, beta, None if k % per_dir in cls.unclipped else clip, dtype))
    return [acts[d * per_dir:(d + 1) * per_dir] for d in range(num_dir)]


def _seq_lens(bb: relax.BlockBuilder, seq_lens: Expr | None, seq: int, where: str) -> Expr | None:
    """sequence_lens as int32 [batch, 1], or None when every sequence spans all ``seq`` steps (no masking)."""
    if seq_lens is None:
        return None
    if isinstance(seq_lens, tvm.ir.GenericConst):
        lens = seq_lens.value.numpy()
        if np.any(lens < 0) or np.any(lens > seq):
            raise TvmpipeError(f"{where}: sequence_lens {lens.tolist()} must lie in [0, {seq}]")
        if np.all(lens == seq):
            return None
    return bb.emit(relax.op.expand_dims(relax.op.astype(seq_lens, "int32"), 1))


def _convert(cls: type[_Recurrent], bb: relax.BlockBuilder, inputs: list, attr: dict) -> relax.Tuple:
    where = f"{cls.__name__} node '{attr.get('tvm_custom', {}).get('name') or '<unnamed>'}'"
    x, w, r, b, seq_lens, *rest = inputs + [None] * (5 + len(cls.extra_inputs) - len(inputs))
    extra = dict(zip(cls.extra_inputs, rest))
    direction = attr.get("direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    if direction not in ("forward", "reverse", "bidirectional"):
        raise TvmpipeError(f"{where}: unknown direction '{direction}'")
    batch_major = attr.get("layout", 0) == 1  # X [batch, seq, in], states [batch, num_dir, hidden]
    if batch_major:
        x = bb.emit(relax.op.permute_dims(x, [1, 0, 2]))
    seq, batch, _ = _static_shape(x, "X", where)
    num_dir, gh, hidden = _static_shape(r, "R", where)
    if num_dir != (2 if direction == "bidirectional" else 1) or gh != cls.gates * hidden:
        raise TvmpipeError(f"{where}: R has shape {[num_dir, gh, hidden]}, which does not fit "
                           f"direction='{direction}' with {cls.gates} gate(s)")
    if attr.get("hidden_size", hidden) != hidden:
        raise TvmpipeError(f"{where}: hidden_size={attr['hidden_size']} but R implies {hidden}")
    dtype = x.ty.dtype
    acts = _activations(cls, attr, num_dir, attr.get("clip"), dtype, where)
    lens = _seq_lens(bb, seq_lens, seq, where)
    fold = cls.fold_rb(attr)
    r_split = [int(k) * hidden for k in np.cumsum(cls.r_groups(attr))[:-1]]

    def pick(e: Expr | None, i: int, axis: int = 0) -> Expr | None:
        """e[i] along ``axis`` (a static slice: take() would be a gather)."""
        if e is None:
            return None
        return bb.emit(relax.op.squeeze(relax.op.strided_slice(e, [axis], [i], [i + 1]), [axis]))

    ys, finals = [], []
    for d in range(num_dir):
        wb, rb = _chunks(bb, pick(b, d), 2) if b is not None else (None, None)
        proj = relax.op.matmul(x, relax.op.permute_dims(pick(w, d)))  # all steps at once: [seq, batch, gates*hidden]
        proj = bb.emit(proj if wb is None else proj + (wb + rb if fold else wb))
        p = pick(extra.get("P"), d)
        weights = _Dir(_chunks(bb, bb.emit(relax.op.permute_dims(pick(r, d))), r_split), None if fold else rb,
                       None if p is None else _chunks(bb, p, 3), acts[d])
        state = [pick(extra.get(n), d, axis=1 if batch_major else 0) for n in ("initial_h", "initial_c")[:cls.n_states]]
        state = [bb.emit(relax.op.zeros((batch, hidden), dtype)) if s is None else s for s in state]
        y: list[Expr] = [None] * seq
        for t in range(seq - 1, -1, -1) if direction == "reverse" or d == 1 else range(seq):
            new = cls.step(bb, pick(proj, t), state, weights, attr)
            if lens is None:
                state, y[t] = new, new[0]
            else:  # outside a sequence's length its state is carried over and its output is zero
                live = bb.emit(relax.op.less(relax.const(t, "int32"), lens))
                state = [bb.emit(relax.op.where(live, n, s)) for n, s in zip(new, state)]
                y[t] = bb.emit(relax.op.where(live, new[0], relax.const(0.0, dtype)))
        ys.append(bb.emit(relax.op.stack(y, axis=0)))
        finals.append(state)

    if lens is not None:  # a zero-length sequence has zero final states (as in onnxruntime), not the initial ones
        some = bb.emit(relax.op.greater(lens, relax.const(0, "int32")))
        finals = [[bb.emit(relax.op.where(some, s, relax.const(0.0, dtype))) for s in f] for f in finals]
    out_y = bb.emit(relax.op.stack(ys, axis=1))  # [seq, num_dir, batch, hidden]
    # [num_dir, batch, hidden] each
    outs = [bb.emit(relax.op.stack([f[k] for f in finals], axis=0)) for k in range(cls.n_states)]
    if batch_major:
        out_y = bb.emit(relax.op.permute_dims(out_y, [2, 0, 1, 3]))
        outs = [bb.emit(relax.op.permute_dims(o, [1, 0, 2])) for o in outs]
    return relax.Tuple([out_y, *outs])


for _cls in (RNN, GRU, LSTM):
    register_converter("", _cls.__name__, _cls)
