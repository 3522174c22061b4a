"""Turning conversations into token ids for the agent loop, and head+tail observation truncation.

The agent loop is token-in / token-out: the prompt is rendered once, each action is appended as
the exact sampled ids, and each observation is rendered as the *delta* that the chat template adds
after an assistant message (a user/tool message plus the next generation prompt). Tokenisers
without a chat template (the tiny models) use a plain `role: content` format.
"""

from __future__ import annotations

from typing import Any, Protocol

Messages = list[dict[str, str]]

_BASE: Messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]


class ChatFormat(Protocol):
    def prompt_ids(self, messages: Messages) -> list[int]: ...

    def observation_ids(self, messages: Messages) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class TokenizerChatFormat:
    """Chat template when the tokenizer has one, else `role: content` lines."""

    def __init__(self, tokenizer: Any, max_obs_tokens: int = 256) -> None:
        self.tok = tokenizer
        self.max_obs_tokens = max_obs_tokens
        self.templated = bool(getattr(tokenizer, "chat_template", None))

    def _encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return str(self.tok.decode(ids, skip_special_tokens=False))

    def prompt_ids(self, messages: Messages) -> list[int]:
        if self.templated:
            text = self.tok.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
            return self._encode(text)
        ids = self._encode(
            "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
        )
        bos = getattr(self.tok, "bos_token_id", None)
        return ([bos] if bos is not None else []) + ids

    def observation_ids(self, messages: Messages) -> list[int]:
        if self.templated:
            base = self.tok.apply_chat_template(_BASE, tokenize=False)
            full = self.tok.apply_chat_template(
                _BASE + messages, tokenize=False, add_generation_prompt=True
            )
            if not full.startswith(base):
                raise ValueError(
                    "chat template is not prefix-stable; cannot render observation deltas"
                )
            return self._encode(full[len(base) :])
        return self._encode(
            "\n" + "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
        )

    def truncate(self, text: str) -> tuple[str, bool]:
        return truncate_head_tail(text, self.tok, self.max_obs_tokens)


def truncate_head_tail(text: str, tokenizer: Any, max_tokens: int) -> tuple[str, bool]:
    """Keep the first and last `max_tokens // 2` tokens of `text` (errors live at both ends)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) <= max_tokens:
        return text, False
    head_n = max_tokens // 2
    tail_n = max_tokens - head_n
    head = tokenizer.decode(ids[:head_n])
    tail = tokenizer.decode(ids[len(ids) - tail_n :])
    return f"{head}\n...[{len(ids) - head_n - tail_n} tokens truncated]...\n{tail}", True
