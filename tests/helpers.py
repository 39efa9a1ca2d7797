"""Shared test helpers: build small ONNX models, run onnxruntime, drive the CLI in-process."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from compiler.cli import main


def make_model(
    nodes: list[onnx.NodeProto],
    inputs: list[tuple[str, int, list]],
    outputs: list[tuple[str, int, list | None]],
    initializers: dict[str, np.ndarray] | None = None,
    opset: int = 17,
    extra_opsets: dict[str, int] | None = None,
) -> onnx.ModelProto:
    """A checked model from nodes; inputs/outputs as (name, TensorProto elem type, shape)."""
    graph = helper.make_graph(
        nodes,
        "test",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        [numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()],
    )
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8 if opset < 21 else 10
    return model


def save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, path)
    return path


def ort_run(model_path: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, inputs)))


@dataclass
class CliResult:
    code: int
    out: str
    err: str


def run_cli(capsys, *args: str) -> CliResult:
    """Run ``tvmpipe ARGS`` in this process (as the console script does) and capture its output."""
    capsys.readouterr()
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return CliResult(code, captured.out, captured.err)


def rel_err(ours: np.ndarray, ref: np.ndarray) -> float:
    """max |ours - ref| / max |ref| (normwise), in float64."""
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(ours - ref).max() / max(np.abs(ref).max(), 1e-30))


def compile_and_compare(
    capsys, tmp_path: Path, model: onnx.ModelProto, inputs: dict[str, np.ndarray],
    shapes: dict[str, tuple] | None = None, target: str = "cpu", extra_args: tuple[str, ...] = (),
    reference: onnx.ModelProto | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Save, compile with the CLI, run with the CLI, and return (ours, onnxruntime's) outputs.

    ``reference``: an equivalent model for onnxruntime to run instead, where it lacks a feature of ``model``."""
    src = save(model, tmp_path / "model.onnx")
    pkg = tmp_path / "model.tvmpkg"
    shape_args = [a for n, s in (shapes or {}).items() for a in ("--input-shape", f"{n}:{'x'.join(map(str, s))}")]
    r = run_cli(capsys, "compile", src, "--target", target, "-o", pkg, *shape_args, *extra_args)
    assert r.code == 0, r.err
    np.savez(tmp_path / "in.npz", **inputs)
    r = run_cli(capsys, "run", pkg, "--inputs", tmp_path / "in.npz", "--outputs", tmp_path / "out.npz")
    assert r.code == 0, r.err
    with np.load(tmp_path / "out.npz") as f:
        ours = {k: f[k] for k in f.files}
    return ours, ort_run(src if reference is None else save(reference, tmp_path / "reference.onnx"), inputs)


def with_manifest(pkg: Path, out: Path, edit: Callable[[dict], None]) -> Path:
    """A copy of package ``pkg`` at ``out`` whose manifest ``edit`` changed in place (the other members as they are)."""
    with zipfile.ZipFile(pkg) as zin, zipfile.ZipFile(out, "w") as zout:
        manifest = json.loads(zin.read("manifest.json"))
        edit(manifest)
        for name in zin.namelist():
            zout.writestr(name, json.dumps(manifest) if name == "manifest.json" else zin.read(name))
    return out
