"""Keeps the gateway's key and address out of every error text that is stored or shown.

Gateways echo keys in many shapes: whole, partly masked (`sk-abc1****xyz9`,
`sk-abc1...xyz9`), behind `Bearer`, or as `api_key=...`; error texts name the gateway's host
(and an outside caller must not learn it from `subtask.error`). Matching by pattern, not only
the exact key, covers the shapes we have not seen yet.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

MASK = "***"
GATEWAY = "<gateway>"
_MIN_FRAGMENT = 4  # shortest prefix/suffix of the key that betrays it next to a mask
_TOKEN = re.compile(r"[A-Za-z0-9_\-.*…•]{6,}")
_MASKING = re.compile(r"[*…•]|\.\.\.|x{4,}|X{4,}")
# credentials by label, whatever key they carry: `Bearer abc`, `api_key=abc`, `"token": "abc"`
_SCHEME = re.compile(r"(?i)\b(bearer|basic)(\s+)([^\s\"',;}]+)")
_LABELLED = re.compile(
    r"(?i)\b(api[-_ ]?key|access[-_ ]?token|token|secret|password|authorization|x-api-key)"
    r"(\"?\s*[:=]\s*\"?)([^\s\"',;}]+)")
# the shapes of well-known provider keys (OpenAI, Anthropic, Google, GitHub, ...)
_KEY_SHAPES = re.compile(
    r"\b(?:sk|pk|rk)-[A-Za-z0-9_\-*.…]{6,}|\bAIza[0-9A-Za-z_\-]{20,}|\bgh[pousr]_[A-Za-z0-9]{20,}")


class Redactor:
    """`redact(text)`: the text with the key (in any shape) and the gateway's host hidden."""

    def __init__(self, api_key: str = "", base_url: str = "") -> None:
        self._key = api_key.strip()
        parts = urlsplit(base_url) if base_url else None
        names = []
        if parts is not None and parts.hostname:
            names = [parts.netloc.rpartition("@")[2], parts.hostname]
        # longest first, so host:port goes before host
        self._hosts = [re.compile(re.escape(n), re.IGNORECASE)
                       for n in sorted({n for n in names if n}, key=len, reverse=True)]

    def __call__(self, text: str) -> str:
        if self._key:
            text = text.replace(self._key, MASK)
        for labelled in (_SCHEME, _LABELLED):
            text = labelled.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", text)
        text = _KEY_SHAPES.sub(MASK, text)
        if self._key:
            text = _TOKEN.sub(self._fragment, text)
        for host in self._hosts:
            text = host.sub(GATEWAY, text)
        return text

    def _fragment(self, match: re.Match[str]) -> str:
        """A token that is a long piece of the key, or a masked form of it."""
        token = match.group(0)
        key = self._key
        if len(token) >= 8 and token in key:
            return MASK
        if _MASKING.search(token):
            head = _common_prefix(token, key)
            tail = _common_prefix(token[::-1], key[::-1])
            if max(head, tail) >= _MIN_FRAGMENT:
                return MASK
        return token


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
