"""Sealed blobs: server-encrypted payloads that clients carry and send back.

``reasoning.encrypted_content`` and compaction items hold state the client
must not read or change: the reasoning text of a turn, the summary of a
compacted conversation. A `Sealer` encrypts such a payload with AES-256-GCM
under the server's key; the owner (API key digest) and the payload's purpose
are bound in as associated data, so a blob opens only for the tenant it was
made for, and only where it was meant to be used. A blob changed by one bit,
made with another key or for another tenant does not open (400).

Blob layout (URL-safe base64, no padding)::

    version (1 byte, 1) | nonce (12 bytes) | ciphertext + tag (16 bytes)

The key is 32 bytes: ``--encryption-key`` (64 hex digits or base64), else a
key file created on first start with mode 0600 (``--encryption-key-file``).
Replicas that share a store must share the key.
"""

from __future__ import annotations

import base64
import binascii
import os
from pathlib import Path
from typing import Any, Literal, final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ._config import Config, parse_key
from ._exceptions import InvalidRequestError
from .protocol.codec import decode_json, encode_json

Purpose = Literal["reasoning", "compaction", "webhook_secret"]

_VERSION = 1
_NONCE_BYTES = 12
_KEY_BYTES = 32
MAX_BLOB_CHARS = 8 * 1024 * 1024
"""Longest blob accepted back (a request body is bounded anyway)."""


def default_key_file() -> Path:
    """Where the key is kept when none is configured: ``$XDG_STATE_HOME`` (or
    ``~/.local/state``) ``/trio-responses/encryption.key``."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "trio-responses" / "encryption.key"


def load_or_create_key(path: Path) -> bytes:
    """The key in ``path``; a new random key written there (0600) if there is none.

    Raises:
        ValueError: the file holds something that is not a key.
        OSError: the file cannot be read or created.
    """
    try:
        return parse_key(path.read_text())
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = os.urandom(_KEY_BYTES)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process created it first: use theirs
        return parse_key(path.read_text())
    with os.fdopen(descriptor, "w") as file:
        file.write(key.hex() + "\n")
    return key


def load_key(config: Config) -> bytes:
    """The configured key: ``encryption_key``, else the key file (created if missing)."""
    if config.encryption_key is not None:
        return parse_key(config.encryption_key)
    path = Path(config.encryption_key_file) if config.encryption_key_file else default_key_file()
    return load_or_create_key(path)


@final
class Sealer:
    """Seals and opens payloads (JSON objects) under one key."""

    def __init__(self, key: bytes) -> None:
        if len(key) != _KEY_BYTES:
            raise ValueError("a Sealer needs a 32-byte key")
        self._aead = AESGCM(key)

    def seal(self, purpose: Purpose, payload: dict[str, Any], *, owner: str | None) -> str:
        """``payload`` encrypted for ``owner`` and ``purpose``, as a text blob."""
        nonce = os.urandom(_NONCE_BYTES)
        plain = encode_json(payload).encode()
        sealed = self._aead.encrypt(nonce, plain, _associated(purpose, owner))
        blob = bytes([_VERSION]) + nonce + sealed
        return base64.urlsafe_b64encode(blob).rstrip(b"=").decode("ascii")

    def open(
        self, purpose: Purpose, blob: str, *, owner: str | None, param: str | None = None
    ) -> dict[str, Any]:
        """The payload sealed in ``blob``.

        Raises:
            InvalidRequestError: (``invalid_encrypted_content``, naming ``param``)
                the blob is malformed, was changed, or was sealed with another key,
                for another API key or for another purpose.
        """
        if len(blob) > MAX_BLOB_CHARS:
            raise _refused(param)
        try:
            raw = base64.urlsafe_b64decode(blob + "=" * (-len(blob) % 4))
        except (binascii.Error, ValueError):
            raise _refused(param) from None
        if len(raw) < 1 + _NONCE_BYTES + 16 or raw[0] != _VERSION:
            raise _refused(param)
        nonce, sealed = raw[1 : 1 + _NONCE_BYTES], raw[1 + _NONCE_BYTES :]
        try:
            plain = self._aead.decrypt(nonce, sealed, _associated(purpose, owner))
        except InvalidTag:
            raise _refused(param) from None
        payload = decode_json(plain)
        if not isinstance(payload, dict):
            raise _refused(param)
        return payload


def _associated(purpose: Purpose, owner: str | None) -> bytes:
    return f"trio-responses/{_VERSION}/{purpose}/{owner or '-'}".encode()


def _refused(param: str | None) -> InvalidRequestError:
    return InvalidRequestError(
        "The encrypted content could not be decrypted: it was changed, or it was "
        "made by another server or for another API key. Send back the item exactly as "
        "this server returned it.",
        param=param,
        code="invalid_encrypted_content",
    )
