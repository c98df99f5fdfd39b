"""The agent's Ed25519 signer: RFC 8032's test vectors through the interpreter's libcrypto, the same bytes
as `cryptography` (which verifies them, as the workers do), key files either one reads, and bad key files
refused with what is wrong."""

from __future__ import annotations

import base64
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from faultline import ed25519

# RFC 8032 7.1, TEST 1-3: secret key, public key, message, signature
VECTORS = [
    ("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
     "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a", "",
     "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25b"
     "f5f0595bbe24655141438e7a100b"),
    ("4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
     "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c", "72",
     "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f11d8c387b"
     "2eaeb4302aeeb00d291612bb0c00"),
    ("c5aa8df43f9f837bedb7442f31dcb7b166d38535076f094b85ce3a2e0b4458f7",
     "fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025", "af82",
     "6291d657deec24024827e69c3abe01a30ce548a284743a445e3680d7db5ac3ac18ff9b538d16f290ae67f760984dc6594a7c"
     "15e9716ed28dc027beceea1ec40a"),
]  # fmt: skip


def test_the_interpreters_libcrypto_is_what_signs() -> None:
    # the image's interpreter (Debian's python3) and this one link libcrypto as a library: the file it
    # mapped is the one opened, not another OpenSSL found by name
    assert isinstance(ed25519.backend(), ed25519._Libcrypto)
    paths = ed25519._libcrypto_paths()
    assert paths and all("/libcrypto.so" in p for p in paths)


def test_without_a_libcrypto_to_open_cryptography_signs(monkeypatch: pytest.MonkeyPatch) -> None:
    # none there, or a library without OpenSSL's functions (libc): the same signatures from cryptography
    monkeypatch.setattr(ed25519, "_libcrypto_paths", lambda: ["/nonexistent/libcrypto.so.3", "libc.so.6"])
    chosen = ed25519._open()
    assert isinstance(chosen, ed25519._Cryptography)
    secret, public, message, signature = VECTORS[1]
    key = chosen.key(bytes.fromhex(secret))
    assert (key.public.hex(), key.sign(bytes.fromhex(message)).hex()) == (public, signature)


@pytest.mark.parametrize(
    "backend", [ed25519.backend, ed25519._Cryptography], ids=["libcrypto", "cryptography"]
)
@pytest.mark.parametrize(("secret", "public", "message", "signature"), VECTORS)
def test_rfc_8032_vectors(backend: object, secret: str, public: str, message: str, signature: str) -> None:
    key = backend().key(bytes.fromhex(secret))  # type: ignore[operator]
    assert key.public.hex() == public
    assert key.sign(bytes.fromhex(message)).hex() == signature


def test_what_it_signs_cryptography_verifies() -> None:
    seed = bytes(range(32))
    key = ed25519.private_key(seed)
    public = Ed25519PublicKey.from_public_bytes(key.public)
    for message in (b"", b"x", b"{" + b"a" * 100_000 + b"}"):
        signature = key.sign(message)
        public.verify(signature, message)  # raises InvalidSignature when not
        assert signature == Ed25519PrivateKey.from_private_bytes(seed).sign(message)


def test_threads_share_one_key() -> None:
    key = ed25519.private_key(b"\x07" * 32)
    public = Ed25519PublicKey.from_public_bytes(key.public)
    failures: list[BaseException] = []

    def sign_many(tag: int) -> None:
        try:
            for i in range(200):
                message = f"{tag}-{i}".encode()
                public.verify(key.sign(message), message)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=sign_many, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


def test_key_files_either_library_reads() -> None:
    seed = b"\x42" * 32
    ours = ed25519.to_pem(seed)
    theirs = Ed25519PrivateKey.from_private_bytes(seed).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    assert ours == theirs
    assert ed25519.from_pem(theirs) == seed
    loaded = serialization.load_pem_private_key(ours, password=None)
    assert isinstance(loaded, Ed25519PrivateKey) and loaded.private_bytes_raw() == seed
    # PKCS #8 version 1 (OneAsymmetricKey) carries the public key after the seed (RFC 8410 10.3)
    public = ed25519.private_key(seed).public
    der = bytes.fromhex("3051020101300506032b657004220420") + seed + bytes.fromhex("812100") + public
    v1 = b"-----BEGIN PRIVATE KEY-----\n" + base64.encodebytes(der) + b"-----END PRIVATE KEY-----\n"
    assert ed25519.from_pem(v1) == seed
    assert ed25519.from_pem(_pem(_V1)) == b"\x42" * 32
    # text around the PEM block, as OpenSSL (and so cryptography) allows
    assert ed25519.from_pem(b"a note\n" + theirs + b"\n") == seed


# a OneAsymmetricKey (version 1): the seed 0x42..., then [1] a public key (RFC 8410 10.3); read whole in
# test_key_files_either_library_reads, refused below once its lengths or its tail are wrong
_V1 = bytes.fromhex(
    "3051020101300506032b657004220420" + "42" * 32 + "812100"
    + "2152e1e0a2e2a0b0a6a7e1b9d1e0b8f7c6b5a4938271605f4e3d2c1b0a998877"
)  # fmt: skip


def _pem(der: bytes) -> bytes:
    return b"-----BEGIN PRIVATE KEY-----\n" + base64.encodebytes(der) + b"-----END PRIVATE KEY-----\n"


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"not a key", "no BEGIN/END PRIVATE KEY"),
        (b"", "no BEGIN/END PRIVATE KEY"),
        (b"-----BEGIN PRIVATE KEY-----\n%%%%\n-----END PRIVATE KEY-----\n", "not base64"),
        (_pem(bytes.fromhex("302e020100300506032b657004220420") + b"\x01" * 31), "not an Ed25519 key"),
        (
            _pem(bytes.fromhex("302e020100300506032b657104220420") + b"\x01" * 32),
            "not an Ed25519 key",
        ),  # Ed448's id
        (_pem(b"\x30"), "not an Ed25519 key"),
        (_pem(b"\x30\x82"), "not an Ed25519 key"),
        # version 1 with its lengths wrong, or more after the seed than attributes and a public key
        (_pem(_V1[:1] + b"\x52" + _V1[2:]), "not an Ed25519 key"),
        (_pem(_V1[:1] + b"\x80" + _V1[2:] + b"\x00\x00"), "not an Ed25519 key"),
        (_pem(_V1[:1] + bytes([_V1[1] + 2]) + _V1[2:] + b"\x04\x00"), "not an Ed25519 key"),
        (_pem(_V1[:1] + bytes([_V1[1] + 1]) + _V1[2:] + b"\x81"), "not an Ed25519 key"),
    ],
)
def test_key_files_that_are_not_an_ed25519_key(data: bytes, why: str) -> None:
    with pytest.raises(ed25519.KeyFormatError, match=why):
        ed25519.from_pem(data)


def test_an_rsa_key_file_is_refused() -> None:
    pem = rsa.generate_private_key(public_exponent=65537, key_size=1024).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    with pytest.raises(ed25519.KeyFormatError, match="not an Ed25519 key"):
        ed25519.from_pem(pem)


def test_a_key_of_the_wrong_size() -> None:
    with pytest.raises(ValueError, match="32 bytes, not 31"):
        ed25519.private_key(b"\x01" * 31)
    with pytest.raises(ValueError, match="32 bytes, not 33"):
        ed25519.to_pem(b"\x01" * 33)


def test_signing_loads_no_cryptography(tmp_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from faultline import evidence; "
        f"k = evidence.NodeKey.load_or_create(Path({str(tmp_path)!r}), 'n1'); k.sign('f', {{'node': 'n1'}}); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'cryptography'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
