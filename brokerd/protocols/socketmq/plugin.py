"""The socket.mq front end as brokerd builds it: its :class:`~brokerd.frontend.IFrontEnd`
plugin (brokered mode: many applications on one port, events are broker topics)."""
from __future__ import annotations

from twisted.logger import Logger

from brokerd.errors import ConfigurationError
from brokerd.frontend import FrontEndPlugin, Services
from brokerd.protocols.socketmq.hub import Hub
from brokerd.protocols.socketmq.pgp import PGPError, SecretKey
from brokerd.protocols.socketmq.policy import load_policy
from brokerd.protocols.socketmq.server import SERVER_KEY_USER_ID, SocketMQSite, build_site, server_key_path

_log = Logger()


def build_hub(services: Services) -> Hub:
    """brokerd's Hub: the broker and portal of ``services``, the policy file, the server key."""
    settings = services.settings
    policy = load_policy(settings.socketmq_policy)
    key = None
    if policy.enabled:
        path = server_key_path(settings)
        try:
            key = SecretKey.load_or_create(path, SERVER_KEY_USER_ID)
        except (OSError, PGPError) as exc:
            raise ConfigurationError(f"--socketmq-key {path}: {exc}") from None
    try:
        return Hub(
            services.broker, services.reactor, settings, services.portal, policy, key,
            events=services.event_log, work_queue=services.work_queue,
        )
    except PGPError as exc:
        raise ConfigurationError(f"--socketmq-policy {policy.source}: keyring: {exc}") from None


class SocketMQPlugin(FrontEndPlugin):
    name = "socketmq"
    title = "socket.mq"

    def build(self, services: Services) -> SocketMQSite:
        """One Site shared by every ``--socketmq`` listener (so applications registered on one
        are served on all), serving the WebSockets other front ends mount."""
        hub = build_hub(services)
        _log.info(
            "socket.mq: security {security}, {keys} client keys, server key {fingerprint}",
            security=hub.security,
            keys=len(hub.keyring),
            fingerprint=hub.key.fingerprint if hub.key is not None else "-",
        )
        return build_site(hub, mounts=services.websocket_mounts)


front_end = SocketMQPlugin()
