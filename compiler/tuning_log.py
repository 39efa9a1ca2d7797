"""A tuning log directory: MetaSchedule's JSON database, read defensively, locked while a job writes it.

MetaSchedule keeps two files of one JSON value per line: ``database_workload.json`` (the kernels) and
``database_tuning_record.json`` (one measured schedule per line, pointing at its kernel by line number).
It appends a line per commit and aborts on any line it cannot parse. A job killed in the middle of a write
(``kill -9``, a full disk) leaves a truncated last line, and the next append would be glued onto it. So every
reader here parses the lines first and drops damaged records with a warning before MetaSchedule sees them.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .errors import TvmpipeError

WORKLOADS = "database_workload.json"
RECORDS = "database_tuning_record.json"
REPORT = "tuning_report.json"
CURVE = "tuning_curve.png"
LOCK = ".lock"
ERROR_SECS = 1e10  # what MetaSchedule records as the run time of a candidate that failed to build or run


@dataclass
class Lines:
    """The intact lines of a log, and what was dropped ("file:line: why")."""

    workloads: list[str]
    records: list[str]
    dropped: list[str]

    def measurements(self) -> list[tuple[int, float | None]]:
        """(workload line, mean run time in seconds or None for a failed candidate), in measuring order."""
        out = []
        for line in self.records:
            index, (_, run_secs, _, _) = json.loads(line)
            secs = sum(run_secs) / len(run_secs) if run_secs else ERROR_SECS
            out.append((index, None if secs >= ERROR_SECS else secs))
        return out


def exists(log_dir: Path) -> bool:
    return (log_dir / WORKLOADS).is_file() and (log_dir / RECORDS).is_file()


def _parse(path: Path, valid) -> tuple[list[str], list[tuple[int, str]]]:
    """The lines ``valid`` accepts, and (line number, reason) for the others."""
    if not path.exists():
        return [], []
    raw = path.read_bytes()
    chunks = raw.split(b"\n")
    if chunks[-1] == b"":
        chunks.pop()  # the file ends with a newline, as every complete write does
    kept, bad = [], []
    for number, chunk in enumerate(chunks, 1):
        text = chunk.decode("utf-8", errors="replace")
        try:
            ok = valid(json.loads(text))
        except ValueError:
            ok = False
        if ok:
            kept.append(text)
        else:
            truncated = number == len(chunks) and not raw.endswith(b"\n")
            bad.append((number, "truncated (the job was killed while writing it)" if truncated else "not a valid entry"))
    return kept, bad


def _valid_workload(obj) -> bool:
    return isinstance(obj, list) and len(obj) == 2 and all(isinstance(x, str) for x in obj)


def read(log_dir: Path) -> Lines:
    """Parse a log directory; damaged records are dropped (see ``Lines.dropped``), a damaged workload in the
    middle is an error (records refer to workloads by line number, so dropping it would mislabel later ones)."""
    workloads, bad_w = _parse(log_dir / WORKLOADS, _valid_workload)
    if any(number <= len(workloads) for number, _ in bad_w):
        number, why = bad_w[0]
        raise TvmpipeError(f"{log_dir / WORKLOADS}:{number} is {why}; records refer to workloads by line number, "
                           "so this log cannot be repaired automatically: tune into a fresh --log-dir")

    def valid_record(obj) -> bool:
        return (isinstance(obj, list) and len(obj) == 2 and isinstance(obj[0], int) and 0 <= obj[0] < len(workloads)
                and isinstance(obj[1], list) and len(obj[1]) == 4 and isinstance(obj[1][1], (list, type(None))))

    records, bad_r = _parse(log_dir / RECORDS, valid_record)
    dropped = [f"{log_dir / WORKLOADS}:{n}: {why}" for n, why in bad_w]
    dropped += [f"{log_dir / RECORDS}:{n}: {why}" for n, why in bad_r]
    return Lines(workloads, records, dropped)


def _write_lines(path: Path, lines: list[str]) -> None:
    """Replace ``path`` atomically: a crash leaves the old file or the new one, never half of it."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.writelines(line + "\n" for line in lines)
    os.chmod(tmp, 0o644)  # mkstemp's 0600 would lock other users out of a shared log
    os.replace(tmp, path)


def write_json(path: Path, obj: dict) -> None:
    _write_lines(path, [json.dumps(obj, indent=1)])


def _warn_dropped(lines: Lines) -> None:
    for item in lines.dropped:
        warnings.warn(f"skipped a damaged tuning log line: {item}", stacklevel=3)


def repaired(log_dir: Path) -> Lines:
    """Read a log and rewrite it without its damaged lines (the caller holds the lock)."""
    lines = read(log_dir)
    _warn_dropped(lines)
    if lines.dropped:
        _write_lines(log_dir / WORKLOADS, lines.workloads)
        _write_lines(log_dir / RECORDS, lines.records)
    return lines


def database(log_dir: Path, lines: Lines | None = None):
    """MetaSchedule's JSONDatabase over a log: in place when ``lines`` is None (a job holding the lock, files
    already repaired), else from a clean copy (compile: reads without the lock and never writes)."""
    from tvm.s_tir.meta_schedule.database import JSONDatabase

    if lines is None:
        return JSONDatabase(str(log_dir / WORKLOADS), str(log_dir / RECORDS), allow_missing=True)
    _warn_dropped(lines)
    with tempfile.TemporaryDirectory() as tmp:  # the database is loaded into memory by its constructor
        _write_lines(Path(tmp) / WORKLOADS, lines.workloads)
        _write_lines(Path(tmp) / RECORDS, lines.records)
        return JSONDatabase(str(Path(tmp) / WORKLOADS), str(Path(tmp) / RECORDS), allow_missing=False)


@contextmanager
def locked(log_dir: Path) -> Iterator[None]:
    """Hold the log's lock; a second job on the same directory fails at once, naming the first one's pid.
    (flock: released by the kernel when the holder dies, even of kill -9; Linux and macOS.)"""
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / LOCK, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            raise TvmpipeError(f"tuning log {log_dir} is in use by another tvmpipe job (pid {f.read().strip() or '?'}): "
                               "wait for it to finish or use another --log-dir") from None
        f.truncate(0)
        f.write(str(os.getpid()))
        f.flush()
        try:
            yield
        finally:
            f.truncate(0)


def compact(log_dir: Path, keep: int) -> tuple[int, int]:
    """Keep the ``keep`` fastest working records of each workload (in their original order); return
    (records before, records after). Failed candidates go too, so a resumed job may try them again; the report
    counts what went (``compacted_away``), so that ``--resume`` still counts it toward the budget."""
    with locked(log_dir):
        lines = repaired(log_dir)
        by_workload: dict[int, list[tuple[float, int]]] = {}
        for i, (workload, secs) in enumerate(lines.measurements()):
            if secs is not None:
                by_workload.setdefault(workload, []).append((secs, i))
        kept = sorted(i for ranked in by_workload.values() for _, i in sorted(ranked)[:keep])
        _write_lines(log_dir / RECORDS, [lines.records[i] for i in kept])
        if (log_dir / REPORT).is_file():
            report = json.loads((log_dir / REPORT).read_text())
            report["compacted_away"] = report.get("compacted_away", 0) + len(lines.records) - len(kept)
            write_json(log_dir / REPORT, report)
    return len(lines.records), len(kept)
