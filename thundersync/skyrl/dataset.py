"""A SkyRL prompt dataset as a ThunderSync task set (`env.name: skyrl-dataset`).

Rows are read as SkyRL's `PromptDataset` reads them (`datasets`' parquet / json loaders): the
`prompt` messages, the `env_class` (a registered skyrl-gym id) and every other column as the
env's extras. Each row is one task; a run samples rows per update like any task set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SUFFIXES = {".parquet": "parquet", ".json": "json", ".jsonl": "json"}


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


def dataset_tasks(path: str | Path, base_extras: dict[str, Any]) -> list[Any]:
    """One `TaskRef` per row of the SkyRL dataset at `path`; `base_extras` (the run's sandbox
    settings) under each row's own extras."""
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
        label = Path(str(extras["task"])).name if "task" in extras else env_class
        refs.append(
            TaskRef(f"row{i}-{label}", env_class, base_extras | extras, tuple(prompt or ()))
        )
    if not refs:
        raise DatasetError(f"{path}: the dataset has no rows")
    return refs
