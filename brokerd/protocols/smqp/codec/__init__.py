"""SMQP (draft-tegen-smqp-09) wire codec, sans-IO: bytes in, events out; and back.

The wire is text lines (CRLF; a bare LF is accepted) with two kinds of multi-line content:

- a **message body** after ``PUBLISH MESSAGE`` (client) and ``NOTIFY MESSAGE``/``NOTIFY
  RECEIPT`` (server): header attributes (``Name: value``), a blank line, then data sections,
  each its own attributes (Content-Type and Content-Length required), a blank line and exactly
  Content-Length bytes (which may hold anything, line ends included); blank lines between
  sections; a final ``.`` line.  Content-Length, never the ``.``, delimits the data.
- the **contact lines** after ``SET LOGIN CONTACT mime``: text lines up to a ``.`` line.

Malformed input never ends the session: every command line, and every body, yields exactly
one event; a bad one is a :class:`~brokerd.protocols.smqp.events.Rejected` carrying its reply
code.  A bad body is skipped up to its ``.`` line (or, when only its size is wrong, by its
Content-Length counts, without buffering the excess).  Memory per connection is bounded by
:data:`MAX_LINE` plus :data:`MAX_MESSAGE` (or :data:`MAX_CONTACT`).

Blank lines between commands are ignored: the draft's examples show an empty ``C:`` line
after most commands.

Nothing here touches a socket, a reactor or a clock.  The grammar's keywords are
case-insensitive and every abbreviation the draft lists is accepted (PASS, MESS, SUB, UNSUB,
REM, SUS, RES, KEY, PUB; REN, DEL, SERV in notifications).

One extension: ``SET TOPIC TIMEOUT topic seconds|INFINITE|DEFAULT`` and ``GET TOPIC TIMEOUT
topic`` (per-topic default message timeouts, which the draft describes but names no command
for; docs/smqp.md).

The codec is split by responsibility: :mod:`.values` (limits, names, date-times, timeouts,
keywords), :mod:`.grammar` (command lines), :mod:`.reader` (input framing and the server-side
parser), :mod:`.replies` (the client-side parser) and :mod:`.writers` (encoders).  This
package exports their public names.
"""
from __future__ import annotations

from brokerd.protocols.smqp.codec.values import (  # noqa: F401
    BAD_REQUEST,
    CRLF,
    INFINITE,
    MAX_CONTACT,
    MAX_DEPTH,
    MAX_FIND_DEPTH,
    MAX_HEADER_ATTRIBUTES,
    MAX_KEYWORD,
    MAX_KEYWORDS,
    MAX_LEAF,
    MAX_LINE,
    MAX_MESSAGE,
    MAX_SECTIONS,
    MAX_SECTION_ATTRIBUTES,
    MAX_SERVER_LINE,
    MAX_TOPIC_TIMEOUT_DIGITS,
    MAX_WORD,
    SMQPProtocolError,
    TOO_LARGE,
    TOPIC_TIMEOUT_MODES,
    UNKNOWN_COMMAND,
    VERSION,
    format_datetime,
    format_keywords,
    format_timeout,
    is_leaf,
    is_valid_word,
    parse_datetime,
    parse_keywords,
    parse_timeout,
    parse_topic,
    parse_topic_timeout,
)
from brokerd.protocols.smqp.codec.grammar import (  # noqa: F401
    BODY_CONTACT,
    BODY_MESSAGE,
    BODY_NONE,
    body_follows,
    parse_command,
)
from brokerd.protocols.smqp.codec.reader import (  # noqa: F401
    SMQPParser,
)
from brokerd.protocols.smqp.codec.replies import (  # noqa: F401
    SMQPClientParser,
)
from brokerd.protocols.smqp.codec.writers import (  # noqa: F401
    decode_body,
    encode_attribute,
    encode_body,
    encode_command,
    encode_contact,
    encode_greeting,
    encode_notify,
    encode_publish,
    encode_reply,
)
