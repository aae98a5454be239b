"""Text ↔ token ids for the served engine, whose models have random weights and no trained tokenizer.

The mapping, stated once:

- **Encoding** is byte-level: a text prompt becomes its UTF-8 bytes, one token per byte, the token id
  being the byte's value (0–255; every catalogue model has a vocabulary of at least 256). So an ASCII
  prompt of N characters is exactly N tokens, which is how a load generator sizes its prompts.
- **Decoding** is one printable ASCII character per token: id ``t`` is ``chr(32 + t % 95)``. Every
  generated token is one character of the streamed text, so a client that counts characters counts tokens.
  Decoding is not the inverse of encoding (the model's ids above 255 have no byte); nothing here needs it
  to be.
- A prompt may also be a list of token ids (as vLLM's completions endpoint accepts); they are used as
  given, after a range check.
- Chat messages are joined by ``CHAT_TEMPLATE`` before encoding.

Must never depend on the engine or torch: the HTTP layer validates prompts with it before they reach the
engine thread.
"""

from __future__ import annotations

from collections.abc import Sequence

NUM_BYTE_TOKENS = 256
"""Ids a text prompt can produce (one per byte value)."""

_PRINTABLE_FIRST = 32
_NUM_PRINTABLE = 95
"""Printable ASCII: space (32) to tilde (126)."""


def encode(text: str) -> list[int]:
    """Token ids of ``text``: its UTF-8 bytes."""
    return list(text.encode("utf-8"))


def decode_token(token_id: int) -> str:
    """The text of one generated token: one printable ASCII character."""
    return chr(_PRINTABLE_FIRST + token_id % _NUM_PRINTABLE)


def decode(token_ids: Sequence[int]) -> str:
    return "".join(decode_token(t) for t in token_ids)


CHAT_TEMPLATE = "<|{role}|>{content}\n"
"""One chat message; the prompt is the messages in order followed by ``ASSISTANT_PREFIX``."""
ASSISTANT_PREFIX = "<|assistant|>"


def chat_prompt(messages: Sequence[tuple[str, str]]) -> str:
    """The prompt text of a conversation given as (role, content) pairs."""
    return "".join(CHAT_TEMPLATE.format(role=role, content=content) for role, content in messages) + ASSISTANT_PREFIX
