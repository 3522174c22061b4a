"""A SkyRL prompt dataset as a ThunderSync task set (`env.name: skyrl-dataset`).

Rows are read as SkyRL's `PromptDataset` reads them (`datasets`' parquet / json loaders): the
`prompt` messages, the `env_class` (a registered skyrl-gym id) and every other column as the
env's extras. Each row is one task; a run samples rows per update like any task set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SUFFIXES = {".parquet": "parquet", ".json": "json", ".jsonl": "json"}
# extras that name files: a relative one is read from the dataset's folder
PATH_COLUMNS = ("task", "instances_path", "repos_dir")
# extras only ThunderSync sets (an executor object is injected by tests and `tsrl env check`)
RESERVED_COLUMNS = ("executor",)


class DatasetError(ValueError):
    """A dataset row ThunderSync cannot run, named by file, row and column."""


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    import datasets

    p = Path(path)
    kind = SUFFIXES.get(p.suffix)
    if kind is None:
        raise DatasetError(f"{p}: a SkyRL dataset is a {', '.join(SUFFIXES)} file")
    ds = datasets.load_dataset(kind, data_files=str(p), keep_in_memory=True)["train"]
    return [dict(r) for r in ds]


def _path_column(path: Path, i: int, column: str, value: Any, confined: bool) -> str:
    """A row's file column as an absolute path: relative ones from the dataset's folder; with
    `confined` (service runs) only relative ones that stay inside that folder."""
    root = path.resolve().parent
    p = Path(str(value))
    if confined and (p.is_absolute() or not (root / p).resolve().is_relative_to(root)):
        raise DatasetError(
            f"{path.name}: row {i}: {column} {str(value)!r} leaves the task set: give a path "
            "relative to the dataset file, inside its folder (e.g. tasks/echo-word)"
        )
    return str(p if p.is_absolute() else (root / p).resolve())


def dataset_tasks(
    path: str | Path, base_extras: dict[str, Any], *, confined: bool = False
) -> list[Any]:
    """One `TaskRef` per row of the SkyRL dataset at `path`. The run's settings
    (`base_extras`: sandbox backend, pool, max_turns) win over a row's columns of the same name,
    as SkyRL's generator sets max_turns over the row's."""
    from skyrl_gym.envs.registration import registry

    from thundersync.sandbox.envs.catalogue import TaskRef

    refs = []
    for i, row in enumerate(read_rows(path)):
        prompt = row.pop("prompt", None)
        env_class = row.pop("env_class", None)
        if not env_class:
            raise DatasetError(f"{path}: row {i}: env_class is empty: name a skyrl-gym env id")
        if env_class not in registry:
            raise DatasetError(
                f"{path}: row {i}: env_class {env_class!r} is not a registered skyrl-gym env; "
                f"registered: {', '.join(sorted(registry))}"
            )
        if prompt is not None and not (
            isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt)
        ):
            raise DatasetError(f"{path}: row {i}: prompt must be a list of chat messages")
        extras = {k: v for k, v in row.items() if v is not None}
        for column in RESERVED_COLUMNS:
            if column in extras:
                raise DatasetError(
                    f"{Path(path).name}: row {i}: column {column!r} is ThunderSync's to set; "
                    "remove it from the dataset"
                )
        for column in PATH_COLUMNS:
            if column in extras:
                extras[column] = _path_column(Path(path), i, column, extras[column], confined)
        label = Path(str(extras["task"])).name if "task" in extras else env_class
        refs.append(
            TaskRef(f"row{i}-{label}", env_class, extras | base_extras, tuple(prompt or ()))
        )
    if not refs:
        raise DatasetError(f"{path}: the dataset has no rows")
    return refs
