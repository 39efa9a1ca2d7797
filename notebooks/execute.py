"""Re-execute the notebooks in place, so the outputs committed with them come from a real run.

    python notebooks/execute.py                     # every notebooks/NN_*.ipynb
    python notebooks/execute.py notebooks/06_*.ipynb

CI runs the same notebooks without writing them back (``make test`` passes ``--nbmake notebooks``). Here
nbclient runs each one top to bottom in a fresh kernel started in ``notebooks/`` (as nbmake does), with
the defaults of its ``parameters`` cell. Then PNG figures are re-encoded to a small palette and outputs
are held to a size budget, so the files read well on a web viewer and stay small in git: an output over
budget fails here, to be trimmed in the notebook itself rather than silently cut.
"""

from __future__ import annotations

import argparse
import base64
import io
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from PIL import Image

HERE = Path(__file__).resolve().parent
MAX_TEXT = 12_000  # characters of one text output (an IR dump that long is a wall, not a lesson)
MAX_PNG = 120_000  # bytes of one figure after re-encoding
MAX_FILE = 600_000  # bytes of one notebook file


def shrink_png(data: str) -> str:
    """A base64 PNG re-encoded with a 64-colour palette when that is smaller (charts have few colours)."""
    raw = base64.b64decode(data)
    out = io.BytesIO()
    Image.open(io.BytesIO(raw)).convert("RGB").quantize(64).save(out, "PNG", optimize=True)
    return base64.b64encode(out.getvalue()).decode() if out.tell() < len(raw) else data


def tidy(nb: nbformat.NotebookNode, name: str) -> list[str]:
    """Shrink figures in place; return what is over budget."""
    problems = []
    for k, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if "image/png" in data:
                data["image/png"] = shrink_png(data["image/png"])
                if len(data["image/png"]) * 3 // 4 > MAX_PNG:
                    problems.append(f"{name} cell {k}: a figure of {len(data['image/png']) * 3 // 4} bytes")
            text = out.get("text", "") + "".join(v for m, v in data.items() if m.startswith("text/"))
            if len(text) > MAX_TEXT:
                problems.append(f"{name} cell {k}: an output of {len(text)} characters")
    return problems


def execute(path: Path) -> float:
    """Run one notebook in place; return its wall time in seconds."""
    nb = nbformat.read(path, as_version=4)
    t0 = time.perf_counter()
    NotebookClient(nb, timeout=600, kernel_name="python3", record_timing=False).execute(cwd=str(path.parent))
    secs = time.perf_counter() - t0
    problems = tidy(nb, path.name)
    text = nbformat.writes(nb) + "\n"
    if len(text) > MAX_FILE:
        problems.append(f"{path.name}: {len(text)} bytes in all")
    if problems:
        raise SystemExit("over the output budget (trim these in the notebook):\n  " + "\n  ".join(problems))
    nbformat.validate(nb)
    path.write_text(text)
    return secs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="*", type=Path, help="default: notebooks/[0-9][0-9]_*.ipynb")
    paths = ap.parse_args(argv).notebooks or sorted(HERE.glob("[0-9][0-9]_*.ipynb"))
    total = 0.0
    for p in paths:
        secs = execute(p.resolve())
        total += secs
        print(f"{p.name}: {secs:.1f} s", flush=True)
    print(f"total: {total:.1f} s for {len(paths)} notebooks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
