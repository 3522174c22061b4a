"""vLLM on CUDA for real: generate, prompt log-probs, a shared-memory publish and an NCCL broadcast
publish with their acks (skipped without a GPU or without a CUDA vLLM in `.venv-vllm`;
`deploy/gpu-smoke.sh` runs it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_vllm_cuda_generates_scores_and_loads_weights_from_shared_memory(tmp_path: Path) -> None:
    from thundersync.hf_models import build_tiny_model, load_model
    from thundersync.rollout.types import SamplingParams
    from thundersync.rollout.vllm_engine import VLLMEngine
    from thundersync.rollout.vllm_server import VLLMServer, VLLMServerConfig, VLLMServerError
    from thundersync.rollout.weight_wire import segment_path, write_shm
    from thundersync.teacher.scorer import ScoreRequest, VLLMScorer

    mdir = build_tiny_model(tmp_path / "m", seed=0, hidden=128)
    # fp32: the scores are compared with an fp32 HF forward (bf16 is only the GPU default)
    cfg = VLLMServerConfig(
        model=str(mdir), dtype="float32", enforce_eager=False, gpu_memory_utilization=0.3
    )
    server = VLLMServer(cfg, log_dir=tmp_path / "log")
    try:
        server.start()
    except VLLMServerError as e:
        pytest.skip(f"no CUDA vLLM here: {str(e)[:300]}")
    engine = VLLMEngine(server)
    try:
        prompt = [1, 10, 11, 12, 13]
        model = load_model(mdir)
        g = torch.Generator().manual_seed(1)
        new = {
            k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()
        }
        seg = write_shm(segment_path(f"gpu-{tmp_path.name}", 1), new, version=1)
        ack = engine.load_weights(1, seg.uri)
        seg.remove()
        assert ack.version == 1 and ack.method == "shm", ack
        gen = engine.generate(prompt, SamplingParams(8, 1.0), seed=0, version=1)
        model.load_state_dict(new)
        ids = torch.tensor([prompt + gen.token_ids])
        with torch.no_grad():
            lp = model(ids).logits.float().log_softmax(-1)[0, len(prompt) - 1 : -1]
        want = lp.gather(-1, torch.tensor(gen.token_ids)[:, None])[:, 0]
        assert float((torch.tensor(gen.logprobs) - want).abs().max()) < 1e-2
        scorer = VLLMScorer(server.url)
        scores = scorer.score_batch([ScoreRequest(prompt + gen.token_ids, len(prompt))])[0]
        assert float((torch.tensor(scores) - want).abs().max()) < 1e-2
        scorer.close()
        # v2 by NCCL broadcast from CUDA tensors (the learner's side), joined by the replica
        import threading

        from thundersync.rollout.weight_broadcast import WeightBroadcaster

        v2 = {k: (v - 0.03).cuda() for k, v in new.items()}
        sender = WeightBroadcaster(receivers=1, timeout_s=120)
        uri = sender.announce(2, v2)
        t = threading.Thread(target=sender.send, args=(2, v2))
        t.start()
        ack = engine.load_weights(2, uri)
        t.join(120)
        assert ack.method == "broadcast" and ack.version == 2, ack
        gen = engine.generate(prompt, SamplingParams(8, 1.0), seed=0, version=2)
        model.load_state_dict({k: v.cpu() for k, v in v2.items()})
        ids = torch.tensor([prompt + gen.token_ids])
        with torch.no_grad():
            lp = model(ids).logits.float().log_softmax(-1)[0, len(prompt) - 1 : -1]
        want = lp.gather(-1, torch.tensor(gen.token_ids)[:, None])[:, 0]
        assert float((torch.tensor(gen.logprobs) - want).abs().max()) < 1e-2
    finally:
        engine.close()
