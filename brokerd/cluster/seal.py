"""Sealing: every message a node writes to Redis is authenticated, encrypted and numbered.

A Redis client that is not a node (anyone on Redis's network, another application sharing
the server) must not be able to read what nodes tell each other, forge a message, move one to
another channel, or play one again.  The nodes share a secret (``--cluster-secret-file``);
this module turns it into keys, seals what the engine writes and opens what it reads, before
any decoder sees the bytes.  A frame that does not open is dropped and counted by reason.

AES-256-GCM rather than ChaCha20-Poly1305: with the AES instructions of current x86 and ARM
servers it costs about half as much per byte here (5-6 us against 9-10 us to open 16 KB),
and a receiving node opens every run it is sent.

Layout of a sealed frame (big-endian)::

    frame  := version:u8 key_id:4 sender:8 sequence:u64 sent_at:u64 box
    box    := AES-256-GCM(key(key_id, sender), nonce = sequence as 12 bytes,
                          plaintext, associated data = the 29 header bytes + channel name)

* ``key_id``: 4 bytes derived from the secret line (HKDF-SHA256), not the secret itself.  The
  secret file's first line seals; each line (at most two) opens: that is key rotation.
* ``sender``: the sending process's incarnation, 8 random bytes chosen at each start (the
  engine's instance id).  Each (secret, incarnation) has its own AES-256-GCM key,
  HKDF-Expand of the secret's key with the incarnation, so the 96-bit nonce made of the
  incarnation's sequence is never used twice under one key whatever the number of nodes.
* ``sequence``: 1, 2, 3... per incarnation, over every channel it writes to.
* ``sent_at``: the sender's wall clock in milliseconds, never going backwards within an
  incarnation.

A receiver keeps, per (sender incarnation, channel), the highest sequence it opened and that
frame's ``sent_at``.  Redis delivers one publisher's messages on one channel in order (a
channel hashes to one shard), while different channels may interleave differently, hence a
number per channel and not per sender.  A frame whose sequence is not above the channel's is
a replay; a frame whose ``sent_at`` is more than ``window`` seconds (``--cluster-node-timeout``)
from the receiver's clock is stale, whatever its sequence: a receiver that has just started and
knows nothing of a sender cannot be fed traffic older than that.  An entry whose ``sent_at``
is older than the window is forgotten (a replay of anything it covered is stale anyway), so
what a node remembers is bounded by what the nodes sent it within one window, and capped.

The sequences only cover what a node opened.  A frame sealed for a channel before the node
subscribed to it (before the node started, or while it did not follow the channel, or before it
subscribed again after losing its Redis connection) was never meant for it, yet no sequence of
its sender is on record there: a Redis client that captured one could play it to the node while
it is still fresh.  So a receiver also keeps, per channel it follows, the time it last asked
Redis for it (its start for a channel it no longer follows), and refuses a frame whose
``sent_at`` is older than that less ``skew`` (``--cluster-clock-skew``: how far the nodes'
clocks may disagree).  What remains playable is a frame sealed within ``skew`` before the
subscription, once, and only until the sender's next frame on the channel is opened.
"""
from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF, HKDFExpand

from brokerd.config import Settings, check_private_mode
from brokerd.errors import ConfigurationError

VERSION = 1
"""The frame layout's version byte; any other is malformed."""
HEADER = struct.Struct(">B4s8sQQ")
"""version, key id, sender incarnation, sequence, sent_at (ms)."""
HEADER_SIZE = HEADER.size
TAG_SIZE = 16
OVERHEAD = HEADER_SIZE + TAG_SIZE
"""Bytes sealing adds to a message."""
REASONS = ("malformed", "unknown_key", "bad_tag", "replay", "stale", "early", "overflow")
"""Why a frame is rejected (the ``reason`` label of brokerd_cluster_rejected_total):
too short or another version; a key id no line of the secret file has; a tag that does not
verify (forged, damaged, or moved to another channel); a sequence already seen on the channel;
a ``sent_at`` outside the freshness window; a ``sent_at`` before this node last subscribed to
the channel, less the clock skew allowance; more senders or channels than a node tracks."""
MIN_SECRET = 16
"""Bytes a secret line must have at least (e.g. ``head -c 32 /dev/urandom | base64``)."""
MAX_LINES = 2
MAX_SENDERS = 4096
"""Sender incarnations a node tracks at once (nodes, and their restarts within a window)."""
MAX_CHANNELS = 1 << 20
"""(sender, channel) entries a node tracks at once, all senders together."""
LOG_INTERVAL = 60.0
"""Seconds between two log lines about rejected frames (each says how many since the last)."""

_SALT = b"brokerd cluster seal"
_KEY_INFO = b"brokerd cluster seal key v1"
_ID_INFO = b"brokerd cluster seal key id v1"
_SENDER_INFO = b"brokerd cluster seal sender v1:"
_NONCE_PAD = bytes(4)


def _hkdf(secret: bytes, info: bytes, length: int) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=_SALT, info=info).derive(secret)


class Key:
    """One line of the secret file, as a key id and the key each sender's key comes from."""

    __slots__ = ("key_id", "_root")

    def __init__(self, secret: bytes) -> None:
        self.key_id = _hkdf(secret, _ID_INFO, 4)
        self._root = _hkdf(secret, _KEY_INFO, 32)

    def for_sender(self, sender: bytes) -> AESGCM:
        """The AEAD of ``sender``'s frames under this key."""
        return AESGCM(HKDFExpand(hashes.SHA256(), 32, _SENDER_INFO + sender).derive(self._root))


def read_secret_file(path: Path | str, option: str = "--cluster-secret-file") -> list[bytes]:
    """The secret lines of the file (the first seals, every one opens): ConfigurationError,
    one line naming ``option``, when the file cannot be read, is readable or writable by group
    or others, holds no line, more than two, or a line shorter than MIN_SECRET bytes."""
    try:
        with open(path, "rb") as handle:
            mode = os.fstat(handle.fileno()).st_mode
            data = handle.read(1 << 16)
    except OSError as exc:
        raise ConfigurationError(f"{option} {path}: {exc.strerror}") from None
    check_private_mode(mode, path, option)
    lines = [line.strip() for line in data.splitlines() if line.strip()]
    if not lines:
        raise ConfigurationError(f"{option} {path}: the file is empty")
    if len(lines) > MAX_LINES:
        raise ConfigurationError(f"{option} {path}: {len(lines)} lines, at most {MAX_LINES} (the new secret, then the old)")
    if any(len(line) < MIN_SECRET for line in lines):
        raise ConfigurationError(f"{option} {path}: a secret line shorter than {MIN_SECRET} bytes")
    return lines


class Sealer:
    """One node's sealing and opening (see the module's docstring for the scheme).

    ``incarnation`` is this process's sender id; ``window`` the freshness window in seconds;
    ``clock`` the wall clock (seconds); ``skew`` how far (seconds) the senders' clocks may be
    behind this one's when it subscribes to a channel."""

    def __init__(self, secrets: Sequence[bytes], incarnation: bytes, window: float,
                 clock: Callable[[], float] = time.time, skew: float = Settings.cluster_clock_skew) -> None:
        if len(incarnation) != 8:
            raise ValueError("an incarnation is 8 bytes")
        self.incarnation = incarnation
        self.window_ms = int(window * 1000)
        self.clock = clock
        self.skew_ms = int(skew * 1000)
        self._started = int(clock() * 1000) - self.skew_ms
        """The oldest ``sent_at`` opened on a channel not in ``_since``: this node's start."""
        self._since: dict[bytes, int] = {}
        """channel -> the oldest ``sent_at`` opened on it: when this node last asked Redis for
        it, less the skew (one entry per channel the node follows)."""
        self._sequence = 0
        self._last_sent = 0
        self._seen: dict[bytes, dict[bytes, list[int]]] = {}
        """sender -> channel -> [highest sequence opened, its sent_at]."""
        self._tracked = 0
        self.rejected = dict.fromkeys(REASONS, 0)
        self._unlogged = 0
        self._logged_at = -LOG_INTERVAL
        self.log: Callable[[dict[str, int]], None] | None = None
        """Called at most once per LOG_INTERVAL with the rejections since the last call."""
        self._since_log = dict.fromkeys(REASONS, 0)
        self.observers: list[Callable[[str], None]] = []
        """Called with the reason of each rejection (the admin's figures read ``rejected``)."""
        self.install(secrets)

    # ------------------------------------------------------------------ keys

    def install(self, secrets: Sequence[bytes]) -> None:
        """Seal with the first secret from now on, open with any of them."""
        keys = [Key(secret) for secret in secrets]
        self._sealing = keys[0]
        self._keys = {key.key_id: key for key in keys}
        self._own = keys[0].for_sender(self.incarnation)
        self._opening: dict[tuple[bytes, bytes], AESGCM] = {}
        """(key id, sender) -> AEAD, for senders whose frames opened (bounded by MAX_SENDERS)."""

    @property
    def key_ids(self) -> list[bytes]:
        """The key ids in the secret file's order (the first seals)."""
        return [self._sealing.key_id, *(key_id for key_id in self._keys if key_id != self._sealing.key_id)]

    # ------------------------------------------------------------------ sealing

    def seal(self, channel: bytes, data: bytes) -> bytes:
        """``data`` as a frame for ``channel``: only that channel's receivers open it."""
        self._sequence = sequence = self._sequence + 1
        now = int(self.clock() * 1000)
        if now < self._last_sent:
            now = self._last_sent
        self._last_sent = now
        header = HEADER.pack(VERSION, self._sealing.key_id, self.incarnation, sequence, now)
        return header + self._own.encrypt(sequence.to_bytes(8, "big") + _NONCE_PAD, data, header + channel)

    def open_own(self, channel: bytes, frame: bytes) -> bytes | None:
        """The plaintext of a frame this node sealed (to count what a dropped publish
        carried); None if it is not one."""
        if len(frame) < OVERHEAD or frame[5:13] != self.incarnation:
            return None
        key = self._keys.get(frame[1:5])
        if key is None:
            return None
        aead = self._own if key is self._sealing else key.for_sender(self.incarnation)
        try:
            return aead.decrypt(frame[13:21] + _NONCE_PAD, frame[HEADER_SIZE:], frame[:HEADER_SIZE] + channel)
        except InvalidTag:
            return None

    # ------------------------------------------------------------------ opening

    def open(self, channel: bytes, frame: bytes) -> bytes | None:
        """The plaintext of a frame read on ``channel``, or None: this node's own echo
        (skipped, not counted), or a frame rejected (counted by reason)."""
        if len(frame) < OVERHEAD:
            self._reject("malformed")
            return None
        version, key_id, sender, sequence, sent_at = HEADER.unpack_from(frame)
        if version != VERSION:
            self._reject("malformed")
            return None
        if sender == self.incarnation:
            return None
        key = self._keys.get(key_id)
        if key is None:
            self._reject("unknown_key")
            return None
        now = int(self.clock() * 1000)
        if sent_at < now - self.window_ms or sent_at > now + self.window_ms:
            self._reject("stale")
            return None
        channels = self._seen.get(sender)
        entry = channels.get(channel) if channels is not None else None
        if entry is not None and sequence <= entry[0]:
            self._reject("replay")
            return None
        if sent_at < self._since.get(channel, self._started):
            self._reject("early")
            return None
        aead = self._opening.get((key_id, sender))
        cached = aead is not None
        if aead is None:
            aead = key.for_sender(sender)
        header = frame[:HEADER_SIZE]
        try:
            data = aead.decrypt(frame[13:21] + _NONCE_PAD, frame[HEADER_SIZE:], header + channel)
        except InvalidTag:
            self._reject("bad_tag")
            return None
        if entry is not None:
            entry[0] = sequence
            entry[1] = sent_at
        elif not self._track(sender, channels, channel, sequence, sent_at, now):
            self._reject("overflow")
            return None
        if not cached and len(self._opening) < 2 * MAX_SENDERS:
            self._opening[(key_id, sender)] = aead
        return data

    def subscribing(self, channel: bytes) -> None:
        """This node asks Redis for ``channel`` (at its start, when a topic gets its first
        member, again after a lost connection or a slot's move): a frame sealed for it before
        now, less the skew, was sent while this node did not receive the channel."""
        self._since[channel] = int(self.clock() * 1000) - self.skew_ms

    def unsubscribed(self, channel: bytes) -> None:
        """This node no longer wants ``channel`` (what it follows bounds ``_since``)."""
        self._since.pop(channel, None)

    def _track(self, sender: bytes, channels: dict[bytes, list[int]] | None, channel: bytes,
               sequence: int, sent_at: int, now: int) -> bool:
        if self._tracked >= MAX_CHANNELS or (channels is None and len(self._seen) >= MAX_SENDERS):
            self.expire(now / 1000)
            channels = self._seen.get(sender)
            if self._tracked >= MAX_CHANNELS or (channels is None and len(self._seen) >= MAX_SENDERS):
                return False
        if channels is None:
            channels = self._seen[sender] = {}
        channels[channel] = [sequence, sent_at]
        self._tracked += 1
        return True

    def expire(self, now: float | None = None) -> None:
        """Forget what is older than the window (the engine calls this at each heartbeat):
        a replay of anything it covered is stale."""
        limit = int((self.clock() if now is None else now) * 1000) - self.window_ms
        for sender in list(self._seen):
            channels = self._seen[sender]
            for channel in [channel for channel, entry in channels.items() if entry[1] < limit]:
                del channels[channel]
                self._tracked -= 1
            if not channels:
                del self._seen[sender]
                for key_id in self._keys:
                    self._opening.pop((key_id, sender), None)

    @property
    def senders(self) -> int:
        """Sender incarnations tracked now."""
        return len(self._seen)

    # ------------------------------------------------------------------ rejections

    def _reject(self, reason: str) -> None:
        self.rejected[reason] += 1
        self._since_log[reason] += 1
        for observer in self.observers:
            observer(reason)
        now = time.monotonic()
        if self.log is not None and now - self._logged_at >= LOG_INTERVAL:
            self._logged_at = now
            since, self._since_log = self._since_log, dict.fromkeys(REASONS, 0)
            self.log({reason: count for reason, count in since.items() if count})
