"""Tiny deterministic causal LMs (Llama, Qwen2, Qwen3) from a config and a locally trained BPE
tokenizer, and `load_model` for any causal LM directory.

There is no model hub on these machines: every test and demo builds its model here. The corpus is
generated from a seeded grammar of shell / Python / tool-call snippets, so the same seed gives the
same tokenizer and the same weights, byte for byte.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from thundersync import stages
from thundersync.config import Arch

__all__ = ["Arch", "build_tiny_model", "load_model", "load_tokenizer", "tiny_config"]

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>", "<tool>", "</tool>", "<obs>", "</obs>"]

_WORDS = [
    "ls",
    "cd",
    "cat",
    "grep",
    "sed",
    "awk",
    "echo",
    "python",
    "pytest",
    "git",
    "diff",
    "apply",
    "patch",
    "def",
    "return",
    "import",
    "class",
    "self",
    "if",
    "else",
    "for",
    "while",
    "in",
    "and",
    "or",
    "not",
    "None",
    "True",
    "False",
    "print",
    "open",
    "read",
    "write",
    "file",
    "path",
    "tests",
    "src",
    "main",
    "fix",
    "bug",
    "error",
    "value",
    "index",
    "list",
    "dict",
    "str",
    "int",
    "float",
    "len",
    "range",
    "assert",
    "submit",
    "bash",
    "view",
    "edit",
    "replace",
    "line",
    "col",
    "the",
    "a",
    "of",
    "to",
    "is",
    "was",
    "with",
    "from",
    "that",
    "this",
    "it",
    "on",
    "at",
    "by",
    "be",
    "as",
    "are",
    "ok",
    "fail",
    "pass",
    "passed",
    "failed",
    "run",
    "make",
    "build",
    "install",
    "output",
    "input",
    "json",
    "yaml",
    "task",
    "reward",
    "agent",
    "tool",
]


def _corpus(seed: int, n_lines: int = 4000) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        n = rng.randint(3, 14)
        words = [rng.choice(_WORDS) for _ in range(n)]
        if rng.random() < 0.3:
            words.insert(0, "<tool>")
            words.append("</tool>")
        if rng.random() < 0.2:
            words.append(str(rng.randint(0, 999)))
        lines.append(" ".join(words))
    return lines


def train_tokenizer(seed: int = 0, vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on the seeded corpus (deterministic)."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
    )


def tiny_config(
    vocab_size: int, *, hidden: int = 64, layers: int = 2, arch: Arch = Arch.LLAMA
) -> PreTrainedConfig:
    """The tiny config of one family: 4 query heads, 2 K/V heads, untied embeddings, full
    attention in every layer (the learner cuts K/V caches; a sliding window would be refused)."""
    common: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=False,  # vLLM weight reload is only correct for untied embeddings
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    if arch is Arch.LLAMA:
        return LlamaConfig(**common)
    full: dict[str, Any] = dict(
        use_sliding_window=False,
        sliding_window=None,
        max_window_layers=layers,
        layer_types=["full_attention"] * layers,
    )
    if arch is Arch.QWEN2:
        return Qwen2Config(**common, **full)
    # Qwen3 decouples head_dim from hidden / heads (and adds q_norm / k_norm on it)
    return Qwen3Config(**common, **full, head_dim=max(16, hidden // 4))


_CLASSES: dict[Arch, type[PreTrainedModel]] = {
    Arch.LLAMA: LlamaForCausalLM,
    Arch.QWEN2: Qwen2ForCausalLM,
    Arch.QWEN3: Qwen3ForCausalLM,
}


def build_tiny_model(
    out_dir: str | Path,
    *,
    seed: int = 0,
    hidden: int = 64,
    layers: int = 2,
    tokenizer: PreTrainedTokenizerFast | None = None,
    arch: Arch | str = Arch.LLAMA,
) -> Path:
    """Write a tiny model of family `arch` + tokenizer as a Hugging Face directory; return it.

    Every family gets the same tokenizer (trained on seed 0) and the same weight recipe: each
    matrix ~ N(0, 0.05^2) from one seeded generator, in sorted parameter-name order; vectors
    (norms, Qwen2's q/k/v biases) keep their deterministic defaults.
    """
    arch = Arch(arch)
    out = Path(out_dir)
    stages.report("model", f"building a tiny {arch.value} model in {out.name}/")
    out.mkdir(parents=True, exist_ok=True)
    tok = tokenizer if tokenizer is not None else train_tokenizer(seed=0)
    cfg = tiny_config(len(tok), hidden=hidden, layers=layers, arch=arch)
    if tok.pad_token_id is not None:
        cfg.pad_token_id = tok.pad_token_id
    if tok.bos_token_id is not None:
        cfg.bos_token_id = tok.bos_token_id
    if tok.eos_token_id is not None:
        cfg.eos_token_id = tok.eos_token_id
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = _CLASSES[arch](cfg)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def load_tokenizer(model_dir: str | Path) -> PreTrainedTokenizerFast:
    # AutoTokenizer on a llama/qwen config can swap the pre-tokenizer of a self-trained tokenizer.
    return PreTrainedTokenizerFast.from_pretrained(str(model_dir))


def load_model(
    model_dir: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    attn_implementation: str = "sdpa",
) -> PreTrainedModel:
    """Any causal LM directory (Llama, Qwen2, Qwen3, ...), in eval mode, SDPA attention by
    default (`attn_implementation="eager"` where a test needs the eager kernel)."""
    stages.report("model", f"loading the model {Path(model_dir).name}/")
    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=dtype, attn_implementation=attn_implementation
    )
    model.eval()  # no dropout: gradients must be a pure function of theta and the batch
    return model
