"""Custom operator plug-ins: compile an ONNX op tvmpipe does not know, without forking tvmpipe.

A plug-in is a Python file that calls ``register_op`` (``compiler.register_op``) for each op it adds:

    register_op("my.ops", "RMSNorm", shape=rmsnorm_shape, compute=rmsnorm_te, schedule={"cuda": sched})

* ``shape(input_shapes, input_dtypes, attrs) -> [(shape, dtype), ...]`` declares the node's outputs; the
  compute's actual outputs are checked against it, so a wrong compute fails at compile time, by name.
* ``compute(*te_tensors, **attrs) -> te.Tensor | tuple`` is a TE compute; it becomes a ``call_tir``
  to a PrimFunc named ``plugin_<OpType>`` that carries the attr ``tvmpipe.plugin = "domain::OpType"``.
* ``schedule`` (optional) maps a target kind ("cpu", "cuda") to ``fn(sch: tvm.s_tir.Schedule) -> None``,
  applied to that PrimFunc in the schedule stage (``PluginSchedule``). An op with a schedule is marked
  opaque to FuseOps, so it stays its own kernel and the schedule sees exactly the blocks ``compute``
  made; an op without one fuses with its neighbours like any TVM op and DLight / the default lowering
  schedule the fused kernel (as they do for a target the op has no schedule for).

The kernel is compiled into the package's ``model.so`` like every other kernel, so loading a package
never needs the plug-in. ``--no-custom-schedules`` turns plug-in schedules off too.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tvm
from tvm.s_tir.dlight import ScheduleRule

from .errors import TvmpipeError, summary

ATTR = "tvmpipe.plugin"  # PrimFunc attr: the qualified op name whose schedule applies
TARGET_KINDS = {"cpu": "llvm", "cuda": "cuda"}  # schedule key -> TVM target kind
_OPAQUE = 8  # relax OpPatternKind.kOpaque: FuseOps never fuses such a PrimFunc


def _origin(fn: Callable) -> str:
    """Where a function was defined: two registrations from one place are the same plug-in re-loaded."""
    code = getattr(fn, "__code__", None)
    return f"{code.co_filename}:{code.co_firstlineno}" if code else repr(fn)


@dataclass(frozen=True)
class PluginOp:
    """One registered op: the user's functions and where they came from."""

    domain: str
    op_type: str
    shape: Callable
    compute: Callable
    schedule: dict[str, Callable] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.domain}::{self.op_type}" if self.domain else self.op_type

    @property
    def origin(self) -> str:
        return _origin(self.compute)

    def convert(self, bb, inputs: list, attrs: dict, params) -> Any:
        """The registry converter: emit ``call_tir`` of the compute, checked against ``shape``."""
        node = attrs.get("tvm_custom", {}).get("name") or "<unnamed>"
        where = f"plug-in op {self.name} (node '{node}')"
        user_attrs = {k: _python_value(v) for k, v in attrs.items() if k != "tvm_custom"}
        shapes, dtypes = [], []
        for k, x in enumerate(inputs):
            if x is None:
                shapes.append(None)
                dtypes.append(None)
                continue
            try:
                shapes.append(tuple(int(d) for d in x.ty.shape))
                dtypes.append(str(x.ty.dtype))
            except (AttributeError, TypeError):
                raise TvmpipeError(f"{where}: input {k} is not a tensor of static shape ({x.ty})") from None
        try:
            declared = [(tuple(int(d) for d in s), str(t)) for s, t in self.shape(shapes, dtypes, dict(user_attrs))]
        except Exception as err:
            raise TvmpipeError(f"{where}: shape() failed: {type(err).__name__}: {err}") from err
        try:
            out = bb.emit_te(
                lambda *tensors: self.compute(*tensors, **user_attrs),
                *inputs,
                primfunc_name_hint="plugin_" + re.sub(r"\W", "_", self.op_type),
                primfunc_attrs={ATTR: self.name, **({"op_pattern": _OPAQUE} if self.schedule else {})},
            )
        except Exception as err:
            raise TvmpipeError(f"{where}: compute() failed: {type(err).__name__}: {err}") from err
        fields = list(out.ty.fields) if isinstance(out.ty, tvm.relax.TupleType) else [out.ty]
        actual = [(tuple(int(d) for d in f.shape), str(f.dtype)) for f in fields]
        if actual != declared or len(actual) < attrs["tvm_custom"]["num_outputs"]:
            show = lambda outs: ", ".join(f"{t}{list(s)}" for s, t in outs)  # noqa: E731
            raise TvmpipeError(
                f"{where}: shape() declares outputs [{show(declared)}] but compute() produced [{show(actual)}]"
                f" (the node has {attrs['tvm_custom']['num_outputs']} output(s))"
            )
        return out


def _python_value(v: Any) -> Any:
    """ONNX attribute values as a plug-in author expects them: str for bytes, numpy for tensors."""
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, tuple):
        return tuple(_python_value(x) for x in v)
    from onnx import TensorProto, numpy_helper

    return numpy_helper.to_array(v) if isinstance(v, TensorProto) else v


_OPS: dict[str, PluginOp] = {}
_registered = 0  # register_op calls so far (to notice a plug-in file that registers nothing)


def register_op(
    domain: str,
    op_type: str,
    *,
    shape: Callable,
    compute: Callable | None = None,
    schedule: dict[str, Callable] | None = None,
    override: bool = False,
):
    """Teach tvmpipe an ONNX op; without ``compute`` this is a decorator for the compute function.

    Registering a (domain, op_type) already registered from another function, or an op tvmpipe already
    converts (an ONNX op in the default domain, say), is an error unless ``override=True``.
    """
    if compute is None:

        def decorate(fn: Callable) -> Callable:
            register_op(domain, op_type, shape=shape, compute=fn, schedule=schedule, override=override)
            return fn

        return decorate
    from .frontend import registry
    from .frontend.importer import is_supported

    global _registered
    domain = "" if domain == "ai.onnx" else domain
    op = PluginOp(domain, op_type, shape, compute, dict(schedule or {}))
    if not (callable(shape) and callable(compute)):
        raise TvmpipeError(f"register_op({op.name!r}): shape and compute must be functions")
    bad = sorted(set(op.schedule) - set(TARGET_KINDS))
    if bad or not all(callable(f) for f in op.schedule.values()):
        raise TvmpipeError(
            f"register_op({op.name!r}): schedule must map target kinds {sorted(TARGET_KINDS)} to functions"
            + (f" (unknown: {', '.join(bad)})" if bad else "")
        )
    prev = _OPS.get(op.name)
    if not override and is_supported(domain, op_type) and (prev is None or prev.origin != op.origin):
        if prev is not None:
            raise TvmpipeError(
                f"plug-in op {op.name} is already registered by {prev.origin}; {op.origin} registers it again: "
                "rename one of them, or pass override=True to register_op to replace it"
            )
        raise TvmpipeError(
            f"{op.name} is an op tvmpipe already converts; pass override=True to register_op to replace "
            "its converter with this plug-in"
        )
    registry.register_converter(domain, op_type, op.convert, override=True)
    _OPS[op.name] = op
    _registered += 1
    return op


def load_plugin(path: str | Path) -> dict:
    """Import a plug-in file (it registers its ops); return its record for the package manifest."""
    p = Path(path)
    if not p.is_file():
        raise TvmpipeError(f"plug-in file not found: {path}")
    data = p.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    name = "tvmpipe_plugin_" + re.sub(r"\W", "_", p.stem) + "_" + sha[:12]
    spec = importlib.util.spec_from_file_location(name, p)
    if spec is None or spec.loader is None:
        raise TvmpipeError(f"plug-in {path} is not a Python file (.py)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling inside the plug-in look their module up there
    before = _registered
    try:
        spec.loader.exec_module(module)
    except TvmpipeError as err:
        del sys.modules[name]
        raise TvmpipeError(f"plug-in {path}: {err}") from err
    except Exception as err:
        del sys.modules[name]
        first = (str(err).strip().splitlines() or [""])[0]
        raise TvmpipeError(f"plug-in {path} failed to import: {type(err).__name__}: {first}") from err
    if _registered == before:
        warnings.warn(f"plug-in {path} registered no ops (it should call compiler.register_op)")
    return {"file": p.name, "sha256": sha}


def _unbound_blocks(sch) -> list[str]:
    """Blocks of a GPU kernel outside every thread binding: they would run on the host, on device memory
    (the build does not refuse that: the kernel would crash at run time)."""
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    bound = lambda b: any(sch.get(loop).kind == tvm.tirx.ForKind.THREAD_BINDING for loop in sch.get_loops(b))  # noqa: E731
    return [sch.get(b).name_hint for b in blocks if not bound(b)]


class PluginSchedule(ScheduleRule):
    """Plug-in kernels get the user's schedule for this target kind, if they gave one (offered first by
    ``compiler.schedules``)."""

    def apply(self, func: tvm.tirx.PrimFunc, target: tvm.target.Target, tunable: bool) -> tvm.s_tir.Schedule | None:
        name = func.attrs.get(ATTR) if func.attrs is not None else None
        op = _OPS.get(str(name)) if name is not None else None
        kind = next((k for k, v in TARGET_KINDS.items() if v == target.kind.name), None)
        fn = op.schedule.get(kind) if op is not None else None
        if fn is None:
            return None
        what = f"the {kind} schedule of plug-in op {op.name} ({_origin(fn)})"
        sch = tvm.s_tir.Schedule(func)
        try:
            fn(sch)
        except Exception as err:
            raise TvmpipeError(f"{what} failed: {summary(err)}") from err
        unbound = _unbound_blocks(sch) if kind == "cuda" else []
        if unbound:
            raise TvmpipeError(
                f"{what} leaves block(s) {', '.join(map(repr, unbound))} outside any blockIdx/threadIdx loop: "
                "bind their loops (sch.bind) so they run on the GPU"
            )
        return sch
