"""The committed notebooks carry the outputs of one clean top-to-bottom run (``execute.py``), within budget.

``make test`` also executes every notebook (``--nbmake``); this checks what a reader sees on a web viewer
without running anything: a stripped, half-run or failed notebook must not be committed.
"""

from pathlib import Path

import nbformat
import pytest

from execute import MAX_FILE, tidy

NOTEBOOKS = sorted(Path(__file__).resolve().parent.glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_committed_from_one_clean_run(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "parameters" in code[0].metadata.get("tags", []), "the first code cell must be tagged 'parameters'"
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), (
        "cells not run once, in order, in one kernel: run python notebooks/execute.py"
    )
    errors = [k for k, c in enumerate(nb.cells) for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, f"error outputs in cells {errors}"
    assert tidy(nb, path.name) == [] and path.stat().st_size <= MAX_FILE
