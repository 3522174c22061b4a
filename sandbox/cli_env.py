"""`tsrl env check`: run the oracle and a no-op for tasks in the sandbox."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer

from thundersync.cli_groups import app

env_app = typer.Typer(
    no_args_is_help=True, help="Environments: SWE-smith, SETA / Terminal-Bench, Harbor."
)
app.add_typer(env_app, name="env")


def _image_map(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        published, sep, local = item.partition("=")
        if not sep or not published or not local:
            raise ValueError(f"--image-map {item!r}: write PUBLISHED=LOCAL, e.g. a:1=b:1")
        out[published] = local
    from pydantic import ValidationError

    from thundersync.config_env import EnvConfig

    try:
        EnvConfig(image_map=out)  # the run config's own check of the entries
    except ValidationError as e:
        raise ValueError(str(e.errors()[0]["msg"]).removeprefix("Value error, ")) from None
    return out


def _fail(msg: str, json_out: bool, backend: str, code: int = 2) -> typer.Exit:
    """An error: on stderr, and with --json as the one JSON object on stdout."""
    typer.echo(f"error: {msg}", err=True)
    if json_out:
        typer.echo(json.dumps({"ok": False, "backend": backend, "error": msg}))
    return typer.Exit(code)


@contextlib.contextmanager
def _stdout_to_stderr(on: bool) -> Iterator[None]:
    """With --json, stdout is the one JSON object: while tasks run, anything printed (by Python
    or by a child process writing to fd 1) goes to stderr instead."""
    if not on:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


@env_app.command("check")
def check(
    task_path: str = typer.Argument(
        None, help="task dir (TB1/SETA/Harbor), a folder of them, or SWE-smith .json/.jsonl"
    ),
    all_: bool = typer.Option(False, "--all", help="every shipped fixture"),
    hacks: bool = typer.Option(
        False, "--hacks", help="run the shipped hack suite instead: every hack must earn 0"
    ),
    backend: str = typer.Option("local", help="local | docker"),
    repos_dir: str = typer.Option(
        None, help="git mirrors for SWE-smith records (default: fixtures)"
    ),
    image_map: list[str] = typer.Option(
        [], "--image-map", help="docker: PUBLISHED=LOCAL image (as env.image_map; repeatable)"
    ),
    pull: bool = typer.Option(False, "--pull", help="docker: pull missing unmapped images"),
    json_out: bool = typer.Option(
        False, "--json", help="print one JSON object (errors too; --hacks: every hack in it)"
    ),
) -> None:
    """Gold must earn 1 and a no-op 0 (--hacks: every hack must be defeated); exit 1 otherwise
    (also when a task cannot run on this backend), 2 on bad input."""
    from thundersync.sandbox import images
    from thundersync.sandbox.backends import get_executor
    from thundersync.sandbox.envs.check import check_all, check_path, summarize
    from thundersync.sandbox.envs.swesmith import RecordError
    from thundersync.sandbox.envs.terminal import TaskError
    from thundersync.sandbox.executor import SandboxError

    try:
        images.configure(_image_map(image_map), pull)
    except ValueError as e:
        raise _fail(str(e), json_out, backend) from None
    if hacks:
        if all_ or task_path:
            raise _fail(
                "--hacks runs the shipped hack suite: give no TASK_PATH or --all", json_out, backend
            )
        _check_hacks(backend, json_out)
        return
    if not all_ and not task_path:
        raise _fail("give a TASK_PATH or --all", json_out, backend)
    try:
        with _stdout_to_stderr(json_out):
            ex = get_executor(backend)
            if all_:
                details = check_all(ex)
            else:
                repos = Path(repos_dir) if repos_dir else None
                details = check_path(Path(task_path), ex, repos)
    except (RecordError, TaskError, SandboxError, OSError) as e:
        raise _fail(str(e), json_out, backend) from None
    except Exception as e:  # a bug: its traceback on stderr, still one JSON object on stdout
        traceback.print_exc()
        raise _fail(f"{type(e).__name__}: {e}", json_out, backend) from None
    summary = summarize(details)
    # a task without a solution (Harbor training tasks) has no gold to check: not a failure;
    # a task this backend cannot run is one, unless --all (the fixtures span both backends)
    ok = summary["gold_ok"] + summary["gold_unchecked"] == summary["noop_ok"] == summary["tasks"]
    ok = ok and (all_ or not summary["skipped"])
    if json_out:
        typer.echo(json.dumps({"ok": ok, "backend": backend, **summary}))
    else:
        for d in summary["details"]:
            gold = "n/a " if d["gold_reward"] is None else f"{d['gold_reward']:.2f}"
            typer.echo(
                f"{d['task']:<36} gold={gold} noop={d['noop_reward']:.2f}  {d['gold_reason']}"
            )
        for d in summary["skipped"]:
            typer.echo(f"{d['task']:<36} skipped: {d['reason']}")
        typer.echo(
            f"{summary['gold_ok']}/{summary['tasks']} gold ok, {summary['noop_ok']}/{summary['tasks']} no-op ok"
        )
    if not ok:
        raise typer.Exit(1)


_HACK_KEYS = ("name", "task", "kind", "reward", "defeated", "reason", "seconds")


def _check_hacks(backend: str, json_out: bool) -> None:
    """`--hacks`: one line per hack and the summary (with --json: one JSON object on stdout, a
    progress line per hack on stderr as it ends); exit 1 unless every hack is defeated."""
    import threading

    from thundersync.sandbox.backends import get_executor
    from thundersync.sandbox.envs.hacks import run_hacks, summarize
    from thundersync.sandbox.executor import SandboxError

    lock = threading.Lock()

    def progress(d: dict[str, Any]) -> None:  # worker threads: one whole line at a time
        with lock:
            verdict = "defeated" if d["defeated"] else "NOT DEFEATED"
            typer.echo(f"{d['name']:<28} reward={d['reward']}  {verdict}", err=True)

    try:
        with _stdout_to_stderr(json_out):
            details = run_hacks(get_executor(backend), on_done=progress if json_out else None)
    except SandboxError as e:
        raise _fail(str(e), json_out, backend) from None
    except Exception as e:  # a bug: its traceback on stderr, still one JSON object on stdout
        traceback.print_exc()
        raise _fail(f"{type(e).__name__}: {e}", json_out, backend) from None
    summary = summarize(details)
    ok = summary["defeated"] == summary["total"]
    if json_out:
        hacks = [{k: d[k] for k in _HACK_KEYS} for d in details]
        typer.echo(json.dumps({"ok": ok, "backend": backend, **summary, "hacks": hacks}))
    else:
        for d in details:
            verdict = "defeated" if d["defeated"] else "NOT DEFEATED"
            typer.echo(f"{d['name']:<28} {d['task']:<28} reward={d['reward']}  {verdict}")
        typer.echo(f"{summary['defeated']}/{summary['total']} hacks defeated")
    if not ok:
        raise typer.Exit(1)
