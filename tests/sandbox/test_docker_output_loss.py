"""Exec output the engine loses (podman #21741: `exec cat file` -> '' with exit 0) is detected,
never passed off as the command's whole output: the docker backend through podman's real
socket, with the loss injected on the engine's side of the API only (the stream the client
reads)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from thundersync.sandbox.docker_backend import DockerExecutor, DockerSession
from thundersync.sandbox.executor import ExecOutputLost, Limits, SessionSpec
from thundersync.sandbox.selftest import probe


@pytest.fixture(scope="module")
def docker_executor() -> DockerExecutor:
    return DockerExecutor()


def _lossy_exec_start(
    s: DockerSession, monkeypatch: pytest.MonkeyPatch, lose: Callable[[Any, bool], Any]
) -> None:
    """Route every exec's output through `lose(output, streamed)` (housekeeping execs too)."""
    api = s.client.api
    real_start = api.exec_start

    def start(*args: Any, **kwargs: Any) -> Any:
        return lose(real_start(*args, **kwargs), bool(kwargs.get("stream")))

    monkeypatch.setattr(api, "exec_start", start)


def test_a_broken_output_stream_is_flagged_and_the_command_never_rerun(
    docker_executor: DockerExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    def drop_after_first(stream: Iterator[Any]) -> Iterator[Any]:
        for chunk in stream:
            yield chunk
            raise ConnectionResetError("injected: the engine dropped the stream")

    with docker_executor.open(SessionSpec(label="broken-stream")) as s:
        _lossy_exec_start(
            s, monkeypatch, lambda o, streamed: drop_after_first(o) if streamed else o
        )
        r = s.exec("echo run >> runs.txt; echo first; sleep 0.5; echo second")
        assert r.output_lost and "second" not in r.stdout, r
        assert r.combined().endswith("[output lost by the container engine]")
        monkeypatch.undo()
        # read back with the retried file read: the real engine may lose a plain exec's output
        # under load too (#21741), which must not read as "never ran"
        assert s.get_file("runs.txt") == b"run\n"  # ran exactly once
        ok = probe(s, "echo alive")  # the session stays usable, and a whole output is not flagged
        assert (ok.stdout, ok.output_lost) == ("alive\n", False)


def test_an_exec_whose_output_never_arrived_is_flagged_not_read_as_empty(
    docker_executor: DockerExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#21741's shape: the stream ends cleanly with nothing in it and the exit code is 0."""

    def nothing(stream: Iterator[Any]) -> Iterator[Any]:
        for _ in stream:  # drain it: the command runs to its end, as in the bug
            pass
        yield from ()

    with docker_executor.open(SessionSpec(label="lost-output")) as s:
        _lossy_exec_start(s, monkeypatch, lambda o, streamed: nothing(o) if streamed else o)
        r = s.exec("echo run >> runs.txt; echo the answer is 42")
        assert (r.exit_code, r.stdout, r.output_lost) == (0, "", True), r
        monkeypatch.undo()
        assert s.get_file("runs.txt") == b"run\n"  # not rerun behind the caller's back


def test_get_file_retries_a_lost_read_and_never_returns_an_empty_file(
    docker_executor: DockerExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    with docker_executor.open(SessionSpec(label="lost-read")) as s:
        s.put_file("report.json", b'{"passed": 3}')
        losses = [1]  # the next plain (non-streamed) exec loses its stdout, then they work

        def lose_once(result: Any, streamed: bool) -> Any:
            if streamed or not losses:
                return result
            losses.pop()
            return (None, result[1])

        _lossy_exec_start(s, monkeypatch, lose_once)
        assert s.get_file("report.json") == b'{"passed": 3}' and not losses
        losses.extend([1, 1, 1])  # every try loses it: an error, not b""
        with pytest.raises(ExecOutputLost, match=r"get_file\('report.json'\).*3 times"):
            s.get_file("report.json")
        monkeypatch.undo()
        assert s.get_file("missing.json") is None


def test_the_trailer_is_invisible_in_results_even_when_output_is_truncated(
    docker_executor: DockerExecutor,
) -> None:
    with docker_executor.open(SessionSpec(label="trailer", limits=Limits(output_bytes=1000))) as s:
        r = s.exec("printf 'no newline'; printf oops >&2; exit 7")
        assert (r.exit_code, r.stdout, r.stderr, r.truncated) == (7, "no newline", "oops", False)
        big = s.exec("head -c 5000 /dev/zero | tr '\\0' a; echo END")
        assert big.truncated and big.stdout.endswith("a" * 100 + "END\n"), big.stdout[-80:]
        assert big.stdout.startswith("a" * 500) and " bytes truncated ...]" in big.stdout
        assert "\x1e" not in r.stdout + r.stderr + big.stdout + big.stderr


def test_a_command_that_kills_its_own_wrapper_comes_back_as_data(
    docker_executor: DockerExecutor,
) -> None:
    """The wrapper runs as the agent's user, so `kill -1` reaches it before it can write its
    trailer: that is the command's doing, not lost output, and must not be flagged as lost."""
    with docker_executor.open(SessionSpec(label="kill-wrapper")) as s:
        r = s.exec("echo before; kill -TERM -1; sleep 1; echo after", timeout=10)
        assert r.exit_code == 143 and not r.timed_out and not r.output_lost, r
        assert s.exec("echo alive").stdout == "alive\n"
