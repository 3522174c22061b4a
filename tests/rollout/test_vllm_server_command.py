"""The vLLM server's command line: a run's model dir, given relative to the run's cwd (`tsrl
train` writes runs/NAME/model), reaches the server as an absolute path, since the server runs in
its log dir and would take a relative one for a hub repo id."""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_cmd import flag as _flag

from thundersync.rollout.vllm_server import VLLMServer, VLLMServerConfig


def test_a_relative_model_dir_is_made_absolute_and_a_name_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "r" / "model").mkdir(parents=True)
    cmd = VLLMServer(VLLMServerConfig(model="runs/r/model"), log_dir=tmp_path / "log").command()
    assert cmd[cmd.index("--model") + 1] == str(tmp_path / "runs" / "r" / "model")
    cmd = VLLMServer(VLLMServerConfig(model="org/name"), log_dir=tmp_path / "log").command()
    assert cmd[cmd.index("--model") + 1] == "org/name"  # not a local dir: as given


def test_a_recipe_asking_for_a_131k_context_starts_vllm_with_that_max_model_len(
    tmp_path: Path,
) -> None:
    """Issue 34's acceptance: the recipe's context reaches `--max-model-len`, on either device."""
    from thundersync.config import load_run_config
    from thundersync.driver.vllm_replicas import replica_server_config

    recipe = tmp_path / "long.yaml"
    recipe.write_text("rollout:\n  engine: vllm\n  max_total_tokens: 131072\n")
    cfg = load_run_config(str(recipe))
    for on_gpu in (True, False):
        sc = replica_server_config(cfg, tmp_path / "model", on_gpu=on_gpu)
        cmd = VLLMServer(sc, log_dir=tmp_path / "log").command()
        assert _flag(cmd, "--max-model-len") == "131072"


@pytest.mark.parametrize("on_gpu", [True, False])
def test_a_bare_config_takes_its_devices_defaults_not_the_cpu_tests(
    tmp_path: Path, on_gpu: bool
) -> None:
    """Callers without a recipe (teacher check, evaluation) no longer get fp32 eager on a GPU."""
    cfg = VLLMServerConfig(model="org/name", on_gpu=on_gpu, gpu_memory_utilization=0.5)
    server = VLLMServer(cfg, log_dir=tmp_path / "log")
    cmd = server.command()
    assert _flag(cmd, "--dtype") == ("bfloat16" if on_gpu else "float32")
    assert ("--enforce-eager" in cmd) is (not on_gpu)
    assert "--max-model-len" not in cmd  # the model's own context, not a 2048 cap
    assert ("--gpu-memory-utilization" in cmd) is on_gpu  # a CUDA-only setting
    assert (server.env().get("TSRL_VLLM_READER_SPIN_S") == "0.0") is (not on_gpu)
