"""`tsrl teacher serve` and `tsrl vllm serve` start vLLM with the settings their flags (and the
recipe) ask for, resolved for the device, not the CPU-test defaults. The vLLM interpreter here is
a stand-in (`TSRL_VLLM_PYTHON`) that prints the argv it was started with and exits 3: the CLI
quotes the server log in its start error, so the test reads the real command line the CLI built,
without starting vLLM."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from thundersync.cli import app


@pytest.fixture
def argv_echo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\necho "ARGV $*"\nexit 3\n')
    fake.chmod(0o755)
    monkeypatch.setenv("TSRL_VLLM_PYTHON", str(fake))


def _argv(output: str) -> list[str]:
    line = next((x for x in output.splitlines() if x.startswith("ARGV ")), None)
    assert line is not None, output
    return line.split()[1:]


def _flag(argv: list[str], flag: str) -> str:
    assert flag in argv, f"{flag} missing from {argv}"
    return argv[argv.index(flag) + 1]


@pytest.mark.usefixtures("argv_echo")
def test_teacher_serve_on_cuda_runs_as_on_a_cluster() -> None:
    res = CliRunner().invoke(
        app,
        ["teacher", "serve", "--model", "org/teacher", "--device", "cuda"]
        + ["--max-model-len", "131072", "--tensor-parallel-size", "2"],
    )
    assert res.exit_code == 1, res.output  # the stand-in exited: a start error, with its log
    argv = _argv(res.output)
    assert _flag(argv, "--max-model-len") == "131072"
    assert _flag(argv, "--dtype") == "bfloat16" and "--enforce-eager" not in argv
    assert _flag(argv, "--tensor-parallel-size") == "2"
    assert "--enable-prefix-caching" in argv and "--enable-chunked-prefill" in argv
    assert _flag(argv, "--gpu-memory-utilization") == "0.85"


@pytest.mark.usefixtures("argv_echo")
def test_teacher_serve_on_cpu_keeps_the_cpu_settings() -> None:
    res = CliRunner().invoke(app, ["teacher", "serve", "--model", "org/teacher", "--device", "cpu"])
    argv = _argv(res.output)
    assert _flag(argv, "--dtype") == "float32" and "--enforce-eager" in argv
    assert "--max-model-len" not in argv  # no run to hold: the model's own context
    assert "--gpu-memory-utilization" not in argv


@pytest.mark.usefixtures("argv_echo")
def test_vllm_serve_takes_the_recipes_context_and_its_flags() -> None:
    base = ["vllm", "serve", "--model", "org/policy", "--device", "cuda"]
    res = CliRunner().invoke(app, [*base, "--set", "rollout.max_total_tokens=131072"])
    argv = _argv(res.output)
    assert _flag(argv, "--max-model-len") == "131072"
    assert _flag(argv, "--dtype") == "bfloat16" and "--enforce-eager" not in argv
    res = CliRunner().invoke(
        app, [*base, "--max-model-len", "200000", "--tensor-parallel-size", "4", "--enforce-eager"]
    )
    argv = _argv(res.output)
    assert _flag(argv, "--max-model-len") == "200000" and "--enforce-eager" in argv
    assert _flag(argv, "--tensor-parallel-size") == "4"


def test_vllm_serve_refuses_a_context_shorter_than_the_budget() -> None:
    res = CliRunner().invoke(
        app,
        ["vllm", "serve", "--model", "org/policy", "--device", "cpu", "--max-model-len", "1024"],
    )
    assert res.exit_code == 2, res.output
    assert "rollout.vllm.max_model_len=1024" in res.output
    assert "rollout.max_total_tokens=2048" in res.output
