"""A/B of the model zoo's GPU rows: this checkout's packages against the same models compiled by another checkout
("old": an archive of the commit before a change), checked against each other and timed side by side on the GPU
machine. The GPU counterpart of ``cpu_ab.py``. Run after ``benchmarks/models.py --target cuda-sm90 --variants ...``
(which exports the ONNX files, compiles this checkout's packages into ``build/zoo/`` and times them against torch)::

    git archive <commit> compiler schedules targets benchmarks tuning_logs pyproject.toml | tar -x -C build/old  # here
    python3 benchmarks/gpu_ab.py build/old OUT.json gpt2:32:fp16 ...                                        # there

The old checkout compiles each variant from the same ONNX file (``benchmarks.common.compile_with``); both packages run
the same inputs (outputs compared), then 7 interleaved rounds of 20 calls each, in random order.
"""

import json
import random
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.common import compile_with, interleaved  # noqa: E402
from benchmarks.models import MODELS, onnx_path, package_path  # noqa: E402
from compiler.runtime import load  # noqa: E402
from tests.helpers import rel_err  # noqa: E402


def compile_old(root: Path, model: str, batch: int, precision: str) -> Path:
    """The variant's package compiled by the checkout at ``root`` from this checkout's ONNX file, beside its package."""
    new = package_path(model, batch, "cuda-sm90", precision, True)
    old = new.with_name(f"{new.stem}-old{new.suffix}")
    compile_with(root, onnx_path(model, batch), old, "cuda-sm90", precision=precision, cuda_graph=True)
    return old


def main(old_root: Path, out: Path, variants: list[str], rounds: int = 7, calls: int = 20) -> None:
    parsed = [(m, int(b), p) for m, b, p in (v.split(":") for v in variants)]
    with ThreadPoolExecutor(len(parsed)) as pool:  # the compiles run in their own processes
        olds = list(pool.map(lambda v: compile_old(old_root.resolve(), *v), parsed))
    records = []
    for (model, batch, precision), old_pkg in zip(parsed, olds):
        new = load(package_path(model, batch, "cuda-sm90", precision, True))
        old = load(old_pkg)
        x = MODELS[model].example(batch)
        a, b = new(**x), old(**x)
        diff = max(rel_err(a[k], b[k]) for k in a)
        ms = interleaved({"new": lambda: new.time(x, repeat=calls, warmup=3).ms,
                          "old": lambda: old.time(x, repeat=calls, warmup=3).ms}, rounds,
                         order=lambda _: random.sample(["new", "old"], 2), pause=lambda: None)
        per_round = [np.median(ms["old"][i * calls:(i + 1) * calls]) / np.median(ms["new"][i * calls:(i + 1) * calls])
                     for i in range(rounds)]
        rec = {"model": model, "batch": batch, "precision": precision,
               "new_ms": float(np.median(ms["new"])), "old_ms": float(np.median(ms["old"])),
               "new_vs_old_per_round": [round(float(r), 4) for r in per_round],
               "new_vs_old": float(np.median(per_round)), "max_rel_diff_new_old": float(diff)}
        print(f"{model} b{batch} {precision}: new {rec['new_ms']:.3f} ms, old {rec['old_ms']:.3f} ms, "
              f"new/old {rec['new_vs_old']:.3f}x (rounds {min(per_round):.3f}-{max(per_round):.3f}), "
              f"outputs differ by {diff:.1e}", flush=True)
        records.append(rec)
        out.write_text(json.dumps(records, indent=1))
        del new, old


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:])
