"""Ed25519 signing for the node agent, through the OpenSSL library the interpreter already has loaded.

The agent signs every fault it stores (`faultline.evidence.NodeKey`). The `cryptography` package would do
it too, but importing it maps its own native module and OpenSSL copy: 8.5 MiB of the agent's resident
memory, on every GPU node, for one call per fault. The interpreter's `ssl` module (which the store client
imports for TLS anyway) is linked to the system's libcrypto, and OpenSSL has had raw Ed25519 keys since
1.1.1 (`EVP_PKEY_new_raw_private_key`, one-shot `EVP_DigestSign`): so the agent signs through that, with
`ctypes`. Where the interpreter has no libcrypto mapped (OpenSSL linked into it statically, or no `ssl`),
`cryptography` signs instead: the signatures are the same bytes (Ed25519 is deterministic, RFC 8032).

Only signing lives here. Verifying, which decides what the workers act on, stays with `cryptography`
(`faultline.evidence.Verifier`).

Keys are kept as PKCS #8 PEM (RFC 8410), as `cryptography` writes them, so a key file made by either
backend is read by the other.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import ctypes
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

SEED_BYTES = 32  # an Ed25519 private key (RFC 8032 5.1.5)
PUBLIC_BYTES = 32
SIGNATURE_BYTES = 64
NID_ED25519 = 1087  # OpenSSL's EVP_PKEY_ED25519
SONAMES = ("libcrypto.so.3", "libcrypto.so.1.1")  # OpenSSL 3.x, 1.1.1: both have raw Ed25519 keys
# PKCS #8 PrivateKeyInfo for Ed25519 (RFC 8410 7): version 0, algorithm id-Ed25519 (1.3.101.112), and the
# seed as an OCTET STRING inside the privateKey OCTET STRING. Version 1 (OneAsymmetricKey) may carry the
# public key after it; the seed is at the same place.
_PKCS8_V0 = bytes.fromhex("302e020100300506032b657004220420")
_PKCS8_V1_TAIL = bytes.fromhex("020101300506032b657004220420")  # after its SEQUENCE header
_PEM_HEAD, _PEM_TAIL = "-----BEGIN PRIVATE KEY-----", "-----END PRIVATE KEY-----"


class KeyFormatError(ValueError):
    """A key file that is not an unencrypted PKCS #8 Ed25519 private key."""


def to_pem(seed: bytes) -> bytes:
    """The PKCS #8 PEM of an Ed25519 private key (the 64 base64 characters fit one line)."""
    if len(seed) != SEED_BYTES:
        raise ValueError(f"an Ed25519 private key has {SEED_BYTES} bytes, not {len(seed)}")
    return f"{_PEM_HEAD}\n{base64.b64encode(_PKCS8_V0 + seed).decode()}\n{_PEM_TAIL}\n".encode()


def from_pem(data: bytes) -> bytes:
    """The 32-byte private key in a PKCS #8 PEM file (text around the PEM block is ignored, as OpenSSL
    does)."""
    text = data.decode("ascii", errors="replace")
    head, tail = text.find(_PEM_HEAD), text.find(_PEM_TAIL)
    if head < 0 or tail < head:
        raise KeyFormatError("not a PEM private key (no BEGIN/END PRIVATE KEY lines)")
    body = "".join(text[head + len(_PEM_HEAD) : tail].split())
    try:
        der = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise KeyFormatError(f"its body is not base64 ({exc})") from exc
    if len(der) == len(_PKCS8_V0) + SEED_BYTES and der.startswith(_PKCS8_V0):
        return der[len(_PKCS8_V0) :]
    if seed := _version_1_seed(der):
        return seed
    raise KeyFormatError("not an Ed25519 key")


def _version_1_seed(der: bytes) -> bytes | None:
    """The seed of a OneAsymmetricKey (RFC 5958, version 1): SEQUENCE { 1, id-Ed25519, seed, then only
    [0] attributes and [1] the public key }, every length exact (short form: the whole is under 128 bytes
    unless its attributes are long, which a key this code reads never has)."""
    if len(der) < 2 or der[0] != 0x30 or der[1] != len(der) - 2:
        return None
    start = 2 + len(_PKCS8_V1_TAIL)
    if der[2:start] != _PKCS8_V1_TAIL or len(der) < start + SEED_BYTES:
        return None
    at = start + SEED_BYTES
    while at < len(der):  # what follows the seed: [0] attributes, [1] public key
        if der[at] not in (0xA0, 0x81) or at + 1 >= len(der) or der[at + 1] >= 0x80:
            return None
        at += 2 + der[at + 1]
    return der[start : start + SEED_BYTES] if at == len(der) else None


def _function(lib: ctypes.CDLL, name: str, args: list[object], result: object) -> Any:
    function = getattr(lib, name)  # AttributeError: an OpenSSL without it
    function.argtypes, function.restype = args, result
    return function


class _Libcrypto:
    """OpenSSL's one-shot Ed25519 through ctypes: one key object, a digest context per signature."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        vp, size, text, status = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_int
        self._new_key = _function(lib, "EVP_PKEY_new_raw_private_key", [status, vp, text, size], vp)
        self._raw_public = _function(
            lib, "EVP_PKEY_get_raw_public_key", [vp, text, ctypes.POINTER(size)], status
        )
        self._free_key = _function(lib, "EVP_PKEY_free", [vp], None)
        self._new_ctx = _function(lib, "EVP_MD_CTX_new", [], vp)
        self._free_ctx = _function(lib, "EVP_MD_CTX_free", [vp], None)
        self._init = _function(lib, "EVP_DigestSignInit", [vp, vp, vp, vp, vp], status)
        self._sign = _function(lib, "EVP_DigestSign", [vp, text, ctypes.POINTER(size), text, size], status)
        self._clear_errors = _function(lib, "ERR_clear_error", [], None)

    def key(self, seed: bytes) -> Signer:
        pkey = self._new_key(NID_ED25519, None, seed, len(seed))
        if not pkey:
            self._clear_errors()
            raise ValueError("OpenSSL refused the Ed25519 private key")
        public = ctypes.create_string_buffer(PUBLIC_BYTES)
        length = ctypes.c_size_t(PUBLIC_BYTES)
        if self._raw_public(pkey, public, ctypes.byref(length)) != 1 or length.value != PUBLIC_BYTES:
            self._free_key(pkey)
            self._clear_errors()
            raise ValueError("OpenSSL gave no Ed25519 public key")
        signer = Signer(public.raw, lambda message: self._one(pkey, message))
        # freed with its Signer, never at exit: a daemon thread may still be signing then (an agent's
        # key lives as long as its process anyway)
        weakref.finalize(signer, self._free_key, pkey).atexit = False
        return signer

    def _one(self, pkey: int, message: bytes) -> bytes:
        ctx = self._new_ctx()
        if not ctx:
            self._clear_errors()
            raise MemoryError("OpenSSL could not allocate a digest context")
        try:
            signature = ctypes.create_string_buffer(SIGNATURE_BYTES)
            length = ctypes.c_size_t(SIGNATURE_BYTES)
            if (
                self._init(ctx, None, None, None, pkey) != 1
                or self._sign(ctx, signature, ctypes.byref(length), message, len(message)) != 1
                or length.value != SIGNATURE_BYTES
            ):
                self._clear_errors()
                raise ValueError("OpenSSL failed to sign with the Ed25519 key")
            return signature.raw
        finally:
            self._free_ctx(ctx)


class _Cryptography:
    """The `cryptography` package, where the interpreter has no libcrypto to open."""

    def key(self, seed: bytes) -> Signer:
        from cryptography.hazmat.primitives import serialization  # noqa: PLC0415 - only without libcrypto
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: PLC0415

        private = Ed25519PrivateKey.from_private_bytes(seed)
        raw = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return Signer(raw, private.sign)


class Signer:
    """An Ed25519 private key: `sign(message)` gives its 64-byte signature; `public` is the raw public key."""

    def __init__(self, public: bytes, sign: Callable[[bytes], bytes]) -> None:
        self.public = public
        self._sign = sign
        self._lock = threading.Lock()

    def sign(self, message: bytes) -> bytes:
        with self._lock:  # one key shared by the agent's threads
            return self._sign(message)


def _libcrypto_paths() -> list[str]:
    """The libcrypto the interpreter has mapped (its `ssl` linked to it, from /proc); where /proc cannot be
    read, the library's sonames. None: the interpreter has no libcrypto of its own to share."""
    with contextlib.suppress(ImportError):  # an interpreter without ssl has none
        import _ssl  # noqa: F401, PLC0415 - links libcrypto in, when the interpreter has it as a library
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return list(SONAMES)
    paths: list[str] = []
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)  # address, mode, offset, device, inode, path
        if len(fields) == 6 and "/libcrypto.so" in fields[5] and fields[5].strip() not in paths:
            paths.append(fields[5].strip())
    return paths


_backend: _Libcrypto | _Cryptography | None = None
_backend_lock = threading.Lock()


def backend() -> _Libcrypto | _Cryptography:
    """The libcrypto the interpreter has, or `cryptography` where it has none to open."""
    global _backend  # noqa: PLW0603 - chosen once per process
    with _backend_lock:
        if _backend is None:
            _backend = _open()
        return _backend


def _open() -> _Libcrypto | _Cryptography:
    for path in _libcrypto_paths():
        try:
            return _Libcrypto(ctypes.CDLL(path))
        except (OSError, AttributeError):  # not there; an OpenSSL without raw keys
            continue
    return _Cryptography()


def private_key(seed: bytes) -> Signer:
    if len(seed) != SEED_BYTES:
        raise ValueError(f"an Ed25519 private key has {SEED_BYTES} bytes, not {len(seed)}")
    return backend().key(seed)
