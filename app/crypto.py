"""Encryption at rest (SPEC §16): AES-256-GCM of one text value with the keys of
`SWARM_ENCRYPTION_KEYS` (comma-separated base64 32-byte keys; the first encrypts, every one
decrypts). A sealed value is text: `MARK`, the key's id, a colon, then base64 of the random
96-bit nonce and the ciphertext with its tag. The key id (the first 8 hex digits of the key's
SHA-256) says which key opens it, so values of several keys (a rotation) and plaintext
(written before a key was set) live side by side, and a value of a key no longer configured
is an error that names its id, never garbage."""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from collections.abc import Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

# starts every sealed value: a control character no task or output begins with by chance
MARK = "\x1esv1:"
_KEY_BYTES = 32
_NONCE_BYTES = 12
_ID_CHARS = 8
# how much of a stored value says whether it is sealed and with which key: MARK, id, colon
HEAD_CHARS = len(MARK) + _ID_CHARS + 1
# binds a ciphertext to this service's content: a value is opened only as what it was sealed as
_ASSOCIATED = b"swarm-api content v1"


class SealError(ValueError):
    """A sealed value this process cannot open: its key is not configured, or it was altered
    (or the keys are wrong). Its message names the key id, never the value or a key."""


def key_id(key: bytes) -> str:
    """The id a sealed value carries for its key: no secret, only which key."""
    return hashlib.sha256(key).hexdigest()[:_ID_CHARS]


def parse_keys(raw: str) -> list[bytes]:
    """SWARM_ENCRYPTION_KEYS as keys, in order; a ValueError that says what is wrong (never
    echoing a key) for one that is not base64 of 32 bytes."""
    keys: list[bytes] = []
    for n, item in enumerate((i.strip() for i in raw.split(",")), start=1):
        if not item:
            continue
        try:
            key = base64.b64decode(item, validate=True)
        except (binascii.Error, ValueError):
            key = b""
        if len(key) != _KEY_BYTES:
            raise ValueError(f"SWARM_ENCRYPTION_KEYS: key {n} is not base64 of 32 bytes "
                             "(make one with: openssl rand -base64 32)")
        keys.append(key)
    if len({key_id(k) for k in keys}) != len(keys):
        raise ValueError("SWARM_ENCRYPTION_KEYS: a key is listed twice")
    return keys


class Sealer:
    """Seals with the first key, opens with any."""

    def __init__(self, keys: Sequence[bytes]) -> None:
        if not keys:
            raise ValueError("a Sealer needs at least one key")
        self._ciphers = {key_id(k): AESGCM(k) for k in keys}
        self.current = key_id(keys[0])
        self._prefix = f"{MARK}{self.current}:"
        self._cipher = self._ciphers[self.current]

    @classmethod
    def from_setting(cls, raw: str) -> Sealer | None:
        """The sealer of a SWARM_ENCRYPTION_KEYS value; None when it names no key."""
        keys = parse_keys(raw)
        return cls(keys) if keys else None

    @property
    def key_ids(self) -> frozenset[str]:
        return frozenset(self._ciphers)

    def seal(self, text: str) -> str:
        """`text` encrypted with the first key. Text no database stores as it is (a lone
        surrogate) raises UnicodeEncodeError, as a database refuses it in the clear."""
        nonce = os.urandom(_NONCE_BYTES)
        body = self._cipher.encrypt(nonce, text.encode("utf-8"), _ASSOCIATED)
        return self._prefix + binascii.b2a_base64(nonce + body, newline=False).decode("ascii")

    def is_current(self, value: str) -> bool:
        """Sealed with the first key (nothing for `reencrypt` to do)."""
        return value.startswith(self._prefix)

    def open(self, value: str) -> str:
        """The text of a sealed value (one that starts with MARK)."""
        kid, _, body = value[len(MARK):].partition(":")
        cipher = self._ciphers.get(kid)
        if cipher is None:
            raise SealError(f"a value is encrypted with key {kid!r}, which "
                            "SWARM_ENCRYPTION_KEYS does not hold (add that key back)")
        try:
            raw = binascii.a2b_base64(body, strict_mode=True)  # C: b64decode's check is a regex
            plain = cipher.decrypt(raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], _ASSOCIATED)
        except (binascii.Error, ValueError, InvalidTag):
            raise SealError(f"a value encrypted with key {kid!r} does not decrypt: "
                            "it was altered") from None
        return plain.decode("utf-8")


def is_sealed(value: object) -> bool:
    return isinstance(value, str) and value.startswith(MARK)


def key_of(value: str) -> str:
    """The key id of a sealed value."""
    return value[len(MARK):].partition(":")[0]
