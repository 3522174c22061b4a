"""`tsrl model smollm2` gives a working, untied, unquantised HF model (one extraction, ~30 s)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from thundersync.rollout.chat import TokenizerChatFormat
from thundersync.rollout.hf_engine import HFEngine
from thundersync.rollout.types import SamplingParams

pytestmark = pytest.mark.slow


def test_smollm2_extracts_untied_and_answers_a_question(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from thundersync.smollm2 import build_smollm2

    out = build_smollm2(tmp_path / "smol")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is False and "quantization_config" not in cfg
    eng = HFEngine(out)
    chat = TokenizerChatFormat(AutoTokenizer.from_pretrained(str(out)))
    assert chat.templated
    ids = chat.prompt_ids([{"role": "user", "content": "What is the capital of France?"}])
    g = eng.generate(ids, SamplingParams(max_new_tokens=12, temperature=0), seed=0)
    assert "Paris" in chat.decode(g.token_ids)
