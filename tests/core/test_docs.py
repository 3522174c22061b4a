"""Every command README.md and docs/*.md show is run, by this file or by the test COVERED names.

Convention: a command is a line of a fenced ```bash / ```sh / ```shell block (comments and blank
lines dropped, `\\` continuations joined) or a `$ ` line of a ```console block. Lines that only set
variables (`export X=1`, `X=1`) are not commands. Every `tsrl ...` command is parsed against the
real CLI (an unknown command, option, choice or recipe fails); the cheap ones (RUN) are also run
here for real; every other command must be in COVERED with the test that runs it (or runs the
same code at a smaller size, said in the note), and that test must exist. A new command in a doc
fails until it is put in one of the two. `tsrl ...` in inline backticks (prose, tables, with
`[--opt X]` meta-syntax) is not run, but its command path and every `--flag` must exist.
Links to files, and repository paths in backticks, must exist.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer

from thundersync.cli import app
from thundersync.config import load_run_config

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TSRL = str(Path(sys.executable).with_name("tsrl"))

# Run here for real: command -> seconds allowed (measured on 2 cores: 1, 1, 1, 5, 24 s).
RUN: dict[str, int] = {
    "tsrl --help": 60,
    "tsrl config show grpo-toy": 60,
    "tsrl config show grpo-smollm2-terminal": 60,
    "tsrl config show grpo-smollm2-terminal --set updates=8": 60,
    "tsrl model tiny runs/models/tiny --arch qwen3": 120,
    "tsrl env check sandbox/fixtures/terminal-easy/easy-echo-word --json": 120,
    "tsrl bench equivalence --objective grpo --ranks 1 --json": 240,
    "tsrl plan grpo-qwen3-8b --gpus 8 --gpu-memory 141 --host-memory 2048": 60,
    "tsrl plan opd-qwen3-32b --gpus 8 --gpu-memory 141 --host-memory 2200": 60,
    "tsrl plan opd-qwen3-8b-131k --gpus 8 --gpu-memory 141 --host-memory 2048": 60,
}

_SMOL = "tests/driver/test_smollm2_recipe.py::test_smollm2_policy_trains_on_verifier_rewards_and_equals_sync"
_E2E = "tests/service/test_service_e2e_script.py::test_a_recipe_runs_through_the_service_and_equals_sync"
_FLOW = "tests/service/test_acceptance_flow.py::test_grpo_toy_two_updates_end_to_end"
_SPEED = "tests/bench/test_machine_contention.py::test_prediction_errors_pair_rounds_and_apply_the_machine_slowdown"
_DEPLOY = "tests/deploy/test_deploy_manifests.py::"
_K8S = _DEPLOY + "test_kubernetes_manifests_validate"
_COMPOSE = _DEPLOY + "test_compose_config_with_rendered_secrets"
_GPU = "tests/deploy/test_deploy_scripts.py::test_gpu_smoke_runs_the_cuda_tests_and_bench_and_reports_json"
_EQ = "tests/learner/test_"
# Expensive commands: command -> (the test that runs it, how).
_EXPORT = "tests/driver/test_metric_export.py::"
_PLAN = "tests/plan/test_plan.py::"
COVERED: dict[str, tuple[str, str]] = {
    "tsrl bench host-adds --elements 134217728 --threads 1 --threads 2 --threads 4 --threads 8 "
    "--threads 16 --json": (
        "tests/learner/test_host_adds.py::test_bench_host_adds_reports_every_thread_count",
        "the same bench on 3e5 elements and 1-2 threads (the doc's numbers: a 16-core machine)",
    ),
    "tsrl bench equivalence --objective grpo --groups 6 --max-open-groups 2 --updates 4 --json": (
        "tests/learner/test_deferred_groups.py::"
        "test_stream_equals_sync_bitwise_when_groups_wait_for_admission",
        "the same bench at 3 updates (the doc's numbers: 4)",
    ),
    "tsrl bench skyrl --json": (
        "tests/skyrl/test_parity.py::test_bench_skyrl_reports_parity_in_one_json_line",
        "the same bench at 2 updates (the doc's numbers: 4)",
    ),
    "tsrl train grpo-toy --set logging.tensorboard=true --set logging.wandb=true": (
        _EXPORT + "test_wandb_offline_history_equals_metrics_jsonl",
        "the same run (2 updates), both exports read back",
    ),
    "tensorboard --logdir runs/grpo-toy/tensorboard": (
        _EXPORT + "test_tensorboard_scalars_equal_metrics_jsonl",
        "the event files it serves, read with TensorBoard's EventAccumulator",
    ),
    "make run": (
        "tests/service/test_make_run.py::test_make_run_keeps_the_demo_identity_and_its_runs",
        "scripts/run.sh (what `make run` runs after `make setup`), started twice",
    ),
    "make test": (
        "tests/core/test_docs.py::test_every_doc_command_is_run_or_covered",
        "this suite",
    ),
    "tsrl serve --port 8000": (_FLOW, "a real `tsrl serve` with an admin token"),
    "tsrl serve --port 8000 --data-dir runs/service": (_FLOW, "a real `tsrl serve`"),
    "curl -H 'Authorization: Bearer $TSRL_ADMIN_TOKEN' -X POST localhost:8000/api/v1/runs -H "
    '\'Content-Type: application/json\' -d \'{"recipe": "grpo-toy", "overrides": {"updates": 2}}\'': (
        _FLOW,
        "the same POST, then the run to success",
    ),
    "curl -H 'Authorization: Bearer $TSRL_ADMIN_TOKEN' -H 'Content-Type: application/json' -X POST "
    'localhost:8000/api/v1/runs -d \'{"recipe": "grpo-smollm2-terminal", "overrides": '
    '{"updates": 3}}\'': (_E2E, "the same POST over the API, with grpo-toy"),
    "curl -H 'Authorization: Bearer $TSRL_ADMIN_TOKEN' localhost:8000/api/v1/runs/RUN_ID/updates": (
        _FLOW,
        "GET runs/{id}/updates",
    ),
    "tsrl train grpo-smollm2-terminal": (_SMOL, "stream and sync, 2 updates"),
    "tsrl train grpo-smollm2-terminal --run-dir runs/smollm2": (_SMOL, "stream, 2 updates"),
    "tsrl train grpo-smollm2-terminal --set schedule=sync": (_SMOL, "sync, 2 updates"),
    "tsrl train grpo-smollm2-terminal --set schedule=sync --run-dir runs/smollm2-sync": (
        _SMOL,
        "sync, 2 updates",
    ),
    "tsrl train grpo-smollm2-terminal --set updates=8": (_SMOL, "2 updates"),
    "tsrl train grpo-toy": ("tests/driver/test_train.py::test_grpo_toy_reward_rises", "12 updates"),
    "tsrl train grpo-toy --run-dir runs/grpo-toy": (
        "tests/driver/test_train.py::test_grpo_toy_reward_rises",
        "the recipe as shipped",
    ),
    "tsrl train grpo-toy --set model.lora_rank=8": (
        "tests/driver/test_lora_train.py::test_tsrl_train_with_lora_publishes_loadable_weights",
        "`tsrl train` with a LoRA rank",
    ),
    "tsrl train grpo-toy --set record_batches=true --set updates=3 --run-dir runs/toy-rec": (
        "tests/driver/test_replay_cli.py::test_a_recorded_stream_run_replays_to_the_same_parameters",
        "a recorded grpo-toy run (its fixture)",
    ),
    "tsrl replay-gap runs/toy-rec --json": (
        "tests/driver/test_replay_cli.py::test_a_recorded_stream_run_replays_to_the_same_parameters",
        "`tsrl replay-gap DIR --json`",
    ),
    ".venv/bin/python scripts/service_e2e.py --recipe grpo-toy --updates 2 --out runs/e2e-toy": (
        _E2E,
        "the script with grpo-toy, 2 updates",
    ),
    ".venv/bin/python scripts/service_e2e.py --recipe grpo-smollm2-terminal --updates 3 --out runs/e2e": (
        _E2E,
        "the script with grpo-toy, 2 updates",
    ),
    "tsrl sandbox selftest --backend local --json": (
        "tests/sandbox/test_local_executor.py::test_selftest_cli_contains_every_attack",
        "the suite on local",
    ),
    "tsrl env check --hacks --backend local --json": (
        "tests/sandbox/test_hack_suite.py::test_cli_prints_one_json_object_with_every_hack",
        "the same command",
    ),
    "tsrl env check --hacks --backend docker --json": (
        "tests/sandbox/test_hack_suite.py::test_one_hack_per_channel_is_defeated_on_docker",
        "one hack per channel on docker; every hack on local",
    ),
    "tsrl env check --all --backend docker --json": (
        "tests/sandbox/test_task_images.py::test_image_fixtures_gold_one_noop_zero_on_docker_with_root_verifier",
        "the image fixtures on docker",
    ),
    "tsrl env check --all --json": (
        "tests/sandbox/test_terminal.py::test_env_check_all_gold_earns_one_and_noop_zero",
        "the same command",
    ),
    "tsrl bench equivalence --objective opd --ranks 1 --json": (
        _EQ + "arch.py::test_bench_equivalence_takes_an_arch_and_reports_it",
        "OPD through the CLI, 1 update",
    ),
    "tsrl bench equivalence --objective grpo --ranks 1 --masked --json": (
        _EQ + "drop_bench.py::test_masked_equivalence_bench",
        "GRPO masked, 2 updates",
    ),
    "tsrl bench equivalence --objective opd --ranks 1 --masked --json": (
        _EQ + "drop_bench.py::test_masked_equivalence_bench",
        "OPD masked, 2 updates",
    ),
    "tsrl bench equivalence --objective grpo --ranks 2 --json": (
        _EQ + "parallel_and_checkpoint.py::test_two_rank_fsdp2_equals_one_rank",
        "2 updates",
    ),
    "tsrl bench equivalence --objective opd --ranks 2 --json": (
        "tests/driver/test_train.py::test_two_learner_ranks_with_fsdp2_train_like_sync",
        "opd-toy on 2 FSDP2 ranks vs sync",
    ),
    "tsrl bench equivalence --objective grpo --reward-offset 1000 --json": (
        _EQ + "precision.py::test_equal_rewards_far_from_zero_give_exactly_zero_gradient",
        "rewards far from zero",
    ),
    "tsrl bench equivalence --objective grpo --dtype bf16 --json": (
        _EQ + "precision.py::test_bf16_compute_steps_fp32_master_weights_and_moments",
        "bf16 compute, fp32 master",
    ),
    "tsrl bench equivalence --objective opd --dtype bf16 --json": (
        _EQ + "precision.py::test_bf16_model_gives_fp32_logits_and_fp32_opd_ledgers",
        "bf16 OPD",
    ),
    "tsrl bench equivalence --objective opd --arch qwen3 --json": (
        _EQ + "arch.py::test_bench_equivalence_takes_an_arch_and_reports_it",
        "the same command, 1 update",
    ),
    "tsrl bench equivalence --objective grpo --grpo-sum float64 --json": (
        _EQ + "order_independent_sum.py::test_bench_reports_and_judges_the_reordered_control",
        "its float64 path at 2 updates in bf16; fp32 reorderings: test_float64_grpo_sum_gives_...",
    ),
    "tsrl bench equivalence --objective grpo --dtype bf16 --grpo-sum float64 --json": (
        _EQ + "order_independent_sum.py::test_bench_reports_and_judges_the_reordered_control",
        "the same bench at 2 updates (the doc's numbers: 10)",
    ),
    "tsrl bench equivalence --objective grpo --arch qwen2 --json": (
        _EQ + "arch.py::test_streamed_gradient_equals_sync_gradient_per_family",
        "every family",
    ),
    "tsrl bench learner-cost --model smollm2 --json": (
        "tests/core/test_docs.py::test_bench_learner_cost_runs_small",
        "tiny model, 1 round",
    ),
    "tsrl bench memory --json": (
        "tests/core/test_docs.py::test_bench_memory_runs_small",
        "one length, 2 and 4 turns, 1 round",
    ),
    "tsrl bench teacher --json": (
        "tests/bench/test_teacher_cost.py::test_bench_teacher_prints_the_cost_ratios_and_the_gap_to_full_scoring",
        "2 and 16 turns, 1 round",
    ),
    "tsrl bench publish --rounds 5 --json": (
        "tests/teacher/test_vllm_backend.py::test_cpu_replica_serves_a_shared_memory_version_from_the_segment_itself",
        "the shared-memory load it times (the bench itself is not run by a test)",
    ),
    "tsrl bench speedup --objective grpo --rounds 3 --updates 3 --json": (_SPEED, "its statistics"),
    "tsrl bench speedup --objective grpo --rounds 2 --updates 3 --load 1 --json": (
        _SPEED,
        "its statistics",
    ),
    "tsrl bench speedup --objective grpo --rounds 2 --updates 3 --load 0.5 --json": (
        _SPEED,
        "its statistics",
    ),
    "tsrl bench speedup --objective opd --rounds 3 --updates 3 --json": (_SPEED, "its statistics"),
    "tsrl bench speedup --objective opd --rounds 2 --updates 3 --load 1 --json": (
        _SPEED,
        "its statistics",
    ),
    "tsrl bench speedup --objective opd --rounds 2 --updates 3 --load 0.5 --json": (
        _SPEED,
        "its statistics",
    ),
    "tsrl bench speedup --objective grpo --json": (_SPEED, "its prediction"),
    "tsrl predict runs/bench/sync-r0 --against runs/bench/stream-r0 --json": (
        "tests/bench/test_predict.py::test_predict_cli_checks_against_a_stream_run",
        "the same command on synthetic runs",
    ),
    "tsrl bench time-to-target --json": (
        "tests/bench/test_time_to_target.py::test_bench_time_to_target_small_run",
        "3 updates, a low target",
    ),
    ".venv/bin/python deploy/docker/lock.py": (
        _DEPLOY + "test_requirements_lock_satisfies_pyproject",
        "the lock it writes",
    ),
    "bash deploy/init-secrets.sh": (_COMPOSE, "the script, then compose config"),
    "docker compose -f deploy/compose.yaml build": (
        _DEPLOY + "test_hadolint",
        "the Dockerfiles are linted; no GPU build here",
    ),
    "docker compose -f deploy/compose.yaml up -d": (_COMPOSE, "compose config; never started"),
    "docker compose -f deploy/compose.yaml ps": (_COMPOSE, "compose config; never started"),
    "docker compose -f deploy/compose.yaml down": (_COMPOSE, "compose config; never started"),
    "kubectl apply -f deploy/k8s/namespace.yaml -f deploy/k8s/secrets.local.yaml": (
        _DEPLOY + "test_kustomization_and_secret_template",
        "the secret template; never applied",
    ),
    "kubectl apply -k deploy/k8s": (_K8S, "kubernetes-validate; never applied"),
    "kubectl -n thundersync port-forward svc/tsrl-service 8000:80": (_K8S, "the service exists"),
    "ray up deploy/ray/cluster.yaml": (
        _DEPLOY + "test_ray_cluster_config_validates",
        "Ray's autoscaler schema; never started",
    ),
    "tsrl serve --launcher ray --ray-address http://HEAD:8265 --data-dir /data": (
        "tests/service/test_ray_backend.py::test_runs_go_through_ray_jobs",
        "the Ray launcher on a local cluster",
    ),
    "docker compose -f deploy/compose.yaml exec ray-head ray job submit --address "
    "http://127.0.0.1:8265 -- tsrl train grpo-smollm2-gpu --run-dir /data/runs/first-gpu "
    "--ray auto": (
        "tests/deploy/test_deploy_commands.py::test_command_is_real",
        "ray's and tsrl's options checked; never started",
    ),
    "ray job submit --address http://HEAD:8265 -- tsrl train grpo-smollm2-gpu --run-dir "
    "/data/runs/first-gpu --ray auto": (
        "tests/deploy/test_deploy_commands.py::test_command_is_real",
        "ray's and tsrl's options checked; never started",
    ),
    "kubectl -n thundersync get rayjob grpo-smollm2-gpu": (
        "tests/deploy/test_deploy_gpu_layout.py::test_rayjob_runs_the_driver_with_ray_on_the_shared_volume",
        "the RayJob's entrypoint, recipe and volumes; never applied",
    ),
    "bash deploy/gpu-smoke.sh runs/gpu-smoke": (_GPU, "with a stand-in tsrl: no GPU here"),
    "tsrl plan grpo-qwen3-8b --gpus 8 --gpu-memory 80 --host-memory 2048 --json": (
        _PLAN + "test_tsrl_plan_json_last_line_for_both_recipes",
        "the same command (it fits with per-layer checkpointing)",
    ),
    "tsrl plan opd-qwen3-32b --gpus 8 --gpu-memory 141 --host-memory 2048 --json": (
        _PLAN + "test_tsrl_plan_json_last_line_for_both_recipes",
        "the same command (it exits 1: it does not fit)",
    ),
    "tsrl bench plan-check --json": (
        _PLAN + "test_plan_check_runs_small",
        "the same check without the ~20M model (the doc's numbers include it)",
    ),
}

# Paths the docs name that a script writes (git-ignored), not the checkout.
GENERATED = {"deploy/secrets/", "deploy/secrets/admin_token", "deploy/k8s/secrets.local.yaml"}
_FENCE = re.compile(r"^```(\w*)\s*$")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_TICK = re.compile(r"`([^`\n]+)`")
_PATHY = re.compile(
    r"^(?:learner|service|sandbox|teacher|rollout|bus|bench|deploy|scripts|tests|recipes|alembic"
    r"|docs|thundersync)/[\w./-]*$"
)
_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def _blocks(path: Path) -> list[tuple[str, str]]:
    """(language, line) for every line of every fenced block."""
    out, lang = [], None
    for line in path.read_text().splitlines():
        m = _FENCE.match(line.strip())
        if m:
            lang = None if lang is not None else m.group(1)
            continue
        if lang is not None:
            out.append((lang, line))
    return out


def doc_commands(path: Path) -> list[str]:
    """The shell commands of one doc, normalised by shlex (quotes canonical, comments dropped)."""
    cmds: list[str] = []
    pending = ""
    for lang, line in _blocks(path):
        if lang == "console":
            if not line.startswith("$ "):
                continue
            line = line[2:]
        elif lang not in ("bash", "sh", "shell"):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        words = shlex.split(pending + line, comments=True)
        pending = ""
        while words and "=" in words[0] and not words[0].startswith("-"):
            words.pop(0)  # leading VAR=value
        if words and words[0] != "export":
            cmds.append(shlex.join(words))
    return cmds


def all_commands() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for doc in DOCS:
        for cmd in doc_commands(doc):
            found.setdefault(cmd, []).append(doc.name)
    return found


COMMANDS = all_commands()


def _resolve(argv: list[str]) -> tuple[Any, list[str], list[str]]:
    """Walk argv down the command groups: (command, its path, the rest)."""
    node: Any = typer.main.get_command(app)
    path: list[str] = []
    rest = list(argv)
    while hasattr(node, "commands") and rest and not rest[0].startswith("-"):
        sub = node.commands.get(rest[0])
        assert sub is not None, f"`tsrl {' '.join([*path, rest[0]])}` is not a tsrl command"
        path.append(rest.pop(0))
        node = sub
    return node, path, rest


def _tsrl_argv(cmd: str) -> list[str] | None:
    words = shlex.split(cmd)
    return words[1:] if words and Path(words[0]).name == "tsrl" else None


def test_commands_were_found() -> None:
    assert "make run" in COMMANDS and "make test" in COMMANDS
    assert any(c.startswith("tsrl train grpo-smollm2-terminal") for c in COMMANDS)


def test_every_doc_command_is_run_or_covered() -> None:
    missing = [
        f"{c}  ({', '.join(w)})" for c, w in COMMANDS.items() if c not in RUN and c not in COVERED
    ]
    assert not missing, "add these to RUN or COVERED in tests/core/test_docs.py:\n" + "\n".join(
        missing
    )
    stale = sorted((set(RUN) | set(COVERED)) - set(COMMANDS))
    assert not stale, f"no doc shows these any more (remove them): {stale}"
    for cmd, (node, _) in COVERED.items():
        file, _, func = node.partition("::")
        src = ROOT / file
        assert src.is_file(), f"{cmd}: {file} does not exist"
        assert not func or re.search(rf"^def {re.escape(func)}\(", src.read_text(), re.M), (
            f"{cmd}: {file} has no test {func}"
        )


@pytest.mark.parametrize("cmd", sorted(c for c in COMMANDS if _tsrl_argv(c) is not None))
def test_tsrl_command_parses(cmd: str) -> None:
    argv = _tsrl_argv(cmd)
    assert argv is not None
    node, path, rest = _resolve(argv)
    if "--help" in rest or not rest and hasattr(node, "commands"):
        return
    ctx = node.make_context(" ".join(["tsrl", *path]), list(rest))  # unknown option/choice: error
    sets = ctx.params.get("set_") or []
    recipe = ctx.params.get("recipe") or ctx.params.get("config")
    if isinstance(recipe, str) and not recipe.endswith((".json", ".yaml")):
        from thundersync.config import parse_set_overrides

        load_run_config(recipe, parse_set_overrides(sets))  # unknown recipe or key: ConfigError


@pytest.mark.parametrize("cmd", sorted(RUN))
def test_cheap_command_runs(cmd: str, tmp_path: Path) -> None:
    argv = shlex.split(cmd)
    # outputs go under tmp_path: commands that write take relative paths (runs/...)
    for src in ("sandbox",):
        (tmp_path / src).symlink_to(ROOT / src)
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    res = subprocess.run(
        [TSRL, *argv[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=RUN[cmd], env=env
    )
    assert res.returncode == 0, (
        f"{cmd}: exit {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}"
    )
    if cmd.startswith("tsrl bench equivalence"):
        last = json.loads(res.stdout.strip().splitlines()[-1])
        assert last["max_param_gap"] == 0.0, last


def _small_bench(args: list[str]) -> dict[str, Any]:
    res = subprocess.run(
        [TSRL, "bench", *args, "--json"], capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr[-2000:]
    out: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


def test_bench_learner_cost_runs_small() -> None:
    out = _small_bench(["learner-cost", "--model", "tiny", "--repeats", "1"])
    assert out["compute_ratio"] > 0 and out["throughput_vs_textbook"] > 0, out
    # the adds into the host sums are timed inside the backward that makes them
    assert out["host_add_s_per_source"] > 0, out
    assert 0 < out["host_add_share_of_backward"] < 1, out


def test_bench_memory_runs_small() -> None:
    out = _small_bench(["memory", "--lengths", "256", "--turns", "2,4", "--repeats", "1"])
    assert out["max_peak_ratio"] > 0, out
    # the stream's time over the textbook's, per length; the goal is judged from 4096 up only
    assert out["grpo_time_vs_textbook"]["256"] > 0, out
    assert out["max_time_vs_textbook_long"] is None and out["time_goal_met"] is False, out


def _prose_tsrl(doc: Path) -> list[str]:
    """Inline `tsrl ...` spans (usage lines with [--opt X] meta-syntax, prose mentions)."""
    return [m.strip() for m in _TICK.findall(doc.read_text()) if m.strip().split(" ")[0] == "tsrl"]


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_prose_tsrl_commands_and_flags_exist(doc: Path) -> None:
    for span in _prose_tsrl(doc):
        words = [w for w in re.split(r"[\s\[\]|\\]+", span[len("tsrl") :]) if w]
        node: Any = typer.main.get_command(app)
        path: list[str] = []
        for w in words:
            if not hasattr(node, "commands") or not re.fullmatch(r"[a-z][a-z0-9-]*", w):
                break
            assert w in node.commands, (
                f"{doc.name}: `{span}`: `tsrl {' '.join([*path, w])}` is no command"
            )
            node = node.commands[w]
            path.append(w)
        if hasattr(node, "commands"):
            continue
        opts = {o for p in node.params for o in (*p.opts, *p.secondary_opts)}
        unknown = set(_FLAG.findall(span)) - opts - {"--help"}
        assert not unknown, (
            f"{doc.name}: `{span}`: tsrl {' '.join(path)} has no option {sorted(unknown)}"
        )


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_links_and_paths_exist(doc: Path) -> None:
    text = doc.read_text()
    for target in _LINK.findall(_TICK.sub("", text)):  # not inside code spans
        if re.match(r"[a-z]+://|mailto:|#", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (doc.parent / file).resolve()
        assert dest.exists(), f"{doc.name}: link to {target}: no such file"
        if anchor and dest.suffix == ".md":
            assert anchor in _anchors(dest), f"{doc.name}: link to {target}: no such heading"
    for span in _TICK.findall(text):
        if span in GENERATED or re.search(r"[*{<]|\.\.\.|[A-Z]{3}", span):
            continue  # written by a script, or a pattern / placeholder (recipes/NAME.yaml)
        if _PATHY.match(span):
            assert (ROOT / span).exists(), f"{doc.name}: `{span}` does not exist"


def _anchors(md: Path) -> set[str]:
    heads = [
        line.lstrip("#").strip() for line in md.read_text().splitlines() if line.startswith("#")
    ]
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


def test_readme_is_a_front_door() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 160
    for must in ("make run", "make test", "tsrl train grpo-smollm2-terminal", "docs/RESULTS.md"):
        assert must in text, must
