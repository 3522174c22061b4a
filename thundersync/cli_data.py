"""`tsrl data import swe-smith FILE --out TASKSET.jsonl [--repos-dir DIR]`: a published SWE-smith
dataset file (JSONL, or parquet through pyarrow) from a local path into a task set.

The task set is what `env.tasks` takes for `env.name: swe-smith` (and what an uploaded set's
first `*.jsonl` is): one record a line, read by `sandbox.envs.swesmith.load_instances`. Every
record is validated as the env would read it (a bad one names the file, the line or row, and
the field); nothing is written unless all are good. `--repos-dir` (inside the task set's
directory: the set travels with its mirrors) is stored in each record relative to the set, so
episodes find their git mirrors there; a record without an image_name must have its mirror.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from thundersync.cli_groups import app

if TYPE_CHECKING:  # the sandbox package is imported when a command runs, not at CLI start
    from thundersync.sandbox.envs.swesmith import SweInstance

data_app = typer.Typer(no_args_is_help=True, help="Import datasets into task sets.")
import_app = typer.Typer(no_args_is_help=True, help="Import a published dataset file.")
data_app.add_typer(import_app, name="import")
app.add_typer(data_app, name="data")


def _rows(path: Path) -> list[tuple[str, Any]]:
    """(where, record) for each record of a .jsonl / .json / .parquet file."""
    from thundersync.sandbox.envs.swesmith import RecordError

    if not path.is_file():
        raise RecordError(f"{path}: no such file (expected a SWE-smith .jsonl or .parquet)")
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise RecordError(
                f"{path}: reading parquet needs pyarrow, which is not installed: "
                "`pip install pyarrow` (or convert the file to JSONL)"
            ) from None
        try:
            table = pq.read_table(path)
        except Exception as e:  # pyarrow raises its own error types for corrupt files
            raise RecordError(f"{path}: not a readable parquet file ({e})") from None
        return [(f"{path}[row {i}]", r) for i, r in enumerate(table.to_pylist())]
    text = path.read_text()
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise RecordError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
        recs = data if isinstance(data, list) else [data]
        return [(f"{path}[{i}]", r) for i, r in enumerate(recs)]
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                out.append((f"{path}:{i}", json.loads(line)))
            except json.JSONDecodeError as e:
                raise RecordError(f"{path}:{i}: not valid JSON ({e.msg})") from None
    return out


def _task(inst: SweInstance, repos_dir: str | None) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "instance_id": inst.instance_id,
        "repo": inst.repo,
        "patch": inst.patch,
        "FAIL_TO_PASS": inst.fail_to_pass,
        "PASS_TO_PASS": inst.pass_to_pass,
        "image_name": inst.image_name,
        "problem_statement": inst.problem_statement,
    }
    if repos_dir is not None:
        rec["repos_dir"] = repos_dir
    return rec


def import_records(src: Path, out: Path, repos_dir: Path | None = None) -> int:
    """Validate every record of `src` and write the task set `out`; the number written."""
    from thundersync.sandbox.envs.swesmith import RecordError, parse_record
    from thundersync.sandbox.envs.taskset_check import record_problem

    rel_repos = None
    if repos_dir is not None:
        repos_dir, home = repos_dir.resolve(), out.parent.resolve()
        if not repos_dir.is_dir():
            raise RecordError(f"--repos-dir {repos_dir}: no such directory")
        if not repos_dir.is_relative_to(home):
            raise RecordError(
                f"--repos-dir {repos_dir} is outside {home}: put the mirrors beside the task "
                "set (records name them relative to it, so the set travels with its mirrors)"
            )
        rel_repos = str(repos_dir.relative_to(home))
    tasks: list[dict[str, Any]] = []
    seen: dict[str, str] = {}
    for where, rec in _rows(src):
        inst = parse_record(rec, where)
        if bad := record_problem(inst):  # e.g. an image_name whose repo has no profile
            raise RecordError(bad)
        if inst.instance_id in seen:
            raise RecordError(
                f"{where}: instance_id {inst.instance_id!r} repeats {seen[inst.instance_id]}"
            )
        seen[inst.instance_id] = where
        mirror = repos_dir / inst.repo_name if repos_dir else None
        if mirror is not None and not inst.image_name and not mirror.exists():
            raise RecordError(
                f"{where}: field 'image_name' is empty and repo {inst.repo!r} has no mirror at "
                f"{mirror}; add the mirror or the record's image"
            )
        tasks.append(_task(inst, rel_repos))
    if not tasks:
        raise RecordError(f"{src}: no records")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    with os.fdopen(fd, "w") as f:  # written whole, then renamed: never a half task set
        f.writelines(json.dumps(t) + "\n" for t in tasks)
    os.replace(tmp, out)
    return len(tasks)


@import_app.command("swe-smith")
def import_swe_smith(
    file: Path = typer.Argument(..., help="the dataset file: .jsonl, .json or .parquet"),
    out: Path = typer.Option(..., "--out", help="the task set to write (.jsonl)"),
    repos_dir: Path = typer.Option(None, "--repos-dir", help="directory of <repo name>/ mirrors"),
) -> None:
    """SWE-smith records (local file, no download) -> a task set for `env.tasks`."""
    from thundersync.sandbox.envs.swesmith import RecordError

    try:
        n = import_records(file, out, repos_dir)
    except RecordError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"{n} instances -> {out}")
