"""Keeps the gateway's key and address out of every error text that is stored or shown.

Gateways echo keys in many shapes: whole, partly masked (`sk-abc1****xyz9`,
`sk-abc1...xyz9`), behind `Bearer`, or as `api_key=...`; error texts name the gateway's host
(and an outside caller must not learn it from `subtask.error`). Matching by pattern, not only
the exact key, covers the shapes we have not seen yet.

A gateway may also echo the key transformed: in another case, percent- or `\\u`-escaped, as
HTML entities, spaced out, base64-encoded (`Basic` credentials), or only a piece of it. The
text is read once more as the characters it stands for (escapes decoded, whitespace skipped,
each kept with the span it came from), and every run of `MIN_RUN` or more characters of the
key found there — in any case — is masked where it sits in the text, as is the key's base64.
"""

from __future__ import annotations

import base64
import re
from urllib.parse import urlsplit

MASK = "***"
GATEWAY = "<gateway>"
_MIN_FRAGMENT = 4  # shortest prefix/suffix of the key that betrays it next to a mask
MIN_RUN = 12  # any run of this many characters of the key is the key's
# a character as a text may carry it (a run of backslashes before `u`/`x`: a JSON text quoted
# in JSON), or whitespace, which a spaced-out key puts between its characters
_ENCODED = re.compile(r"%([0-9A-Fa-f]{2})|\\+u([0-9A-Fa-f]{4})|\\+x([0-9A-Fa-f]{2})"
                      r"|&#[xX]([0-9A-Fa-f]{1,6});|&#([0-9]{1,7});|\s+")
_ENCODED_MAX = 12  # characters one encoded character may take (`&#x10FFFF;`, `\\\\u002d`)
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
        self._runs = _runs_of(self._key)
        self._encoded = _base64_cores(self._key)
        # how far a copy of the key may reach in a text: its longest encoded form
        self.reach = _ENCODED_MAX * len(self._key)
        parts = urlsplit(base_url) if base_url else None
        names = []
        if parts is not None and parts.hostname:
            names = [parts.netloc.rpartition("@")[2], parts.hostname]
        # longest first, so host:port goes before host
        self._hosts = [re.compile(re.escape(n), re.IGNORECASE)
                       for n in sorted({n for n in names if n}, key=len, reverse=True)]

    def __call__(self, text: str) -> str:
        if self._key:
            text = self._transformed(text.replace(self._key, MASK))
        for labelled in (_SCHEME, _LABELLED):
            text = labelled.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", text)
        text = _KEY_SHAPES.sub(MASK, text)
        if self._key:
            text = _TOKEN.sub(self._fragment, text)
        for host in self._hosts:
            text = host.sub(GATEWAY, text)
        return text

    def _transformed(self, text: str) -> str:
        """`text` with every transformed copy of the key (see the module's docstring) masked."""
        plain, origin = _decoded(text)
        spans: list[tuple[int, int]] = []
        for m in self._runs.finditer(plain):  # a lookahead: every start, overlapping runs too
            spans.append((m.start(), m.start() + len(m.group(1))))
        for core in self._encoded:
            at = plain.find(core)
            while at >= 0:
                spans.append((at, at + len(core)))
                at = plain.find(core, at + 1)
        if not spans:
            return text
        out: list[str] = []
        done = 0
        for start, end in _merged(spans):
            first, last = origin[start][0], origin[end - 1][1]
            out += [text[done:first], MASK]
            done = last
        out.append(text[done:])
        return "".join(out)

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


def _runs_of(key: str) -> re.Pattern[str]:
    """Finds (as a lookahead, so overlapping) each run of MIN_RUN characters of the key in any
    case (character by character, so spans keep their length), or the whole key when shorter."""
    n = min(MIN_RUN, len(key))
    grams = sorted({key[i:i + n].lower() for i in range(len(key) - n + 1)}) if key else []
    if not grams:
        return re.compile(r"(?!x)x")  # matches nothing
    return re.compile("(?=(" + "|".join(map(re.escape, grams)) + "))", re.IGNORECASE)


def _base64_cores(key: str) -> list[str]:
    """The base64 text of the key wherever it sits in an encoded value: at each of the three
    byte alignments, the characters that depend on the key's bytes alone (both alphabets)."""
    raw = key.encode()
    if len(raw) < MIN_RUN:
        return []
    cores: set[str] = set()
    for lead in range(3):
        encoded = base64.b64encode(b"\0" * lead + raw).decode().rstrip("=")
        head = (0, 2, 3)[lead]  # characters that mix in the unknown bytes before the key
        tail = (lead + len(raw)) % 3  # the last one mixes in the byte after, unless aligned
        core = encoded[head:len(encoded) - (1 if tail else 0)]
        cores.update((core, core.replace("+", "-").replace("/", "_")))
    return sorted(cores)


def _decoded(text: str) -> tuple[str, list[tuple[int, int]]]:
    """The characters `text` stands for (escapes decoded, whitespace left out), each with the
    span of `text` it came from."""
    chars: list[str] = []
    origin: list[tuple[int, int]] = []
    at = 0
    for m in _ENCODED.finditer(text):
        if m.start() > at:
            chars.append(text[at:m.start()])
            origin.extend((i, i + 1) for i in range(at, m.start()))
        at = m.end()
        code = next((g for g in m.groups() if g is not None), None)
        if code is None:  # whitespace
            continue
        value = int(code, 10 if m.group(5) is not None else 16)
        chars.append(chr(value) if value < 0x110000 else "\ufffd")
        origin.append((m.start(), m.end()))
    chars.append(text[at:])
    origin.extend((i, i + 1) for i in range(at, len(text)))
    return "".join(chars), origin


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out
