"""benchmarks/models.py bookkeeping: merging partial runs and the report (no torch, no models needed)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("zoo", Path(__file__).parent.parent / "benchmarks" / "models.py")
zoo = sys.modules["zoo"] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
spec.loader.exec_module(zoo)


def _gpu(model: str, batch: int, precision: str, ours: float, eager: float, compiled: float) -> dict:
    return {"model": model, "target": "cuda-sm90", "batch": batch, "precision": precision, "tvmpipe_ms": ours,
            "torch_eager_ms": eager, "torch_compile_ms": compiled, "speedup_vs_torch_eager": eager / ours,
            "speedup_vs_torch_compile": compiled / ours, "correct": True, "max_rel_err": 1e-4}


def test_partial_runs_merge(tmp_path):
    env = {"gpu": "test"}
    zoo.save([_gpu("gpt2", 1, "fp32", 2, 4, 3), _gpu("resnet50", 1, "fp32", 1, 2, 2)], "x", env, tmp_path)
    path = zoo.save([_gpu("resnet50", 1, "fp32", 4, 2, 2), _gpu("resnet50", 32, "fp16", 1, 1, 1)], "x", env, tmp_path)
    rows = json.loads(path.read_text())["records"]
    assert [(r["model"], r["batch"], r["tvmpipe_ms"]) for r in rows] == [("resnet50", 1, 4), ("resnet50", 32, 1), ("gpt2", 1, 2)]


def test_report_table_and_geomean(tmp_path):
    zoo.save([_gpu("resnet50", 1, "fp32", 1, 4, 2), _gpu("bert_base", 1, "fp32", 2, 2, 8)], "h", {"gpu": "t"}, tmp_path)
    failed = {"model": "gpt2", "target": "cpu", "batch": 1, "precision": "fp32", "correct": False, "error": "boom"}
    zoo.save([failed], "c", {"cpu": "t"}, tmp_path)
    table = zoo.report(tmp_path)
    assert "| resnet50 | 1 | fp32 | 1.000 | 4.000 | 2.000 | 4.00x | 2.00x | yes (1.0e-04) |" in table
    assert "Geomean speedup (2 rows): vs torch eager 2.00x, vs torch.compile 2.83x." in table
    assert "NO: boom" in table
    assert (tmp_path / "models.png").stat().st_size > 1000


def test_geomean():
    assert zoo.geomean([1.0, 4.0]) == pytest.approx(2.0)
