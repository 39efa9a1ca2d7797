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


def test_report_names_rows_of_other_code(tmp_path):
    """Rows measured with other sources than the checkout's (or before the digest was recorded) are listed."""
    now = zoo.code_digest()
    zoo.save([{**_gpu("resnet50", 1, "fp32", 1, 2, 2), "code": now}, _gpu("gpt2", 32, "fp16", 1, 1, 1)], "h", {}, tmp_path)
    assert f"(this checkout's when the table was written: {now}): this checkout: resnet50 b1 fp32; not recorded: gpt2 b32 fp16." in zoo.report(tmp_path)
    zoo.save([{**_gpu("gpt2", 32, "fp16", 1, 1, 1), "code": now}], "h", {}, tmp_path)
    assert f"All rows measured with this checkout's code ({now})." in zoo.report(tmp_path)


def test_code_digest_follows_the_sources(tmp_path, monkeypatch):
    (tmp_path / "compiler").mkdir()
    (tmp_path / "compiler" / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(zoo, "REPO", tmp_path)
    before = zoo.code_digest()
    assert zoo.code_digest() == before
    (tmp_path / "compiler" / "a.py").write_text("x = 2\n")
    assert zoo.code_digest() != before


def test_variants_parse_and_reject(capsys):
    assert zoo._variant("gpt2:32:fp16") == ("gpt2", 32, "fp16")
    with pytest.raises(SystemExit):
        zoo.main(["--target", "cuda-sm90", "--variants", "gpt3:32:fp16"])
    assert "'gpt3:32:fp16' is not MODEL:BATCH:PRECISION" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        zoo.main(["--target", "cpu", "--variants", "gpt2:1:fp32"])
    assert "use them with --target cuda-sm90" in capsys.readouterr().err


def test_stale_rows(tmp_path):
    """The rows of other (or unrecorded) code, of the chosen models only."""
    zoo.save([{**_gpu("gpt2", 1, "fp32", 1, 1, 1), "code": "new"}, {**_gpu("gpt2", 32, "fp16", 1, 1, 1), "code": "old"},
              _gpu("resnet50", 1, "fp16", 1, 1, 1), _gpu("bert_base", 1, "fp32", 1, 1, 1)], "h", {}, tmp_path)
    path = tmp_path / "models-h.json"
    assert zoo.stale_rows(path, ["gpt2", "resnet50"], "new") == [("resnet50", 1, "fp16"), ("gpt2", 32, "fp16")]
    assert zoo.stale_rows(tmp_path / "none.json", ["gpt2"], "new") == []


def test_report_sets_a_second_run_beside_the_table(tmp_path):
    """results/rerun/ holds a second run: the report lists each row's two latencies and speedups."""
    rows = [{**_gpu("resnet50", 1, "fp32", 2.0, 4, 3), "code": "c1"}, {**_gpu("gpt2", 32, "fp16", 1.0, 1, 1), "code": "c1"}]
    zoo.save(rows, "h", {}, tmp_path)
    assert "Second run" not in zoo.report(tmp_path)
    again = [{**_gpu("resnet50", 1, "fp32", 2.2, 4, 3.3), "code": "c1"}, {**_gpu("gpt2", 32, "fp16", 0.95, 1, 1), "code": "c2"}]
    zoo.save(again, "h", {}, tmp_path / zoo.RERUN)
    table = zoo.report(tmp_path)
    assert "| resnet50 | 1 | fp32 | 2.000 | 2.200 | +10.0% | 1.50x | 1.50x | yes |" in table
    assert "| gpt2 | 32 | fp16 | 1.000 | 0.950 | -5.0% | 1.00x | 1.05x | no |" in table
    assert "| same code |\n|---|---|---|---|---|---|---|---|---|\n| resnet50 |" in table
    assert "2 rows (all correct); tvmpipe's latency changed by 7.5% (median) and at most 10.0%" in table
    assert f"geomean vs torch.compile {zoo.geomean([1.5, 1.0]):.2f}x in the table" in table
    zoo.save([{**again[1], "correct": False}], "h", {}, tmp_path / zoo.RERUN)
    assert "2 rows (NOT correct: gpt2 b32 fp16)" in zoo.report(tmp_path)


def test_merge_keeps_when_the_rows_were_measured(tmp_path):
    run = zoo.save([_gpu("gpt2", 1, "fp32", 2, 4, 3)], "h", {"gpu": "t"}, tmp_path / "device", "2026-01-02T03:04:05+00:00")
    assert zoo.main(["--merge", str(run), "--out", str(tmp_path / "rerun")]) == 0
    doc = json.loads((tmp_path / "rerun" / "models-h.json").read_text())
    assert doc["updated"] == "2026-01-02T03:04:05+00:00" and doc["records"][0]["tvmpipe_ms"] == 2


def test_second_run_compares_builds_where_recorded(tmp_path):
    """Rows that record the compiled library's digest are the same code when it matches, whatever the sources'."""
    zoo.save([{**_gpu("gpt2", 1, "fp32", 2.0, 4, 3), "code": "c1", "build": "b1"},
              {**_gpu("gpt2", 32, "fp16", 1.0, 1, 1), "code": "c1", "build": "b1"}], "h", {}, tmp_path)
    zoo.save([{**_gpu("gpt2", 1, "fp32", 2.0, 4, 3), "code": "c2", "build": "b1"},
              {**_gpu("gpt2", 32, "fp16", 1.0, 1, 1), "code": "c1", "build": "b2"}], "h", {}, tmp_path / zoo.RERUN)
    table = zoo.report(tmp_path)
    assert "| gpt2 | 1 | fp32 | 2.000 | 2.000 | +0.0% | 1.50x | 1.50x | yes |" in table
    assert "| gpt2 | 32 | fp16 | 1.000 | 1.000 | +0.0% | 1.00x | 1.00x | no |" in table


def test_build_digest_is_the_compiled_library(capsys, tmp_path):
    """Compiling the same model twice gives the same digest (the manifest's timestamp is left out); another
    model gives another."""
    from onnx import TensorProto, helper

    from tests.helpers import make_model, run_cli, save

    digests = []
    for op in ("Relu", "Relu", "Sigmoid"):
        model = make_model([helper.make_node(op, ["x"], ["y"])], [("x", TensorProto.FLOAT, [3, 5])],
                           [("y", TensorProto.FLOAT, [3, 5])])
        src, pkg = save(model, tmp_path / f"{op}.onnx"), tmp_path / f"{op}-{len(digests)}.tvmpkg"
        assert run_cli(capsys, "compile", src, "--target", "cpu", "-o", pkg).code == 0
        digests.append(zoo.build_digest(pkg))
    assert digests[0] == digests[1] != digests[2]
