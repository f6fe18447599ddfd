"""The session registry: which sessions are attached, and which holds each address.

Why apart from routing and subscriptions: who holds an address is decided here alone (a later
login takes it over, but in a namespace whose addresses belong to a principal only that
principal's), and the same decision must hold whether the other login is on this node or on
another node of a cluster.  The router reads ``addresses`` to deliver a unicast.
"""
from __future__ import annotations

from brokerd.core.engine import IN_MEMORY
from brokerd.core.principal import Principal
from brokerd.interfaces import IEngine, ISubscriber


class SessionRegistry:
    """Attached sessions and their addresses, one namespace per protocol
    (``ISubscriber.protocol``): a session can only replace, and a unicast only reach, a session
    of the namespace it names."""

    def __init__(self) -> None:
        self.sessions: set[ISubscriber] = set()
        self.addresses: dict[tuple[str, bytes], ISubscriber] = {}
        """(namespace, address) -> the session that holds it."""
        self.owned_namespaces: set[str] = set()
        """Namespaces whose addresses belong to the principal whose session has one (MQTT's
        client identifiers, which a client chooses): a login of another principal takes none
        over, on this node or another (:meth:`may_take_address`)."""
        self.engine: IEngine = IN_MEMORY
        """Asked who holds an address on another node of a cluster."""

    def __contains__(self, session: object) -> bool:
        return session in self.sessions

    def add(self, session: ISubscriber) -> ISubscriber | None:
        """Register ``session``, giving it its address: the other session that held the
        address (for the caller to detach and tell), or None."""
        self.sessions.add(session)
        address = session.address
        if address is None:
            return None
        key = (session.protocol, address)
        previous = self.addresses.get(key)
        self.addresses[key] = session
        return previous if previous is not session else None

    def remove(self, session: ISubscriber) -> bool:
        """Forget ``session``: whether it freed an address it held (so a cluster is told)."""
        self.sessions.discard(session)
        address = session.address
        if address is None:
            return False
        key = (session.protocol, address)
        if self.addresses.get(key) is not session:
            return False
        del self.addresses[key]
        return True

    def holder(self, namespace: str, address: bytes) -> ISubscriber | None:
        """The session of protocol ``namespace`` at ``address``, if any."""
        return self.addresses.get((namespace, address))

    def may_take_address(self, namespace: str, address: bytes, principal: Principal | None) -> bool:
        """Whether a login of ``principal`` may take ``address`` over from the session that has
        it, on this node or (the principal its login was announced with) on another: always,
        but in an owned namespace only the same principal's."""
        if namespace not in self.owned_namespaces:
            return True
        holder = self.addresses.get((namespace, address))
        owner = holder.principal if holder is not None else self.engine.principal_of(namespace, address)
        return owner is None or owner == principal

    def loses_to(self, namespace: str, address: bytes, principal: Principal | None, later: bool) -> ISubscriber | None:
        """A session on another node logged in with ``address`` as ``principal``, ``later`` (or
        not) than the local session that has it: that local session when it must give way
        (for the caller to detach and tell), else None.  A login that may take the address
        over wins if it is the later one, as one node closes the older of two logins; one
        that may not (another principal's, in an owned namespace) wins only if it is the
        earlier one, the local login having been accepted before this node heard of it."""
        previous = self.addresses.get((namespace, address))
        if previous is None or self.may_take_address(namespace, address, principal) != later:
            return None
        return previous
