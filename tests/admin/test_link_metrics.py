"""How /metrics renders the SMQP server links' state (brokerd.protocols.smqp.links)."""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from brokerd.admin.metrics import exposition


def test_metrics_render_link_state_and_counts() -> None:
    snapshot = {
        "version": "1.0", "uptime_seconds": 1.0,
        "connections": {"open": 0, "refused": 0, "by_protocol": {}, "made": {}},
        "sessions": {}, "logins": {}, "auth_failures": {},
        "messages": {"accepted": 0, "delivered": 0, "accepted_by_protocol": {}, "delivered_by_protocol": {},
                     "routed": {}},
        "dropped": {"slow_consumer": 0}, "slow_consumers": 0, "slow_consumer_episodes": 0, "topics": 0,
        "subscriptions": 0, "retained": {"messages": 0, "bytes": 0, "refused": {}}, "event_log": None, "thread_pools": {}, "store": None,
        "process": {"resident_memory_bytes": 1, "open_fds": 1, "max_fds": 2},
        "smqp_links": [
            {"domain": "alpha.test", "state": "up", "subscriptions": 2, "connects": 3, "received": 7, "refused": 1,
             "sent": 4, "undeliverable": 2},
            {"domain": "beta.test", "state": "connecting", "subscriptions": 0, "connects": 0, "received": 0,
             "refused": 0},
        ],
    }
    text = exposition(snapshot, None).decode()
    values = {(s.name, tuple(sorted(s.labels.items()))): s.value
              for family in text_string_to_metric_families(text) for s in family.samples}
    assert values["brokerd_smqp_link_up", (("domain", "alpha.test"),)] == 1
    assert values["brokerd_smqp_link_up", (("domain", "beta.test"),)] == 0
    assert values["brokerd_smqp_link_messages_total", (("domain", "alpha.test"),)] == 7
    assert values["brokerd_smqp_link_logins_total", (("domain", "alpha.test"),)] == 3
    assert values["brokerd_smqp_link_refused_total", (("domain", "alpha.test"),)] == 1
    assert values["brokerd_smqp_link_sent_total", (("domain", "alpha.test"),)] == 4
    assert values["brokerd_smqp_link_undeliverable_total", (("domain", "alpha.test"),)] == 2
