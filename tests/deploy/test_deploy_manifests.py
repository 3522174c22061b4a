"""deploy/: compose file, Dockerfiles, Kubernetes manifests and the Ray cluster config validate.

Validators come from scripts/setup.d/50-deploy.sh (docker-compose from Debian; hadolint,
kubernetes-validate, check-jsonschema and the ray wheel's autoscaler schema in .venv-deploy).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from deploy_helpers import (
    DEPLOY,
    DOCKER,
    DOCKERFILES,
    IMAGES,
    K8S,
    ROOT,
    SANDBOX_IMAGES,
    SETUP,
    TOOLS,
    compose,
    dockerfile_instructions,
    image_repo,
    load_yaml_docs,
    tool,
)


def run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=60)


# ---------------------------------------------------------------- compose


def test_compose_matches_compose_spec_schema() -> None:
    r = run(
        [
            tool("check-jsonschema"),
            "--builtin-schema",
            "vendor.compose-spec",
            str(DEPLOY / "compose.yaml"),
        ]
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_compose_config_with_rendered_secrets(tmp_path: Path) -> None:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.fail(f"docker-compose is not installed: run `sudo bash {SETUP}`")
    work = tmp_path / "deploy"
    shutil.copytree(
        DEPLOY, work, ignore=shutil.ignore_patterns("secrets", "*.env", "secrets.local.yaml")
    )
    r = run(["bash", str(work / "init-secrets.sh"), str(work)])
    assert r.returncode == 0, r.stderr
    # the rendered files carry no placeholder, and a second run keeps them
    rendered = (work / "env" / "service.env").read_text()
    assert "CHANGE_ME" not in rendered
    assert "CHANGE_ME" not in (work / "k8s" / "secrets.local.yaml").read_text()
    run(["bash", str(work / "init-secrets.sh"), str(work)])
    assert (work / "env" / "service.env").read_text() == rendered
    r = run([exe, "-f", str(work / "compose.yaml"), "config", "-q"], cwd=work)
    assert r.returncode == 0, r.stdout + r.stderr


def test_compose_stack_shape() -> None:
    doc = compose()
    svcs = doc["services"]
    for name in ["service", "postgres", "redis", "ray-head", "ray-worker"]:
        assert name in svcs, name
    # GPUs only on the Ray worker, all of them: each run starts its own engines there
    gpu = {n for n, v in svcs.items() if (v.get("deploy") or {}).get("resources")}
    assert gpu == {"ray-worker"}, gpu
    devices = svcs["ray-worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices and devices[0]["capabilities"] == ["gpu"] and devices[0]["count"] == "all"
    for name, svc in svcs.items():
        if svc.get("restart") != "no":
            assert "healthcheck" in svc, f"{name}: no healthcheck"
        image = svc["image"]
        assert ":" in image and not image.endswith(":latest"), f"{name}: unpinned image {image}"
        if image_repo(image) in IMAGES:
            assert image_repo(image) in IMAGES
    assert set(doc["secrets"]) == {"postgres_password", "redis_password"}
    for s in doc["secrets"].values():
        assert s["file"].startswith("./secrets/")


def test_compose_has_no_inline_secret() -> None:
    text = (DEPLOY / "compose.yaml").read_text()
    for name, svc in compose()["services"].items():
        env = svc.get("environment") or {}
        items = env.items() if isinstance(env, dict) else (e.split("=", 1) for e in env)
        for key, value in items:
            if re.search(r"PASSWORD|TOKEN|SECRET|DATABASE_URL|REDIS_URL", key) and not key.endswith(
                "_FILE"
            ):
                pytest.fail(f"{name}: {key} set inline; use an env file or a secret")
            assert "://" not in str(value) or "@" not in str(value), f"{name}: credentials in {key}"
    assert "requirepass" not in text or "/run/secrets/redis_password" in text
    ignored = (DEPLOY / ".gitignore").read_text()
    assert "/secrets/" in ignored and "/env/*.env" in ignored


# ---------------------------------------------------------------- Dockerfiles

PIP_VALUE_OPTIONS = {"-r", "-c", "--index-url", "--extra-index-url", "-i"}


def pip_packages(args: str) -> list[str]:
    """Package arguments of one `pip install ...` (options, their values and `-e .` dropped)."""
    out, skip = [], False
    for tok in args.split():
        if skip:
            skip = False
        elif tok in PIP_VALUE_OPTIONS or tok == "-e":
            skip = True
        elif not tok.startswith("-"):
            out.append(tok)
    return out


@pytest.mark.parametrize("path", DOCKERFILES, ids=[p.name for p in DOCKERFILES])
def test_hadolint(path: Path) -> None:
    r = run([tool("hadolint"), "--failure-threshold", "info", str(path)])
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("path", DOCKERFILES, ids=[p.name for p in DOCKERFILES])
def test_dockerfile_pins_and_user(path: Path) -> None:
    ins = dockerfile_instructions(path)
    for word, arg in ins:
        if word == "FROM":
            image = arg.split()[0]
            if image.startswith("${"):
                default = next(a for w, a in ins if w == "ARG" and a.startswith("PYTHON_IMAGE="))
                image = default.split("=", 1)[1]
            assert re.search(r":[0-9][^ ]*|@sha256:", image), f"{path.name}: unpinned base {image}"
        if word == "RUN" and "pip install" in arg:
            for part in arg.split("pip install")[1:]:
                for p in pip_packages(part.split("&&")[0]):
                    assert "==" in p, f"{path.name}: unpinned pip package {p!r}"
        if word == "RUN" and "apt-get install" in arg:
            pkgs = [
                t
                for t in arg.split("apt-get install", 1)[1].split("&&")[0].split()
                if not t.startswith("-")
            ]
            for p in pkgs:
                assert "=" in p, f"{path.name}: unpinned apt package {p!r}"
    users = [a for w, a in ins if w == "USER"]
    assert users and re.fullmatch(r"[1-9][0-9]*:[1-9][0-9]*", users[-1]), (
        f"{path.name}: USER {users}"
    )


def test_tsrl_images_are_multi_stage_and_ignore_build_junk() -> None:
    for df in DOCKERFILES:
        if df.name in SANDBOX_IMAGES:
            continue
        froms = [a for w, a in dockerfile_instructions(df) if w == "FROM"]
        assert len(froms) >= 2, f"{df.name}: expected a build stage and a runtime stage"
        ignore = (DOCKER / f"{df.name}.dockerignore").read_text().split()
        assert ".venv" in ignore and ".git" in ignore
    learner = (DOCKER / "learner.Dockerfile").read_text()
    assert "torch==2.13.0" in learner and "download.pytorch.org/whl/${TORCH_CUDA}" in learner
    # the GPU image runs the vLLM replica actors: the engine image's vLLM venv, same pins
    engine = (DOCKER / "engine.Dockerfile").read_text()
    for text in (learner, engine):
        assert "TSRL_VLLM_PYTHON=/opt/vllm/bin/python" in text
        assert "/opt/vllm/bin/pip install vllm==0.32.0 torch==2.13.0" in text
    assert "COPY --from=vllm /opt/vllm /opt/vllm" in learner


def test_images_install_the_pinned_skyrl() -> None:
    """The learner and service images install the skyrl of scripts/skyrl-requirements.txt."""
    root = DOCKER.parents[1]
    pin = next(
        line
        for line in (root / "scripts" / "skyrl-requirements.txt").read_text().splitlines()
        if line.startswith("skyrl==")
    )
    for name in ("learner", "service"):
        text = (DOCKER / f"{name}.Dockerfile").read_text()
        assert f"--ignore-requires-python {pin}" in text, name
        assert "COPY scripts/skyrl-requirements.txt" in text, name


def test_requirements_lock_satisfies_pyproject() -> None:
    tomllib = pytest.importorskip("tomllib")
    from packaging.requirements import Requirement

    lock = {}
    for line in (DOCKER / "requirements.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            req = Requirement(line)
            lock[req.name.lower().replace("_", "-")] = next(iter(req.specifier)).version
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for dep in deps:
        req = Requirement(dep)
        name = req.name.lower().replace("_", "-")
        assert name in lock, f"{name} missing from deploy/docker/requirements.lock (run lock.py)"
        assert req.specifier.contains(lock[name], prereleases=True), f"{dep} vs lock {lock[name]}"
    assert lock["ray"] == "2.60.0"


# ---------------------------------------------------------------- Kubernetes

STANDARD = [
    "namespace.yaml",
    "storage.yaml",
    "configmap-recipe.yaml",
    "postgres.yaml",
    "redis.yaml",
    "service.yaml",
    "secrets.yaml",
]


def test_kubernetes_manifests_validate() -> None:
    r = run([tool("kubernetes-validate"), "--strict", "--quiet", *[str(K8S / f) for f in STANDARD]])
    assert r.returncode == 0, r.stdout + r.stderr


def test_kuberay_pod_templates_validate(tmp_path: Path) -> None:
    """RayCluster has no schema in kubernetes-validate: check its pod templates as v1 Pods."""
    (cluster,) = load_yaml_docs(K8S / "raycluster.yaml")
    assert cluster["apiVersion"] == "ray.io/v1" and cluster["kind"] == "RayCluster"
    spec = cluster["spec"]
    assert spec["rayVersion"] == "2.60.0"
    templates = [("head", spec["headGroupSpec"])] + [
        (g["groupName"], g) for g in spec["workerGroupSpecs"]
    ]
    pods = []
    for name, group in templates:
        assert all(isinstance(v, str) for v in group["rayStartParams"].values()), name
        pods.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"ray-{name}"},
                "spec": group["template"]["spec"],
            }
        )
        assert (
            image_repo(group["template"]["spec"]["containers"][0]["image"]) == "thundersync/learner"
        )
    out = tmp_path / "pods.yaml"
    out.write_text(yaml.safe_dump_all(pods))
    r = run([tool("kubernetes-validate"), "--strict", "--quiet", str(out)])
    assert r.returncode == 0, r.stdout + r.stderr
    gpus = [
        c
        for _, g in templates
        for c in g["template"]["spec"]["containers"]
        if "nvidia.com/gpu" in c["resources"].get("limits", {})
    ]
    assert {c["name"] for c in gpus} == {"ray-worker"}  # no engine sidecar, no GPU on the head

    (job,) = load_yaml_docs(K8S / "rayjob.yaml")
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    assert job["spec"]["clusterSelector"]["ray.io/cluster"] == cluster["metadata"]["name"]
    recipe = job["spec"]["entrypoint"].split()[2]
    (cm,) = load_yaml_docs(K8S / "configmap-recipe.yaml")
    assert recipe.startswith("/config/") and recipe.removeprefix("/config/") in cm["data"]


def test_kustomization_and_secret_template() -> None:
    (kust,) = load_yaml_docs(K8S / "kustomization.yaml")
    for res in kust["resources"]:
        assert (K8S / res).exists(), res
    assert "secrets.yaml" not in kust["resources"]
    for doc in load_yaml_docs(K8S / "secrets.yaml"):
        assert doc["kind"] == "Secret"
        for key, value in doc["stringData"].items():
            assert "CHANGE_ME" in value, (
                f"{doc['metadata']['name']}.{key}: template must hold placeholders only"
            )


def test_recipe_configmap_loads(tmp_path: Path) -> None:
    from thundersync.config import load_run_config

    (cm,) = load_yaml_docs(K8S / "configmap-recipe.yaml")
    for name, text in cm["data"].items():
        path = tmp_path / name
        path.write_text(text)
        cfg = load_run_config(str(path), {})
        assert cfg is not None
        repo = ROOT / "recipes" / name
        if repo.exists():
            assert yaml.safe_load(text) == yaml.safe_load(repo.read_text()), (
                f"{name} drifted from recipes/"
            )


# ---------------------------------------------------------------- Ray cluster launcher


def test_ray_cluster_config_validates() -> None:
    schema = next(
        (TOOLS.parent / "lib").glob("python3*/site-packages/ray/autoscaler/ray-schema.json"), None
    )
    if schema is None:
        pytest.fail(f"ray's autoscaler schema is missing: run `sudo bash {SETUP}`")
    path = DEPLOY / "ray" / "cluster.yaml"
    r = run([tool("check-jsonschema"), "--schemafile", str(schema), str(path)])
    assert r.returncode == 0, r.stdout + r.stderr
    cfg = yaml.safe_load(path.read_text())
    if cfg["provider"]["type"] == "local":  # ray's prepare_local refuses these fields
        for field in ("available_node_types", "head_node", "worker_nodes"):
            assert not cfg.get(field), field
    assert image_repo(cfg["docker"]["image"]) == "thundersync/learner"
