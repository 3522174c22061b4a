"""SkyRL's own trainer loop with ThunderSync's streaming learner, on CPU: the second switch.

    python -m skyrl.train.entrypoints.main_base \
      trainer.override_entrypoint=thundersync.skyrl.loop <the run's SkyRL overrides>

runs SkyRL's experiment (`BasePPOExp`: its tokenizer, datasets, tracker, `SkyRLGymGenerator` and
`RayPPOTrainer.train()`) with `ThunderSyncTrainer`; `tsrl.loop=sync` runs the same experiment
batch-synchronously on `SkyRLBatchWorker` instead, `tsrl.loop=async` with SkyRL's fully-async
trainer (the comparisons `tsrl bench skyrl` times). OPD is SkyRL's distillation recipe.
It runs in this process on an in-process HF engine: the CPU form of SkyRL's loop, for the
equivalence and speed checks and small runs. `thundersync.skyrl.entrypoint` stays the switch for
real runs (vLLM engines, sandboxes, several learner ranks, the service).
"""

from __future__ import annotations

import json
import os
import sys
from enum import StrEnum
from typing import Any

import torch
from skyrl.train.entrypoints.main_base import BasePPOExp
from skyrl.train.trainer import RayPPOTrainer

import thundersync.sandbox.envs  # noqa: F401  (registers the tsrl-* skyrl-gym environments)
import thundersync.skyrl  # noqa: F401  (prepares the interpreter before skyrl is imported)
from thundersync.cluster.placement import core_split
from thundersync.config import RunConfig
from thundersync.learner.device import DTYPES
from thundersync.rollout.hf_engine import HFEngine
from thundersync.skyrl.hf_client import HFInferenceClient
from thundersync.skyrl.trainers import (
    SkyRLAsyncCPUTrainer,
    SkyRLSyncCPUTrainer,
    StreamingGymGenerator,
    ThunderSyncTrainer,
    check_cpu_loop,
)


class LoopMode(StrEnum):
    STREAM = "stream"  # ThunderSyncTrainer
    SYNC = "sync"  # SkyRL's batch-synchronous update, for comparison
    ASYNC = "async"  # SkyRL's fully-async trainer (trainer.fully_async.*), for comparison


class CPUExp(BasePPOExp):
    """SkyRL's experiment with the in-process engine and the CPU policy workers."""

    def __init__(
        self, cfg: Any, run: RunConfig, mode: LoopMode, *, pin: bool = False, record: bool = False
    ) -> None:
        """`pin`: generation threads on all cores but the last, the learner on the last, one
        torch thread each (as `tsrl train` splits a CPU node); `record`: keep each update's
        gradient (the workers' `grads`). Every logged metric dict is kept in `self.logged`."""
        self.run_config, self.mode, self.record = run, mode, record
        self.rollout_cores, self.learner_core = core_split(True) if pin else (None, None)
        self.logged: list[dict[str, Any]] = []
        super().__init__(cfg)

    def get_tracker(self) -> Any:
        tracker = super().get_tracker()
        log = tracker.log

        def recorded(data: dict[str, Any], *args: Any, **kw: Any) -> None:
            self.logged.append(dict(data))
            log(data, *args, **kw)

        tracker.log = recorded
        return tracker

    def get_colocate_pg(self, timeout: int = 0) -> None:
        return None  # one process: nothing to place

    def get_train_dataset(self) -> Any:
        return self._dataset(self.cfg.data.train_data)

    def get_eval_dataset(self) -> Any:
        data = self.cfg.data.val_data
        return self._dataset(data) if self.cfg.trainer.eval_interval > 0 and data else None

    def _dataset(self, files: list[str]) -> Any:
        # SkyRL's own reader, filtered in this process (its 8-process filter pool is for nodes)
        from skyrl.train.dataset import PromptDataset

        return PromptDataset(
            datasets=files,
            tokenizer=self.tokenizer,
            max_prompt_length=self.cfg.trainer.max_prompt_length,
            num_workers=1,
        )

    def get_inference_client(self) -> HFInferenceClient:
        path = self.cfg.trainer.policy.model.path
        engine = HFEngine(path, dtype=DTYPES[self.run_config.model.dtype])
        return HFInferenceClient(
            engine,
            self.tokenizer,
            str(path),
            seed=self.cfg.trainer.seed,
            cores=self.rollout_cores,
            concurrency=self.run_config.rollout.concurrency,
            zero_staleness=self.mode is not LoopMode.ASYNC,
        )

    def get_generator(self, cfg: Any, tokenizer: Any, inference_engine_client: Any) -> Any:
        return StreamingGymGenerator(
            generator_cfg=cfg.generator,
            skyrl_gym_cfg=cfg.environment.skyrl_gym,
            inference_engine_client=inference_engine_client,
            tokenizer=tokenizer,
        )

    def get_trainer(self, cfg: Any, tracker: Any, tokenizer: Any, *args: Any, **kw: Any) -> Any:
        cls: type[Any] = {
            LoopMode.STREAM: ThunderSyncTrainer,
            LoopMode.SYNC: SkyRLSyncCPUTrainer,
            LoopMode.ASYNC: SkyRLAsyncCPUTrainer,
        }[self.mode]
        trainer = cls(cfg, tracker, tokenizer, *args, **kw)
        trainer.run_config, trainer.learner_core = self.run_config, self.learner_core
        trainer.record_grads = self.record
        return trainer

    def _setup_trainer(self) -> RayPPOTrainer:
        tracker = self.get_tracker()
        client = self.get_inference_client()
        trainer = self.get_trainer(
            cfg=self.cfg,
            tracker=tracker,
            tokenizer=self.tokenizer,
            train_dataset=self.train_dataset,
            eval_dataset=self.eval_dataset,
            inference_engine_client=client,
            generator=self.get_generator(self.cfg, self.tokenizer, client),
            colocate_pg=None,
        )
        self.trainer = trainer
        trainer.build_models(None, None, None)
        return trainer

    def run(self) -> None:
        if self.learner_core is None:
            return super().run()
        torch.set_num_threads(1)  # each side computes on its own core, as the threads are pinned
        mask = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {self.learner_core})  # the loop's thread: SkyRL's batch update
        try:
            super().run()
        finally:
            os.sched_setaffinity(0, mask)


def experiment(argv: list[str], *, pin: bool = False, record: bool = False) -> CPUExp:
    """SkyRL's config from its command line (`tsrl.*` settings apart), checked and translated."""
    from skyrl.train.config import SkyRLTrainConfig
    from skyrl.train.utils import validate_cfg

    from thundersync.skyrl.entrypoint import split_args
    from thundersync.skyrl.registry import register
    from thundersync.skyrl.translate import run_config_from_skyrl

    register()  # ThunderSync's estimators and loss, before SkyRL validates the config
    skyrl_args, ours = split_args(argv)
    mode = LoopMode(ours.pop("loop", LoopMode.STREAM.value))
    cfg = SkyRLTrainConfig.from_cli_overrides(skyrl_args)
    validate_cfg(cfg)
    check_cpu_loop(cfg)
    if mode is LoopMode.ASYNC:  # its off-policy loss has no streaming form: the learner
        # settings are not used, only the model and optimiser of the translation
        skyrl_args = [*skyrl_args, "trainer.algorithm.policy_loss_type=regular"]
        run = run_config_from_skyrl(SkyRLTrainConfig.from_cli_overrides(skyrl_args), ours)
    else:
        run = run_config_from_skyrl(cfg, ours)
    return CPUExp(cfg, run, mode, pin=pin, record=record)


def main() -> None:
    """Called by SkyRL's `main_base.main()` with `trainer.override_entrypoint=` this module."""
    exp = experiment(sys.argv[1:])
    exp.run()
    steps = sum("trainer/global_step" in d for d in exp.logged)
    print(json.dumps({"loop": exp.mode.value, "steps": steps}))


if __name__ == "__main__":
    from skyrl.train.entrypoints.main_base import main as skyrl_main

    skyrl_main()
