"""Converters tvmpipe adds to (or overrides in) the Relax ONNX frontend, keyed by (domain, op_type).

A converter is an ``OnnxOpConverter`` subclass (``_impl_vN`` classmethods, the frontend's own shape) or any
callable ``(bb, inputs, attrs, params) -> relax.Expr``. The LSTM/GRU/RNN converters and user plug-ins
register here; ``frontend.load`` consults this table before the built-in map.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import TvmpipeError

Converter = Any  # OnnxOpConverter subclass or callable(bb, inputs, attrs, params)

_CONVERTERS: dict[tuple[str, str], Converter] = {}


def _norm(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def register_converter(domain: str, op_type: str, converter: Converter, *, override: bool = False) -> None:
    key = (_norm(domain), op_type)
    if key in _CONVERTERS and not override and _CONVERTERS[key] is not converter:
        qual = f"{domain}::{op_type}" if key[0] else op_type
        raise TvmpipeError(f"a converter for {qual} is already registered ({_CONVERTERS[key]!r})")
    _CONVERTERS[key] = converter


def lookup(domain: str, op_type: str) -> Converter | None:
    return _CONVERTERS.get((_norm(domain), op_type))


def as_function(converter: Converter, opset: int) -> Callable:
    """The callable for this opset: ``get_converter(opset)`` for frontend-style classes."""
    get = getattr(converter, "get_converter", None)
    return get(opset) if get is not None else converter
