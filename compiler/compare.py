"""Side-by-side checks against onnxruntime: same inputs, error metrics, and ORT's own latency."""

from __future__ import annotations

import time

import numpy as np

from .errors import TvmpipeError


def errors(ours: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> dict[str, float]:
    """Max abs error and max abs error relative to the reference's largest magnitude, over all outputs.

    The relative form is normwise (|a-b|max / |b|max) so that outputs near zero do not blow it up.
    """
    abs_err, rel_err = 0.0, 0.0
    for name, r in ref.items():
        a, r = np.asarray(ours[name], np.float64), np.asarray(r, np.float64)
        if a.shape != r.shape:
            raise TvmpipeError(f"output '{name}' has shape {a.shape}, onnxruntime gives {r.shape}")
        both_nan = np.isnan(a) & np.isnan(r)
        diff = np.where(both_nan, 0.0, np.abs(a - r))
        diff = np.where(np.isnan(diff), np.inf, diff)
        d = float(diff.max()) if diff.size else 0.0
        scale = float(np.nanmax(np.abs(r))) if r.size and not np.all(np.isnan(r)) else 0.0
        abs_err = max(abs_err, d)
        rel_err = max(rel_err, d / scale if scale > 0 else d)
    return {"max_abs_err": abs_err, "max_rel_err": rel_err}


class OrtSession:
    """onnxruntime on the CPU with a fixed thread count (default: all cores, as tvmpipe's cpu target)."""

    def __init__(self, model_path: str, threads: int | None = None):
        try:
            import onnxruntime as ort
        except ImportError:
            raise TvmpipeError("onnxruntime is not installed: pip install onnxruntime (or tvmpipe[dev])") from None
        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
        self.session = ort.InferenceSession(model_path, opts, providers=["CPUExecutionProvider"])
        self.output_names = [o.name for o in self.session.get_outputs()]

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self.output_names, self.session.run(None, inputs)))

    def time(self, inputs: dict[str, np.ndarray], repeat: int = 50, warmup: int = 5) -> list[float]:
        for _ in range(warmup):
            self.session.run(None, inputs)
        out = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            self.session.run(None, inputs)
            out.append((time.perf_counter() - t0) * 1e3)
        return out
