"""The OpenPGP layer: seal/open round trips, every way a message can fail to open (not for
us, unknown signer, unsigned, only signed, garbage), key files, and the WebSocket proofs."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pysequoia
import pytest

from brokerd.protocols.socketmq.pgp import (
    Keyring,
    PGPError,
    SecretKey,
    check_client_proof,
    check_server_proof,
    client_proof,
    new_nonce,
    parse_cert,
    server_proof,
)

SERVER = SecretKey.generate("server")
ALICE = SecretKey.generate("alice")
MALLORY = SecretKey.generate("mallory")
RING = Keyring.from_armored(ALICE.armored_public())


def test_seal_and_open() -> None:
    sealed = ALICE.seal(b"secret \x00 payload", SERVER.cert)
    assert b"secret" not in sealed
    plaintext, signer = SERVER.open(sealed, RING)
    assert plaintext == b"secret \x00 payload"
    assert (signer.user_id, signer.fingerprint) == ("alice", ALICE.fingerprint)
    armored = ALICE.seal(b"x", SERVER.cert, armor=True)
    assert armored.startswith(b"-----BEGIN PGP MESSAGE-----")
    assert SERVER.open(armored, RING)[0] == b"x"


@pytest.mark.parametrize(
    "message",
    [
        MALLORY.seal(b"x", SERVER.cert),  # unknown signer
        ALICE.seal(b"x", MALLORY.cert),  # not for us
        pysequoia.encrypt(b"x", recipients=[SERVER.cert]),  # unsigned
        pysequoia.sign(ALICE._tsk.signer(), b"x"),  # signed, not encrypted
        b"",
        b"garbage",
        b"-----BEGIN PGP MESSAGE-----\n\nAAAA\n-----END PGP MESSAGE-----\n",
    ],
)
def test_what_does_not_open(message: bytes) -> None:
    with pytest.raises(PGPError) as error:
        SERVER.open(message, RING)
    assert "\n" not in str(error.value)  # one line, no Rust backtrace


def test_keyring() -> None:
    ring = Keyring.from_armored(ALICE.armored_public() + MALLORY.armored_public())
    assert len(ring) == 2 and ring.get(ALICE.fingerprint.upper()) is not None
    assert len(Keyring.from_armored("  \n")) == 0
    with pytest.raises(PGPError):
        Keyring.from_armored("not a key")
    secret_ring = Keyring.from_armored(ALICE.armored_secret())  # a careless ring with secrets
    (cert,) = secret_ring.certs()
    assert "PRIVATE" not in str(cert)
    assert parse_cert(ALICE.armored_public()).fingerprint == ALICE.fingerprint
    with pytest.raises(PGPError):
        parse_cert(b"nope")


def test_server_key_file_is_created_once_and_private(tmp_path: Path) -> None:
    path = tmp_path / "socketmq" / "server-key.asc"
    first = SecretKey.load_or_create(path, "brokerd")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert SecretKey.load_or_create(path, "brokerd").fingerprint == first.fingerprint
    path.write_text("broken")
    with pytest.raises(PGPError):
        SecretKey.load_or_create(path, "brokerd")


def test_websocket_proofs() -> None:
    server_nonce, client_nonce = new_nonce(), new_nonce()
    proof = client_proof(ALICE, SERVER.cert, server_nonce, client_nonce)
    identity, nonce = check_client_proof(SERVER, proof, RING, server_nonce)
    assert (identity.user_id, nonce) == ("alice", client_nonce)
    answer = server_proof(SERVER, identity.cert, nonce)
    check_server_proof(ALICE, answer, SERVER.cert, client_nonce)
    with pytest.raises(PGPError, match="another connection"):
        check_client_proof(SERVER, proof, RING, new_nonce())
    with pytest.raises(PGPError):
        check_server_proof(ALICE, answer, MALLORY.cert, client_nonce)  # not signed by that key
    with pytest.raises(PGPError, match="does not answer"):
        check_server_proof(ALICE, answer, SERVER.cert, new_nonce())
    not_a_proof = ALICE.seal(b"[1, 2]", SERVER.cert, armor=True).decode()
    with pytest.raises(PGPError, match="not a socket.mq proof"):
        check_client_proof(SERVER, not_a_proof, RING, server_nonce)
