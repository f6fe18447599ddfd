"""Every limit the socket.mq front end enforces, in one place (docs/socketmq.md lists them).

These are the protocol's fixed bounds; the ones an operator tunes are Settings fields
(``socketmq_*``: the frames of one message, the request, read and handshake timeouts), read
by the Hub.
"""
from __future__ import annotations

PROTOCOL_VERSION = 1
"""The socket.mq interface version this server speaks (``Socket-MQ-Version`` header)."""
SUBPROTOCOL = "socketmq.v1"
"""The WebSocket subprotocol a client must offer."""

MAX_BODY = 1 << 20
"""Bytes of one POST body (after transfer decoding); larger requests get 413 and a close."""
MAX_WS_MESSAGE = MAX_BODY + 4096
"""Bytes of one WebSocket message (a JSON header plus a payload); larger ones close with 1009."""
MAX_HEADER = 4096
"""Bytes of the JSON header that starts a binary WebSocket message."""
MAX_EVENT_NAME = 255
"""UTF-8 bytes of an event (topic) name."""
MAX_APPLICATION_NAME = 64
"""Characters of an application name (``[A-Za-z0-9._-]``)."""
MAX_REQUEST_ID = 255
"""UTF-8 bytes of a request id (one URL path segment)."""
MAX_MESSAGE_ID = 64
"""Characters of a string ``id`` in a WebSocket request."""
MAX_TEXT_FIELD = 16384
"""Characters of any other string field (reasons, proofs, content types)."""
MAX_PENDING_PER_APPLICATION = 1024
"""Forwarded requests one registered application may have unanswered; more get 503."""
MAX_REGISTRATIONS = 16
"""Applications one WebSocket session may serve."""
HTTP_IDLE_TIMEOUT = 60.0
"""Seconds an idle HTTP connection is kept open."""
MAX_POLICY_FILE = 1 << 20
"""Bytes of the policy file and of the key ring it names."""

