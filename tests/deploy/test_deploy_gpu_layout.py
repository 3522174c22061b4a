"""What runs where in deploy/: drivers on a GPU-less Ray head with `--ray`, learner ranks and engines
on whole 8-GPU workers, run directories absolute on the shared volume, /dev/shm sized for the
weight slots, and no setting the code never reads. Checked against the real CLI (`tsrl train`'s
options), the real config (recipes load, `publish.keep_last`) and the real placement planner."""

from __future__ import annotations

import re
import shlex
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import typer
import yaml
from deploy_helpers import DEPLOY, K8S, ROOT, compose, image_entry, load_yaml_docs

from thundersync.cli import app
from thundersync.cluster.ray_plan import NodeResources, PlacementError, plan_placement
from thundersync.config import RunConfig, load_run_config

GIB = 1 << 30
WORKER_GPUS = 8
# NCCL's intra-node buffers, vLLM's shared-memory queues, torch multiprocessing: what /dev/shm
# holds besides the Ray object store and the weight slots
SHM_MARGIN = 8 * GIB
DTYPE_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2}


def quantity(text: str) -> int:
    """Bytes of a Kubernetes quantity ("64Gi") or a docker size ("64g", "64gb"; 1024-based)."""
    m = re.fullmatch(r"(\d+)\s*([KMGT]i|[kmgt]b?)?", str(text).strip())
    assert m, f"not a size: {text!r}"
    unit = (m.group(2) or "").lower().rstrip("ib")
    return int(m.group(1)) * 1024 ** " kmgt".index(unit or " ")


def shm_needed(params: float, dtype: str, keep_last: int, object_store: int) -> int:
    """/dev/shm of the node where learner rank 0 runs (docs/deploy.md): `keep_last` weight slots
    of the policy in its own dtype, the Ray object store, and a margin."""
    return int(keep_last * params * DTYPE_BYTES[dtype]) + object_store + SHM_MARGIN


def raycluster() -> dict[str, Any]:
    (doc,) = load_yaml_docs(K8S / "raycluster.yaml")
    return doc


def rayjob_argv() -> list[str]:
    (job,) = load_yaml_docs(K8S / "rayjob.yaml")
    return shlex.split(job["spec"]["entrypoint"])


def recipe(name: str, tmp_path: Path) -> RunConfig:
    (cm,) = load_yaml_docs(K8S / "configmap-recipe.yaml")
    path = tmp_path / name
    path.write_text(cm["data"][name])
    return load_run_config(str(path), {})


def option(argv: list[str], name: str) -> str:
    assert name in argv, f"{name} missing from {argv}"
    return argv[argv.index(name) + 1]


def train_options() -> set[str]:
    cmd: Any = typer.main.get_command(app)
    return {o for p in cmd.commands["train"].params for o in p.opts}


def volume_mounts(spec: dict[str, Any], claim: str) -> set[str]:
    """Mount paths of the PVC `claim` in a pod spec's containers."""
    names = {
        v["name"]
        for v in spec.get("volumes", [])
        if v.get("persistentVolumeClaim", {}).get("claimName") == claim
    }
    return {
        m["mountPath"]
        for c in spec["containers"]
        for m in c.get("volumeMounts", [])
        if m["name"] in names
    }


def shm_limit(spec: dict[str, Any]) -> int:
    (vol,) = [v for v in spec["volumes"] if v["name"] == "shm"]
    assert vol["emptyDir"]["medium"] == "Memory"
    mounts = {m["mountPath"] for m in spec["containers"][0]["volumeMounts"] if m["name"] == "shm"}
    assert mounts == {"/dev/shm"}
    return quantity(vol["emptyDir"]["sizeLimit"])


# ---------------------------------------------------------------- KubeRay


def test_head_has_no_gpu_and_no_engine_sidecar() -> None:
    head = raycluster()["spec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0"
    assert head["rayStartParams"]["num-cpus"] == "0"  # no learner / engine actor on the head
    (container,) = head["template"]["spec"]["containers"]
    assert "nvidia.com/gpu" not in str(container["resources"])
    # the engine URLs of the removed sidecars were read nowhere
    assert "TSRL_TEACHER_URL" not in str(container) and "TSRL_ROLLOUT_URL" not in str(container)


def test_worker_groups_are_whole_gpu_nodes() -> None:
    groups = raycluster()["spec"]["workerGroupSpecs"]
    assert groups
    for g in groups:
        assert g["rayStartParams"]["num-gpus"] == str(WORKER_GPUS), g["groupName"]
        ray = g["template"]["spec"]["containers"][0]
        res = ray["resources"]
        assert res["requests"]["nvidia.com/gpu"] == WORKER_GPUS, g["groupName"]
        assert res["limits"]["nvidia.com/gpu"] == WORKER_GPUS, g["groupName"]
        assert ray["image"].startswith("thundersync/learner:")  # the image with vLLM


def test_rayjob_runs_the_driver_with_ray_on_the_shared_volume(tmp_path: Path) -> None:
    argv = rayjob_argv()
    assert argv[:2] == ["tsrl", "train"]
    assert {"--ray", "--run-dir"} <= train_options()  # the options the real command has
    assert option(argv, "--ray") == "auto"  # the job's own cluster (RAY_ADDRESS in a job)
    run_dir = PurePosixPath(option(argv, "--run-dir"))
    assert run_dir.is_absolute(), run_dir
    head = raycluster()["spec"]["headGroupSpec"]["template"]["spec"]
    (data,) = volume_mounts(head, "tsrl-data")
    assert run_dir.is_relative_to(data)
    # the service reads the same directories: its --data-dir is that mount too
    (service,) = [d for d in load_yaml_docs(K8S / "service.yaml") if d["kind"] == "Deployment"]
    spec = service["spec"]["template"]["spec"]
    assert option(spec["containers"][0]["args"], "--data-dir") == data
    assert volume_mounts(spec, "tsrl-data") == {data}
    for g in raycluster()["spec"]["workerGroupSpecs"]:
        assert volume_mounts(g["template"]["spec"], "tsrl-data") == {data}
    cfg = recipe(PurePosixPath(argv[2]).name, tmp_path)
    assert cfg.model.path and PurePosixPath(cfg.model.path).is_absolute()  # shared /models


def test_rayjob_recipe_places_learner_and_engines_on_workers(tmp_path: Path) -> None:
    cfg = recipe(PurePosixPath(rayjob_argv()[2]).name, tmp_path)
    spec = raycluster()["spec"]
    head_params = spec["headGroupSpec"]["rayStartParams"]
    head = NodeResources(
        "head", "10.0.0.1", float(head_params["num-gpus"]), float(head_params["num-cpus"])
    )
    workers = [
        NodeResources(
            f"{g['groupName']}-{i}",
            f"10.0.1.{i}",
            float(g["rayStartParams"]["num-gpus"]),
            float(g["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"]),
        )
        for g in spec["workerGroupSpecs"]
        for i in range(g["replicas"])
    ]
    plan = plan_placement(cfg, [head, *workers])
    roles = {s.role.value for s in plan.slots}
    assert {"learner", "rollout"} <= roles and all(s.gpus >= 1 for s in plan.slots)
    with pytest.raises(PlacementError):  # the head alone holds none of it
        plan_placement(cfg, [head])


def test_worker_shm_holds_two_weight_slots(tmp_path: Path) -> None:
    cfg = recipe(PurePosixPath(rayjob_argv()[2]).name, tmp_path)
    keep_last = cfg.publish.keep_last  # the code's default: slots the publisher cycles through
    assert keep_last >= 2
    for g in raycluster()["spec"]["workerGroupSpecs"]:
        meta = g["template"]["metadata"]["annotations"]
        params = float(meta["thundersync.io/shm-sized-for-params"])
        dtype = meta["thundersync.io/shm-sized-for-dtype"]
        assert params >= 8e9 and dtype == cfg.model.dtype
        store = int(g["rayStartParams"]["object-store-memory"])
        spec = g["template"]["spec"]
        need = shm_needed(params, dtype, keep_last, store)
        assert shm_limit(spec) >= need, (shm_limit(spec) / GIB, need / GIB)
        # an emptyDir in memory counts against the pod's memory limit
        assert quantity(spec["containers"][0]["resources"]["limits"]["memory"]) > shm_limit(spec)


def sizing() -> tuple[float, str]:
    meta = raycluster()["spec"]["workerGroupSpecs"][0]["template"]["metadata"]["annotations"]
    return float(meta["thundersync.io/shm-sized-for-params"]), meta[
        "thundersync.io/shm-sized-for-dtype"
    ]


def ray_flag(argv: list[str], name: str) -> str | None:
    for a in argv:
        if a.startswith(f"{name}="):
            return a.split("=", 1)[1]
    return None


# ---------------------------------------------------------------- compose


def test_compose_head_has_no_gpu_and_worker_shm_fits() -> None:
    svcs = compose()["services"]
    head = svcs["ray-head"]["entrypoint"] + svcs["ray-head"]["command"]
    assert ray_flag(head, "--num-gpus") == "0" and ray_flag(head, "--num-cpus") == "0"
    worker = svcs["ray-worker"]["entrypoint"] + svcs["ray-worker"]["command"]
    store = ray_flag(worker, "--object-store-memory")
    assert store is not None
    params, dtype = sizing()
    need = shm_needed(params, dtype, RunConfig().publish.keep_last, int(store))
    assert quantity(svcs["ray-worker"]["shm_size"]) >= need
    # the service and every Ray node see run directories at the same absolute path
    args = svcs["service"]["command"]
    data = option(args, "--data-dir")
    assert PurePosixPath(data).is_absolute()
    for name in ("service", "ray-head", "ray-worker"):
        assert f"tsrl-data:{data}" in svcs[name]["volumes"], name


# ---------------------------------------------------------------- Ray cluster launcher


def test_ray_cluster_launcher_layout() -> None:
    cfg = yaml.safe_load((DEPLOY / "ray" / "cluster.yaml").read_text())
    head = shlex.split(cfg["head_start_ray_commands"][-1].split(";", 1)[1])
    assert ray_flag(head, "--num-gpus") == "0" and ray_flag(head, "--num-cpus") == "0"
    worker = shlex.split(cfg["worker_start_ray_commands"][-1].split(";", 1)[1])
    store = ray_flag(worker, "--object-store-memory")
    assert store is not None
    opts = cfg["docker"]["worker_run_options"]
    assert "--gpus all" in opts
    (shm,) = [o.split("=", 1)[1] for o in opts if o.startswith("--shm-size=")]
    params, dtype = sizing()
    assert quantity(shm) >= shm_needed(params, dtype, RunConfig().publish.keep_last, int(store))
    mounts = " ".join(cfg["docker"]["run_options"])
    assert ":/data" in mounts and ":/models" in mounts


# ---------------------------------------------------------------- images and settings


def test_learner_image_default_run_dir_is_absolute() -> None:
    _, cmd = image_entry("learner.Dockerfile")
    assert PurePosixPath(option(cmd, "--run-dir")).is_absolute()


def _deploy_texts() -> dict[str, str]:
    files = [DEPLOY / "compose.yaml", DEPLOY / "ray" / "cluster.yaml"]
    files += sorted((DEPLOY / "env").glob("*.example"))
    files += sorted(K8S.glob("*.yaml")) + sorted((DEPLOY / "docker").glob("*.Dockerfile"))
    return {str(f.relative_to(ROOT)): f.read_text() for f in files}


def _code_text() -> str:
    dirs = ["thundersync", "bus", "learner", "rollout", "teacher", "sandbox", "service", "bench"]
    return "\n".join(
        p.read_text() for d in dirs for p in sorted((ROOT / d).rglob("*.py")) if p.is_file()
    )


def test_every_tsrl_setting_in_deploy_is_read_by_the_code() -> None:
    """A TSRL_* variable deploy/ sets (not a compose ${...} substitution) is read somewhere: the
    engine sidecars' TSRL_TEACHER_URL / TSRL_ROLLOUT_URL were read nowhere."""
    texts = _deploy_texts()
    # readers: the code, and deploy/'s own scripts (a healthcheck reading os.environ)
    code = _code_text() + "".join(re.findall(r"environ\.get\([^)]*\)", "".join(texts.values())))
    unread = []
    for where, text in texts.items():
        for name in sorted(set(re.findall(r"(?<!\$\{)\bTSRL_[A-Z0-9_]+\b", text))):
            if f'"{name}"' not in code and f"'{name}'" not in code:
                unread.append(f"{where}: {name}")
    assert not unread, f"set in deploy/ but read by no code (wire or remove): {unread}"
