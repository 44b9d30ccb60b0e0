"""Reasoning sealed for clients that keep no server state (design.md 8.6).

A client that sends `store: false` and `include: ["reasoning.encrypted_content"]` replays the
model's reasoning on its next turn as an opaque blob. The blob is the reasoning text under
AES-GCM with a key only the proxy holds, so a client can carry it but not read or forge it.
A blob that does not open (another server's, a tampered one, an old key's) opens to None. The
same key vouches for what the proxy says that a client carries back (an MCP server's listing,
design.md 14.3).
"""

from __future__ import annotations

import base64
import binascii
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

_PREFIX = "rp1."  # the format's version: a later format can tell its own blobs apart
_ASSOCIATED = b"responses-proxy reasoning v1"
# A voucher's associated data begins with it, a seal's is _ASSOCIATED: neither passes for the other.
_VOUCHED = b"responses-proxy vouched v1\0"
_NONCE = 12


def derive_key(secret: str) -> bytes:
    """A 256-bit key from a configured secret of any length."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_ASSOCIATED).derive(secret.encode())


class Sealer:
    __slots__ = ("_aead",)

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)

    def seal(self, text: str) -> str:
        nonce = os.urandom(_NONCE)
        sealed = self._aead.encrypt(nonce, text.encode(), _ASSOCIATED)
        return _PREFIX + base64.urlsafe_b64encode(nonce + sealed).decode()

    @staticmethod
    def sealed(blob: str) -> bool:
        """Whether the blob is in this proxy's format (whatever key sealed it)."""
        return blob.startswith(_PREFIX)

    def vouch(self, statement: bytes) -> str:
        """A voucher only this key makes for a statement of the proxy's (an MCP server's listing,
        design.md 14.3), which a client can carry but not forge: AES-GCM over nothing, the
        statement its associated data, under a fresh nonce (a GMAC); hex, for an item's id."""
        nonce = os.urandom(_NONCE)
        return (nonce + self._aead.encrypt(nonce, b"", _VOUCHED + statement)).hex()

    def vouches(self, statement: bytes, voucher: str) -> bool:
        try:
            raw = bytes.fromhex(voucher)
            self._aead.decrypt(raw[:_NONCE], raw[_NONCE:], _VOUCHED + statement)
        except (ValueError, InvalidTag):  # ValueError: not hex, too short
            return False
        return True

    def open(self, blob: str) -> str | None:
        if not self.sealed(blob):
            return None
        try:
            raw = base64.urlsafe_b64decode(blob[len(_PREFIX) :])
            return self._aead.decrypt(raw[:_NONCE], raw[_NONCE:], _ASSOCIATED).decode()
        except (binascii.Error, ValueError, InvalidTag):  # ValueError: too short, not UTF-8
            return None
