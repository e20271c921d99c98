"""Prompts for subtasks: dependency outputs under their names, fitted to the model's window."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

# Upper bound on tokens per message beyond its text (role markers, separators)
MESSAGE_OVERHEAD_TOKENS = 8
# a provider may add a hidden system prompt when tools are offered (Anthropic's tool use: 313
# to 346 tokens); the bound holds it, or an honest usage would be billed down to the bound
TOOLS_OVERHEAD_TOKENS = 512
# For fitting text into a context window only (English averages ~4 bytes per token; 3 leaves
# room); the budget never uses this, it uses the strict bound below
BYTES_PER_TOKEN = 3


def approx_tokens(text: str) -> int:
    """A realistic, slightly high token count for fitting context."""
    return len(text.encode()) // BYTES_PER_TOKEN + 1


def room_tokens(context_window: int, max_tokens: int, system: str, prompt: str,
                margin: int) -> int:
    """Tokens left in a call's window for the outputs it carries, beside its own system
    prompt, prompt, answer and a margin (the engine fits inputs to it; estimates bound them)."""
    frame = approx_tokens(system) + approx_tokens(prompt)
    return max(context_window - max_tokens - frame - margin, 0)


def fit_chars(tokens: int) -> int:
    """Characters that fit in `tokens` by the same estimate (the last-resort truncation)."""
    return max(tokens, 0) * BYTES_PER_TOKEN


def _message_bytes(message: Mapping[str, Any]) -> int:
    content = message.get("content")
    if isinstance(content, str) and len(message) <= 2:  # {role, content}: the common case
        return len(content.encode())
    # null content, content parts, tool calls and their ids: the JSON covers what is tokenized
    return len(json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode())


def estimate_prompt_tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    """An upper bound on the prompt tokens a gateway will bill, for messages of any shape.

    Byte-level BPE tokenizers never make more tokens than UTF-8 bytes, so bytes plus a per-message
    overhead bounds the count; the budget reserves against this bound, which keeps the cap hard.
    """
    return MESSAGE_OVERHEAD_TOKENS + sum(
        _message_bytes(m) + MESSAGE_OVERHEAD_TOKENS for m in messages
    )


def estimate_request_tokens(messages: Sequence[Mapping[str, Any]],
                            tools: Sequence[Mapping[str, Any]]) -> int:
    """The same bound for a call with tools: the JSON bytes of the messages (tool calls and
    tool results included) and of the tool definitions cover whatever the gateway tokenizes."""
    raw = json.dumps([*messages, *tools], ensure_ascii=False, separators=(",", ":"))
    return (MESSAGE_OVERHEAD_TOKENS * (len(messages) + 1) + TOOLS_OVERHEAD_TOKENS
            + len(raw.encode()))


def truncate_marked(text: str, max_chars: int) -> str:
    """`text` cut to about `max_chars`, with a visible marker saying how much was cut."""
    if len(text) <= max_chars:
        return text
    keep = max(max_chars - 80, 0)
    omitted = len(text) - keep
    return f"{text[:keep]}\n[... truncated: {omitted} characters omitted to fit the context]"


def fair_shares(sizes: Sequence[int], total: int) -> list[int]:
    """Split `total` among items: small ones keep their size, large ones share the rest equally."""
    shares = [0] * len(sizes)
    order = sorted(range(len(sizes)), key=lambda i: sizes[i])
    left = total
    for rank, i in enumerate(order):
        fair = left // (len(sizes) - rank)
        shares[i] = min(sizes[i], fair)
        left -= shares[i]
    return shares


def fit_outputs(outputs: Sequence[str], budget_chars: int | None) -> list[str]:
    """The outputs as they are, or, when together they exceed `budget_chars`, each cut
    visibly to its fair share (small ones stay whole)."""
    if budget_chars is None or sum(map(len, outputs)) <= budget_chars:
        return list(outputs)
    shares = fair_shares([len(o) for o in outputs], max(budget_chars, 0))
    return [truncate_marked(o, n) for o, n in zip(outputs, shares, strict=True)]


def with_dependencies(
    prompt: str, deps: Sequence[tuple[str, str]], budget_chars: int | None = None
) -> str:
    """The user message: the prompt, then each dependency's output under its name; outputs are
    truncated (visibly) only when together they exceed `budget_chars`."""
    if not deps:
        return prompt
    outputs = fit_outputs([out for _, out in deps], budget_chars)
    parts = [prompt, "", "Results of the agents this step depends on:"]
    for (name, _), out in zip(deps, outputs, strict=True):
        parts.append(f"\n### {name}\n{out}")
    return "\n".join(parts)
