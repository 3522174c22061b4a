"""SkyRL's own trainer loop on CPU: batch-synchronous as SkyRL runs it, or streaming with
ThunderSync's learner.

Both are SkyRL's `RayPPOTrainer`: its dataloader, generator input, `SkyRLGymGenerator` agent loop,
reward post-processing, `convert_to_training_input`, advantage computation, metrics and weight
sync all run unchanged. What differs is the policy update:

- `SkyRLSyncCPUTrainer` keeps SkyRL's update path (old log-prob forward, advantages, loss-reduction
  scaling, `forward_backward` and `optim_step` per mini-batch) on `SkyRLBatchWorker`.
- `ThunderSyncTrainer` opens an update before generation; `StreamingGymGenerator` hands each
  trajectory to the streaming learner the moment SkyRL's agent loop returns it (reward fixed),
  so backward passes run while other trajectories still generate. After generation only the
  barrier and the step remain: no old-log-prob forward, no batch backward.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

from skyrl.train.fully_async_trainer import FullyAsyncRayPPOTrainer
from skyrl.train.generators.skyrl_gym_generator import SkyRLGymGenerator, StepWiseOutput
from skyrl.train.trainer import RayPPOTrainer

import thundersync.skyrl  # noqa: F401  (prepares the interpreter before skyrl is imported)
from thundersync.config import RunConfig
from thundersync.hf_models import load_model
from thundersync.learner.device import DTYPES
from thundersync.learner.trainer import Learner
from thundersync.skyrl.cpu_workers import SkyRLBatchWorker, StreamingWorker
from thundersync.skyrl.local_dispatch import LocalDispatch
from thundersync.skyrl.opd_stream import OpdTurns
from thundersync.skyrl.registry import SkyRLName
from thundersync.skyrl.switch import SkyRLConfigError
from thundersync.teacher.scorer import HFScorer

TRAIN_PHASE = "train"


class StreamingGymGenerator(SkyRLGymGenerator):
    """SkyRL's gym generator that reports each training trajectory as its agent loop returns."""

    on_trajectory: Callable[[str, int, Any], None] | None = None

    async def agent_loop(self, *args: Any, **kwargs: Any) -> Any:
        out = await super().agent_loop(*args, **kwargs)
        tid = kwargs.get("trajectory_id")
        phase = kwargs.get("training_phase", TRAIN_PHASE)
        if self.on_trajectory is not None and tid is not None and phase == TRAIN_PHASE:
            if isinstance(out, StepWiseOutput):
                raise SkyRLConfigError(
                    "generator.step_wise_trajectories=true: the streaming trainer takes one "
                    "trajectory per sample; set it to false"
                )
            self.on_trajectory(str(tid.instance_id), int(tid.repetition_id), out)
        return out


def check_cpu_loop(cfg: Any) -> None:
    """What SkyRL's loop on the CPU workers cannot run, refused by SkyRL field."""
    t, g = cfg.trainer, cfg.generator
    if g.inference_engine.enable_ray_prometheus_stats:
        raise SkyRLConfigError(
            "generator.inference_engine.enable_ray_prometheus_stats: the in-process engine has "
            "no vLLM servers to scrape; set it to false"
        )
    if sys.version_info < (3, 12) and cfg.data.dataloader.num_workers > 0:
        raise SkyRLConfigError(
            "data.dataloader.num_workers: SkyRL's dataloader workers start a fresh interpreter "
            "that imports skyrl without the Python 3.11 compat step; set it to 0"
        )
    if t.critic.model.path:
        raise SkyRLConfigError("trainer.critic.model.path: the CPU loop trains the policy only")
    if t.algorithm.use_kl_in_reward and not is_opd(cfg):
        raise SkyRLConfigError(
            "trainer.algorithm.use_kl_in_reward: only SkyRL's distillation recipe (advantage "
            f"estimator {SkyRLName.OPD.value}) runs a reference model here: set it to false"
        )
    if is_opd(cfg) and not (t.algorithm.use_kl_in_reward and t.ref.model.path):
        raise SkyRLConfigError(
            "trainer.algorithm.use_kl_in_reward: SkyRL's distillation recipe scores with the "
            "reference model (trainer.ref.model.path) through the reward: set it to true"
        )
    if g.zero_reward_on_non_stop:
        raise SkyRLConfigError(
            "generator.zero_reward_on_non_stop: it rewrites rewards after the agent loop, where "
            "the streaming learner already took them; set it to false"
        )
    if t.algorithm.temperature != 1.0:
        raise SkyRLConfigError(
            "generator.sampling_params.temperature: the learner's log-probs are the policy's raw "
            f"ones; sample at 1.0 (got {t.algorithm.temperature})"
        )


def is_opd(cfg: Any) -> bool:
    return bool(cfg.trainer.algorithm.advantage_estimator == SkyRLName.OPD.value)


def _policy(cfg: Any, run: RunConfig, path: str | None = None) -> Any:
    return load_model(path or cfg.trainer.policy.model.path, dtype=DTYPES[run.model.dtype])


def distillation_rewards(data: Any) -> Any:
    """SkyRL's on-policy distillation recipe (its example trainer's `apply_reward_kl_penalty`):
    the token rewards are log pi_T - log pi over the loss mask, the task reward is not used."""
    data["rewards"] = (data["base_action_log_probs"] - data["action_log_probs"]) * data["loss_mask"]
    return data


def _dispatch(trainer: Any, worker: Any) -> LocalDispatch:
    """A dispatch for `worker`, with the teacher as SkyRL's reference model under OPD."""
    ref = None
    if is_opd(trainer.cfg):
        teacher = _policy(trainer.cfg, trainer.run_config, trainer.cfg.trainer.ref.model.path)
        ref = SkyRLBatchWorker(teacher, trainer.run_config, trainer.cfg.trainer.algorithm)
    return LocalDispatch(worker, trainer.inference_engine_client, ref=ref)


class _BatchWorkerModels:
    """SkyRL's own update path on `SkyRLBatchWorker` (the trainer classes below)."""

    cfg: Any
    inference_engine_client: Any
    dispatch: Any
    run_config: RunConfig
    learner_core: int | None = None
    record_grads: bool = False

    def build_models(self, *_: Any) -> None:
        model = _policy(self.cfg, self.run_config)
        worker = SkyRLBatchWorker(model, self.run_config, self.algo, record=self.record_grads)
        self.dispatch = _dispatch(self, worker)
        self.ref_model = self.dispatch.ref  # SkyRL's loop asks the ref model when it exists

    @property
    def algo(self) -> Any:
        return self.cfg.trainer.algorithm

    def apply_reward_kl_penalty(self, data: Any) -> Any:
        return distillation_rewards(data)  # reached under OPD only (check_cpu_loop)


class SkyRLSyncCPUTrainer(_BatchWorkerModels, RayPPOTrainer):
    """SkyRL's batch-synchronous `RayPPOTrainer`, its update on `SkyRLBatchWorker`."""


class SkyRLAsyncCPUTrainer(_BatchWorkerModels, FullyAsyncRayPPOTrainer):
    """SkyRL's fully-async trainer (bounded staleness) on `SkyRLBatchWorker`: the comparison
    ThunderSync is measured against; its rollouts may come from older weights."""


class ThunderSyncTrainer(RayPPOTrainer):
    """SkyRL's `RayPPOTrainer` whose update is ThunderSync's streaming learner (module doc)."""

    run_config: RunConfig
    learner_core: int | None = None
    record_grads: bool = False

    def build_models(self, *_: Any) -> None:
        if not isinstance(self.generator, StreamingGymGenerator):
            raise TypeError("ThunderSyncTrainer needs a StreamingGymGenerator")
        learner = Learner(_policy(self.cfg, self.run_config), self.run_config)
        n = self.cfg.generator.n_samples_per_prompt
        opd = None
        if is_opd(self.cfg):  # the teacher scores each turn as the engine serves it
            teacher = _policy(self.cfg, self.run_config, self.cfg.trainer.ref.model.path)
            opd = OpdTurns(HFScorer(teacher))
        self.worker = StreamingWorker(learner, n, self.learner_core, self.record_grads, opd)
        self.generator.on_trajectory = self.worker.submit
        self.inference_engine_client.on_turn = self.worker.submit_turn
        self.dispatch = LocalDispatch(self.worker, self.inference_engine_client)
        # with recording, SkyRL's own update of each batch at the same weights (its gradients in
        # `self.probe.grads`): the per-update parity check
        self.probe: SkyRLBatchWorker | None = None
        if self.record_grads:
            model = _policy(self.cfg, self.run_config)
            self.probe = SkyRLBatchWorker(model, self.run_config, self.cfg.trainer.algorithm, True)
            self._probe_dispatch = _dispatch(self, self.probe)

    async def generate(self, input_batch: Any) -> Any:
        self.worker.open()
        return await super().generate(input_batch)

    def fwd_logprobs_values_reward(self, training_input: Any) -> Any:
        if self.probe is not None:
            self.probe.model.load_state_dict(self.worker.weights())  # theta_k: not stepped yet
            with self._on_probe():
                return super().fwd_logprobs_values_reward(training_input)
        # every gradient was taken at the rollout's weights as its trajectory landed: the old
        # log-prob forward of the batch has nothing left to feed
        training_input["action_log_probs"] = None
        training_input["base_action_log_probs"] = None
        training_input["values"] = None
        return training_input

    @contextlib.contextmanager
    def _on_probe(self) -> Iterator[None]:
        streaming, self.dispatch = self.dispatch, self._probe_dispatch
        self.ref_model = self.dispatch.ref
        try:
            yield
        finally:
            self.dispatch, self.ref_model = streaming, None

    def apply_reward_kl_penalty(self, data: Any) -> Any:
        # the probe's batch only: the streaming learner took the teacher's scores turn by turn
        return distillation_rewards(data) if self.probe is not None else data

    def train_critic_and_policy(self, data: Any) -> dict[str, float]:
        if self.probe is not None:
            with self._on_probe():
                super().train_critic_and_policy(data)
        grad_norm = self.dispatch.optim_step("policy")
        status = {
            "grad_norm": grad_norm,
            "streamed_trajectories": float(self.worker.applied),
            "streamed_turns": float(self.worker.turns),
            "learner_busy_s": self.worker.busy_s,
        }
        self.all_metrics.update({f"policy/{k}": v for k, v in status.items()})
        return status
