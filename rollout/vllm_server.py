"""Start, health-check, restart and stop a vLLM OpenAI-compatible server as a subprocess.

vLLM lives in its own venv (`.venv-vllm`, built by scripts/setup.d/40-vllm.sh) because it pins its
own transformers; we only talk to it over HTTP. On CPU it needs `--enforce-eager`, a small KV cache
(`VLLM_CPU_KVCACHE_SPACE`, GiB), a writable `VLLM_CACHE_ROOT` and no hub access; those CPU settings
apply on CPU only: on a GPU the server runs bf16 with CUDA graphs (a run's settings come from its
recipe through rollout/engine_settings.py). `VLLM_SERVER_DEV_MODE=1` exposes `/collective_rpc`
(weight reload) and `/reset_prefix_cache`. The server listens on a free loopback port; its log
goes to a file whose tail is quoted in every start error. It runs under a guard
(rollout/server_guard.py) that ends its process group when the starting process dies, SIGKILL
included, so a killed driver leaves no server behind.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from thundersync import stages
from thundersync.cache import cache_root
from thundersync.rollout.server_guard import ServerGuard

REPO_ROOT = Path(__file__).resolve().parent.parent


class VLLMServerError(RuntimeError):
    """The vLLM server could not be started or stopped answering."""


def vllm_python() -> Path:
    """The interpreter of the vLLM venv (env TSRL_VLLM_PYTHON overrides)."""
    env = os.environ.get("TSRL_VLLM_PYTHON")
    p = Path(env) if env else REPO_ROOT / ".venv-vllm" / "bin" / "python"
    if not p.exists():
        raise VLLMServerError(
            f"vLLM interpreter {p} not found: run `sudo bash scripts/setup.d/40-vllm.sh` "
            "(or set TSRL_VLLM_PYTHON to a python with vllm installed)"
        )
    return p


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class VLLMServerConfig:
    """One server's `vllm serve` settings. A run builds it with rollout/engine_settings.py (from
    the recipe and the device); a field left None here takes the default of the device the server
    starts on (`on_gpu`), so a bare config never runs a GPU in fp32 eager mode."""

    model: str
    dtype: str | None = None  # None: bfloat16 on GPU, float32 on CPU
    max_model_len: int | None = None  # None: the model's own context length
    kv_cache_gib: int = 1
    seed: int = 0
    port: int | None = None
    served_model_name: str = "policy"
    host: str = "127.0.0.1"
    start_timeout_s: float = 300.0
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float | None = None  # CUDA only; None: vLLM's default
    enforce_eager: bool | None = None  # None: on CPU only (vllm-cpu needs it), CUDA graphs on GPU
    enable_prefix_caching: bool | None = None  # None: vLLM's default
    enable_chunked_prefill: bool | None = None  # None: vLLM's default
    on_gpu: bool | None = None  # None: `engine_on_gpu()` where the server is made
    # CPU only: "map" serves published versions straight from their shared-memory segment
    # (plain linear weights, no oneDNN re-pack per load; rollout/vllm_worker/tsrl_vllm_ext.py),
    # "packed" keeps vllm-cpu's oneDNN weights and copies + re-packs at every load
    cpu_weights: str = "map"
    # how long vLLM's queue readers busy-spin after a message (vLLM: 1 s). None: 0 on CPU, where
    # idle replicas' spinning workers starve the called one (rollout/vllm_worker/sitecustomize.py),
    # vLLM's own on GPU
    reader_spin_s: float | None = None
    extra_args: list[str] = field(default_factory=list)
    # over the inherited env: the node's plan gives each local server its CUDA_VISIBLE_DEVICES
    extra_env: dict[str, str] = field(default_factory=dict)


@functools.cache
def engine_on_gpu() -> bool:
    """Whether a vLLM server started from this process runs on a GPU. The main venv may hold a
    CPU torch beside a CUDA vLLM (the engine image: tsrl only starts and watches the server), so
    the vLLM interpreter is asked too (once per process, a few seconds)."""
    import torch

    if torch.cuda.is_available():
        return True
    if not Path("/proc/driver/nvidia").exists() and not Path("/dev/nvidiactl").exists():
        return False  # no NVIDIA driver on this machine: no CUDA for any interpreter
    try:
        py = vllm_python()
    except VLLMServerError:
        return False  # no vLLM here: nothing to start on any device
    if py.resolve() == Path(sys.executable).resolve():
        return False
    probe = "import torch; print(torch.cuda.is_available())"
    try:
        out = subprocess.run(
            [str(py), "-c", probe],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": ""},
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.stdout.strip() == "True"


def _switch(flag: str, on: bool | None) -> list[str]:
    """`--flag` / `--no-flag` (vLLM's boolean options), nothing for None (vLLM's default)."""
    if on is None:
        return []
    return [flag] if on else [flag.replace("--", "--no-", 1)]


class VLLMServer:
    """One vLLM server process. `start()` blocks until /health answers (or raises with the log)."""

    def __init__(self, config: VLLMServerConfig, log_dir: str | Path | None = None) -> None:
        self.config = config
        self.port = config.port or free_port()
        self._log_dir = Path(log_dir or tempfile.mkdtemp(prefix="tsrl-vllm-"))
        self._log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self._log_dir / f"vllm-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._guard: ServerGuard | None = None
        self.model = config.model
        self.on_gpu = config.on_gpu if config.on_gpu is not None else engine_on_gpu()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        c, gpu = self.config, self.on_gpu
        eager = c.enforce_eager if c.enforce_eager is not None else not gpu
        return [
            str(vllm_python()),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            # the server runs in its log dir: a relative model dir (runs/NAME/model) would be
            # taken for a hub repo id there
            str(Path(self.model).resolve()) if Path(self.model).exists() else self.model,
            "--served-model-name",
            c.served_model_name,
            "--host",
            c.host,
            "--port",
            str(self.port),
            "--dtype",
            c.dtype or ("bfloat16" if gpu else "float32"),
            *(["--max-model-len", str(c.max_model_len)] if c.max_model_len else []),
            "--seed",
            str(c.seed),
            "--disable-uvicorn-access-log",
            # in-place loads from shared memory (rollout/vllm_worker/tsrl_vllm_ext.py)
            "--worker-extension-cls",
            "tsrl_vllm_ext.TsrlWeightExtension",
            *(["--enforce-eager"] if eager else []),
            "--tensor-parallel-size",
            str(c.tensor_parallel_size),
            *_switch("--enable-prefix-caching", c.enable_prefix_caching),
            *_switch("--enable-chunked-prefill", c.enable_chunked_prefill),
            *(
                ["--gpu-memory-utilization", str(c.gpu_memory_utilization)]
                if c.gpu_memory_utilization is not None and gpu
                else []
            ),
            *c.extra_args,
        ]

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            VLLM_CPU_KVCACHE_SPACE=str(self.config.kv_cache_gib),
            # shared by every server of this machine's cache: vLLM keys its entries (the model
            # registry's class inspection, a subprocess that imports vLLM again, ~10-45 s here)
            # by the source file's hash and writes them atomically
            VLLM_CACHE_ROOT=str(cache_root() / "vllm"),
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            VLLM_SERVER_DEV_MODE="1",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            TOKENIZERS_PARALLELISM="false",
            TSRL_VLLM_CPU_WEIGHTS=self.config.cpu_weights,
        )
        spin = self.config.reader_spin_s
        if spin is None and not self.on_gpu:
            spin = 0.0
        if spin is not None:  # rollout/vllm_worker/sitecustomize.py
            env["TSRL_VLLM_READER_SPIN_S"] = str(spin)
        env.update(self.config.extra_env)
        # never let the main venv's packages leak into vLLM's: only the worker extension's dir
        env["PYTHONPATH"] = str(Path(__file__).resolve().parent / "vllm_worker")
        return env

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except FileNotFoundError:
            return "<no log>"

    def is_healthy(self, timeout_s: float = 2.0) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            return False
        try:
            return httpx.get(f"{self.url}/health", timeout=timeout_s).status_code == 200
        except httpx.HTTPError:
            return False

    def start(self, model: str | None = None) -> None:
        if self.proc is not None and self.proc.poll() is None:
            raise VLLMServerError(f"server already running on {self.url}")
        if model is not None:
            self.model = model
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child process
        # the server dies with this process, even when it is SIGKILLed (rollout/server_guard.py)
        self._guard = ServerGuard()
        try:
            self.proc = subprocess.Popen(
                self._guard.wrap(self.command()),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env(),
                cwd=str(self._log_dir),
                start_new_session=True,  # its own process group: stop() ends every worker with it
                pass_fds=self._guard.pass_fds,
            )
        finally:
            self._guard.started()
            log.close()
        t0 = time.monotonic()
        deadline, said = t0 + self.config.start_timeout_s, -5.0
        while time.monotonic() < deadline:
            if time.monotonic() - said >= 5.0:  # a start takes minutes on CPU: say so
                said = time.monotonic()
                waited, limit = int(said - t0), int(self.config.start_timeout_s)
                what = f"starting vLLM server {self.url} ({Path(self.model).name}), s waited"
                stages.report("engine", what, waited, limit)
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self.stop()  # closes the guard's pipe
                raise VLLMServerError(
                    f"vLLM server exited with code {code} while starting "
                    f"(model {self.model}); log {self.log_path}:\n{self.log_tail()}"
                )
            if self.is_healthy():
                return
            time.sleep(1.0)
        self.stop()
        raise VLLMServerError(
            f"vLLM server did not answer /health within {self.config.start_timeout_s:.0f} s; "
            f"log {self.log_path}:\n{self.log_tail()}"
        )

    def stop(self, timeout_s: float = 30.0) -> None:
        proc, self.proc = self.proc, None
        guard, self._guard = self._guard, None
        try:
            self._stop(proc, timeout_s)
        finally:
            if guard is not None:
                guard.close()

    def _stop(self, proc: subprocess.Popen[bytes] | None, timeout_s: float) -> None:
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def restart(self, model: str | None = None) -> None:
        self.stop()
        self.start(model)

    def __enter__(self) -> VLLMServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
