"""pass@k evaluation: n independent attempts per task, each in a fresh environment.

Unbiased pass@k (Chen et al. 2021; the paper's App. H): with n attempts of which c are correct,
pass@k = 1 - C(n-c, k) / C(n, k), averaged over tasks; k > n is reported as None. An attempt is
correct when its trajectory reward is >= `threshold` (1.0: fully solved; SETA partial rewards
below that do not count). Attempts never see each other (new env, new seed, no feedback).

Tasks file: JSONL (or a directory of *.jsonl), one task per line in SkyRL's dataset shape:
`{"instance_id": str, "env_class": str, "prompt": [messages], "env_extras": {...}}`; `env_class`
is a skyrl-gym id (those of `sandbox.envs`: the toy calculator `tsrl-toy-calc`, the sandbox envs).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

KS = (1, 3, 5)


def pass_at_k(n: int, c: int, k: int) -> float:
    if not 0 <= c <= n or n < 1:
        raise ValueError(f"need 0 <= c <= n and n >= 1, got n={n} c={c}")
    if k > n:
        raise ValueError(f"k={k} > n={n}: run at least k attempts")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def load_tasks(path: str | Path) -> list[dict[str, Any]]:
    from thundersync.sandbox.envs import renamed_id

    p = Path(path)
    files = sorted(p.glob("*.jsonl")) if p.is_dir() else [p]
    if not files or not all(f.exists() for f in files):
        raise FileNotFoundError(f"no tasks at {p}: pass a .jsonl file or a directory of them")
    tasks = []
    for f in files:
        for ln, line in enumerate(f.read_text().splitlines(), 1):
            if not line.strip():
                continue
            t = json.loads(line)
            for key in ("env_class", "prompt"):
                if key not in t:
                    raise ValueError(f"{f}:{ln}: task lacks {key!r} (see rollout/evaluation.py)")
            if (new := renamed_id(t["env_class"])) is not None:
                raise ValueError(
                    f"{f}:{ln}: env_class {t['env_class']!r} was renamed: write "
                    f'"env_class": "{new.value}"'
                )
            t.setdefault("instance_id", f"{f.stem}-{ln}")
            tasks.append(t)
    return tasks


def _register_envs() -> None:
    import thundersync.sandbox.envs  # noqa: F401  (registers the toy calculator and the sandbox envs)


def run_eval(
    model_dir: str,
    tasks_path: str,
    attempts: int,
    *,
    engine_kind: str = "hf",
    max_turns: int = 4,
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    threshold: float = 1.0,
    concurrency: int = 4,
    seed: int = 0,
) -> dict[str, Any]:
    import skyrl_gym

    from thundersync.rollout.agent_loop import AgentLoop, AgentLoopConfig, RolloutTask
    from thundersync.rollout.chat import TokenizerChatFormat
    from thundersync.rollout.types import SamplingParams

    _register_envs()
    tasks = load_tasks(tasks_path)
    tok = _tokenizer(model_dir)
    engine: Any
    if engine_kind == "hf":
        from thundersync.rollout.hf_engine import HFEngine

        engine = HFEngine(model_dir)
    elif engine_kind == "vllm":
        from thundersync.rollout.vllm_engine import VLLMEngine
        from thundersync.rollout.vllm_server import VLLMServer, VLLMServerConfig

        server = VLLMServer(VLLMServerConfig(model=model_dir))
        server.start()
        engine = VLLMEngine(server)
    else:
        raise ValueError(f"unknown engine {engine_kind!r}: use 'hf' or 'vllm'")

    def maker(t: dict[str, Any]) -> Any:
        # sandbox envs: a session pool at least as big as the attempts run at once
        extras = {"pool_size": concurrency} | dict(t.get("env_extras") or {})
        return lambda: skyrl_gym.make(t["env_class"], extras=dict(extras))

    jobs = [
        RolloutTask(str(t["instance_id"]), maker(t), list(t["prompt"]), repetition=a, seed=seed)
        for t in tasks
        for a in range(attempts)
    ]
    cfg = AgentLoopConfig(
        max_turns=max_turns,
        sampling=SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature),
        concurrency=concurrency,
    )
    try:
        trajs = AgentLoop(engine, TokenizerChatFormat(tok), cfg).run(jobs)
    finally:
        engine.close()
    per_task = []
    for t in tasks:
        mine = [tr for tr in trajs if tr.instance_id == str(t["instance_id"])]
        c = sum(1 for tr in mine if (tr.reward or 0.0) >= threshold)
        row: dict[str, Any] = {"instance_id": t["instance_id"], "n": len(mine), "correct": c}
        row["mean_reward"] = sum(tr.reward or 0.0 for tr in mine) / max(1, len(mine))
        row["malformed_calls"] = sum(tr.malformed_calls for tr in mine)
        for k in KS:
            row[f"pass@{k}"] = pass_at_k(len(mine), c, k) if k <= len(mine) else None
        per_task.append(row)
    summary: dict[str, Any] = {"tasks": len(tasks), "attempts": attempts, "model": model_dir}
    for k in KS:
        vals = [r[f"pass@{k}"] for r in per_task if r[f"pass@{k}"] is not None]
        summary[f"pass@{k}"] = sum(vals) / len(vals) if vals else None
    summary["mean_reward"] = sum(r["mean_reward"] for r in per_task) / max(1, len(per_task))
    summary["malformed_calls"] = sum(r["malformed_calls"] for r in per_task)
    return {"summary": summary, "per_task": per_task}


def _tokenizer(model_dir: str) -> Any:
    from transformers import AutoTokenizer

    from thundersync.hf_models import load_tokenizer

    cfg = json.loads((Path(model_dir) / "tokenizer_config.json").read_text())
    if cfg.get("chat_template") or (Path(model_dir) / "chat_template.jinja").exists():
        return AutoTokenizer.from_pretrained(model_dir)
    return load_tokenizer(model_dir)  # self-trained tokenizers: keep their pre-tokenizer
