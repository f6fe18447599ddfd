"""Twisted internals brokerd's fast writes rely on, checked per release, in one place.

Twisted's ``transport.write`` never writes at once: it queues the bytes, asks the reactor for
writability (an ``epoll_ctl``), and writes in a later ``doWrite`` round, then stops asking
(another ``epoll_ctl``).  For a connection whose queue is empty, one ``send()`` at once does
the same work in a fraction of the CPU.  No public API offers that, so it is taken only on
the Twisted releases whose ``FileDescriptor`` and ``tcp.Connection`` code was read and
checked (tests/protocols/test_flow.py fails on any other release and on any change of that
code); elsewhere brokerd uses ``transport.write``, which is public, correct and slower.

Every read of those internals is in this module, each behind :data:`FAST_PATHS`, with the
public-API fallback beside it: the front ends' flow control (brokerd.protocols.flow) takes
:func:`limit_output_buffer` and :class:`DirectWrites` for deliveries, the cluster engine
(brokerd.cluster.shards) :func:`send_now` for its pipelined writes to Redis, and the admin
listener :func:`queued_bytes` for its figures and its event streams' bound.  One more, not
a fast path: :func:`twistd_with_one_command`, how the ``brokerd`` command hands its service
to twistd's runner.
"""
from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any, TypeGuard

import twisted
from twisted.internet.interfaces import ITransport
from twisted.internet.tcp import Connection

if TYPE_CHECKING:
    from twisted.application.service import IServiceMaker

CHECKED_TWISTED = ((26, 4), (26, 10))
"""(major, minor) of the Twisted releases whose internals the fast paths were checked on."""


def twisted_release() -> tuple[int, int]:
    """The installed Twisted's (major, minor); (0, 0) for an unreleased one (its major is
    incremental's ``"NEXT"``), on which no fast path was checked."""
    version = twisted.version
    if not isinstance(version.major, int):
        return (0, 0)
    return (version.major, version.minor)


FAST_PATHS = twisted_release() in CHECKED_TWISTED
"""Whether this Twisted is one the fast paths were checked on."""


def direct_writes(transport: object) -> TypeGuard[Connection]:
    """True for a plain TCP transport on a checked Twisted, whose socket brokerd may write
    itself (not TLS: its bytes must go through the TLS layer)."""
    return FAST_PATHS and isinstance(transport, Connection) and not getattr(transport, "TLS", False)


def limit_output_buffer(transport: object, limit: int) -> None:
    """Make Twisted pause the producer when more than ``limit`` bytes are queued.  For TLS the
    queue that matters is the TCP transport's under the TLS layer.

    Twisted compares its queue with ``bufferSize``, which is also the size of every recv();
    a 1 MiB limit would make each read up to 1 MiB, so one reactor iteration could parse
    megabytes from every publisher before it wrote anything.  On a checked Twisted the
    comparison of a real transport is replaced instead, and reads stay at Twisted's 64 KiB;
    elsewhere the limit goes through ``bufferSize`` (public, correct, larger reads)."""
    inner = getattr(transport, "transport", None)
    for layer in (transport, inner):
        if layer is None:
            continue
        if FAST_PATHS and isinstance(layer, Connection):
            layer._isSendBufferFull = partial(_queued_over, layer, limit)  # type: ignore[method-assign]  # replaced on purpose: see above
        elif layer is transport or hasattr(layer, "bufferSize"):
            setattr(layer, "bufferSize", limit)  # noqa: B010 (any transport: what Twisted compares its queue with)


def _queued_over(transport: Connection, limit: int) -> bool:
    return _queued(transport) > limit


def _queued(transport: Connection) -> int:
    return len(transport.dataBuffer) - transport.offset + transport._tempDataLen


def queued_bytes(transport: object) -> int | None:
    """Bytes written to a connection and not yet taken by the kernel (the TCP transport's
    queue, under the TLS layer if there is one); None when the transport does not tell: not
    a TCP transport, or a Twisted release whose queue was not checked (no public API tells)."""
    if not FAST_PATHS:
        return None
    for layer in (transport, getattr(transport, "transport", None)):
        if isinstance(layer, Connection):
            return _queued(layer)
    return None


class DirectWrites:
    """The ``write_now`` of a connection: :func:`send_now` with the transport's check made
    once, when the connection is made (:meth:`check_direct_writes`), because ``write_now``
    runs once per delivery and an extra call there costs more than the check."""

    _direct = False
    """Set by :meth:`check_direct_writes`."""

    transport: Any

    def check_direct_writes(self) -> None:
        self._direct = direct_writes(self.transport)

    def write_now(self, data: bytes) -> None:
        """Write ``data`` with one send() when nothing is queued for this connection; else,
        or for what the kernel did not take, queue it behind the rest as transport.write
        does.  transport.write always waits for the next reactor iteration and costs two
        epoll_ctl calls and a doWrite round per write; for a reader that keeps up, the queue
        is empty and one send() is all a delivery needs."""
        transport = self.transport
        if not self._direct or transport._tempDataLen or transport.dataBuffer or transport.disconnecting:
            transport.write(data)
            return
        try:
            sent = transport.socket.send(data)
        except BlockingIOError:
            sent = 0
        except OSError:
            transport.write(data)  # Twisted finds and reports the broken connection
            return
        if sent < len(data):
            transport.write(data[sent:])


def send_now(transport: ITransport, data: bytes) -> None:
    """Write ``data`` with one ``send()`` when the transport allows direct writes and nothing
    is queued for it; else, or for what the kernel did not take, queue it behind the rest as
    ``transport.write`` does (so the order of the bytes is kept either way)."""
    if not direct_writes(transport) or transport._tempDataLen or transport.dataBuffer or transport.disconnecting:
        transport.write(data)
        return
    try:
        sent = transport.socket.send(data)
    except BlockingIOError:
        sent = 0
    except OSError:
        transport.write(data)  # Twisted finds and reports the broken connection
        return
    if sent < len(data):
        transport.write(data[sent:])


def twistd_with_one_command(service_maker: IServiceMaker) -> type:
    """twistd's option parser with ``service_maker`` (an IServiceMaker) as its only command,
    for the ``brokerd`` console command: no plugin discovery, so it also runs where twistd
    cannot see the plugin (an editable install run from another directory).

    twistd's runner builds the application from ``loadedPlugins[subCommand]``, a dictionary
    its ``subCommands`` property fills while the options are parsed; this parser fills it with
    the one command.  Parsing with it and running with :func:`twisted.scripts.twistd.runApp`
    is tested end to end by tests/integration/test_startup.py on every release.
    """
    from twisted.scripts.twistd import ServerOptions

    class OneCommandServerOptions(ServerOptions):
        @property
        def subCommands(self):
            self.loadedPlugins = {service_maker.tapname: service_maker}
            yield service_maker.tapname, None, service_maker.options, service_maker.description

    return OneCommandServerOptions
