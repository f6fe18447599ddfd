"""The SSMP server adapter on StringTransport: every response code, every state, the limits."""
from __future__ import annotations

import pytest

from brokerd.protocols import flow
from tests.protocols.ssmp.helpers import Harness


@pytest.fixture
def h():
    return Harness(secret=b"s3cret", anonymous=True)


# ------------------------------------------------------------------ login

def test_open_login_ignores_credential(h):
    c = h.connect()
    assert c.request("LOGIN alice open whatever") == b"200\n"
    assert not c.closed


def test_first_request_must_be_login(h):
    c = h.connect()
    assert c.request("SUBSCRIBE news") == b"400\n"
    assert c.closed


def test_unknown_verb_before_login_is_400(h):
    c = h.connect()
    assert c.request("FROB") == b"400\n"
    assert c.closed


def test_unknown_scheme_lists_supported_schemes(h):
    c = h.connect()
    assert c.request("LOGIN alice kerberos ticket") == b"401 open secret\n"
    assert c.closed


def test_open_login_needs_the_option():
    h = Harness(open_login=False, secret=b"x")
    c = h.connect()
    assert c.request("LOGIN alice open") == b"401 secret\n"
    assert c.closed


def test_no_scheme_enabled_gives_bare_401():
    h = Harness(open_login=False)
    c = h.connect()
    assert c.request("LOGIN alice open") == b"401\n"


def test_secret_login(h):
    assert h.connect().request("LOGIN alice secret s3cret") == b"200\n"
    bad = h.connect()
    assert bad.request("LOGIN alice secret nope") == b"401 open secret\n"
    assert bad.closed
    missing = h.connect()
    assert missing.request("LOGIN alice secret") == b"401 open secret\n"


def test_secret_may_be_sent_as_binary_payload(h):
    c = h.connect()
    assert c.request(b"LOGIN alice secret \x00\x05s3cret") == b"200\n"


def test_auth_failures_go_to_the_event_log(h):
    h.connect().request("LOGIN alice secret nope")
    h.connect().request("LOGIN bob kerberos x")
    assert [(f["identity"], f["scheme"], f["reason"]) for f in h.events.auth_failures] == [
        (b"alice", b"secret", "wrong secret"),
        (b"bob", b"kerberos", "unsupported scheme or missing credential"),
    ]
    assert h.events.auth_failures[0]["protocol"] == "ssmp"
    assert h.events.auth_failures[0]["source"].startswith("127.0.0.1:")


def test_cert_login_without_certificate_is_refused(h):
    c = h.connect()
    assert c.request("LOGIN alice cert") == b"401 open secret\n"
    assert c.closed


def test_second_login_is_405(h):
    c = h.login("alice")
    assert c.request("LOGIN bob open") == b"405\n"
    assert not c.closed


def test_anonymous_login_rules(h):
    anon = h.connect()
    assert anon.request("LOGIN . open") == b"200\n"
    assert anon.request("SUBSCRIBE t") == b"405\n"
    assert anon.request("UNSUBSCRIBE t") == b"405\n"
    assert anon.request("BCAST hi") == b"405\n"
    assert anon.request("MCAST t hi") == b"200\n"
    second = h.connect()
    assert second.request("LOGIN . open") == b"200\n"
    assert h.broker.session_for("ssmp", b".") is None


def test_anonymous_needs_the_option():
    h = Harness(anonymous=False)
    c = h.connect()
    assert c.request("LOGIN . open") == b"401 open\n"
    assert c.closed


def test_anonymous_cannot_receive_ucast(h):
    anon = h.connect()
    anon.request("LOGIN . open")
    alice = h.login("alice")
    assert alice.request("UCAST . hi") == b"404\n"


def test_newer_login_closes_older_connection_and_unsubscribes(h):
    watcher = h.login("watcher")
    watcher.request("SUBSCRIBE t PRESENCE")
    old = h.login("alice")
    old.request("SUBSCRIBE t")
    watcher.take()
    new = h.login("alice")
    assert old.closed
    assert watcher.take() == b"000 alice UNSUBSCRIBE t\n"
    bob = h.login("bob")
    assert bob.request("UCAST alice hi") == b"200\n"
    assert new.take() == b"000 bob UCAST alice hi\n"
    assert old.take() == b""
    old.lose()  # the old connection's late connectionLost must not detach the new one
    assert h.broker.session_for("ssmp", b"alice") is new.protocol


def test_login_timeout_closes_silently():
    h = Harness(login_timeout=3.0)
    c = h.connect()
    h.clock.advance(2.9)
    assert not c.closed
    h.clock.advance(0.2)
    assert c.closed
    assert c.take() == b""


def test_login_cancels_the_timeout():
    h = Harness(login_timeout=3.0)
    c = h.login("alice")
    h.clock.advance(10)
    assert not c.closed


def test_a_connection_that_ends_leaves_no_timer_and_leaves_the_sweep():
    h = Harness(login_timeout=3.0)
    sweep = h.clock.getDelayedCalls()
    assert len(sweep) == 1  # the factory's liveness sweep
    waiting, alice = h.connect(), h.login("alice")
    assert len(h.clock.getDelayedCalls()) == 2  # and the login timer of the one not logged in
    assert list(h.factory.live) == [alice.protocol]
    waiting.lose()
    alice.lose()
    assert h.clock.getDelayedCalls() == sweep and h.factory.live == {}
    assert h.broker.stats.connections == 0
    h.factory.stopFactory()
    assert h.clock.getDelayedCalls() == []


def test_a_connection_over_the_limit_is_closed_without_a_reply_and_without_a_timer():
    h = Harness(max_connections=1)
    admitted = h.connect()
    refused = h.connect()
    assert refused.closed and refused.take() == b""
    assert refused.transport.producer is None
    assert len(h.clock.getDelayedCalls()) == 2  # the sweep and the admitted one's login timer
    assert admitted.request("LOGIN alice open") == b"200\n"


# ------------------------------------------------------------------ ping / pong

def test_client_ping_gets_pong_from_anonymous(h):
    c = h.login("alice")
    assert c.request("PING") == b"000 . PONG\n"
    assert c.request("PONG") == b""


def test_server_pings_idle_client_and_closes_unresponsive():
    h = Harness(ping_interval=30.0, pong_timeout=30.0)
    c = h.login("alice")
    h.clock.pump([7.5] * 3)
    assert c.take() == b""
    h.clock.pump([7.5] * 2)
    assert c.take() == b"000 . PING\n"
    h.clock.pump([7.5] * 3)
    assert not c.closed
    h.clock.pump([7.5] * 2)
    assert c.closed


def test_pong_keeps_connection_alive():
    h = Harness(ping_interval=30.0, pong_timeout=30.0)
    c = h.login("alice")
    h.clock.pump([7.5] * 5)
    assert c.take() == b"000 . PING\n"
    c.send("PONG\n")
    h.clock.pump([7.5] * 8)
    assert not c.closed
    assert c.take() == b"000 . PING\n"


def test_traffic_postpones_ping():
    h = Harness(ping_interval=30.0, pong_timeout=30.0)
    c = h.login("alice")
    for _ in range(10):
        h.clock.advance(7.5)
        c.send("MCAST t hi\n")
    assert b"PING" not in c.take()


# ------------------------------------------------------------------ subscriptions and presence

def test_subscribe_twice_409_and_unsubscribe_404(h):
    c = h.login("alice")
    assert c.request("SUBSCRIBE t") == b"200\n"
    assert c.request("SUBSCRIBE t") == b"409\n"
    assert c.request("UNSUBSCRIBE t") == b"200\n"
    assert c.request("UNSUBSCRIBE t") == b"404\n"


def test_subscription_limit_413():
    h = Harness(max_subscriptions=2)
    c = h.login("alice")
    assert c.request("SUBSCRIBE a") == b"200\n"
    assert c.request("SUBSCRIBE b") == b"200\n"
    assert c.request("SUBSCRIBE c") == b"413\n"
    assert c.request("UNSUBSCRIBE a") == b"200\n"
    assert c.request("SUBSCRIBE c") == b"200\n"


def test_presence_initial_batch_then_live_changes(h):
    a = h.login("alice")
    a.request("SUBSCRIBE t PRESENCE")
    b = h.login("bob")
    b.request("SUBSCRIBE t")
    w = h.login("watcher")
    assert w.request("SUBSCRIBE t PRESENCE") == (
        b"000 alice SUBSCRIBE t PRESENCE\n000 bob SUBSCRIBE t\n200\n"
    )
    assert a.take() == b"000 bob SUBSCRIBE t\n000 watcher SUBSCRIBE t PRESENCE\n"
    b.request("UNSUBSCRIBE t")
    assert w.take() == b"000 bob UNSUBSCRIBE t\n"
    b.request("SUBSCRIBE t")
    assert w.take() == b"000 bob SUBSCRIBE t\n"
    b.lose()
    assert w.take() == b"000 bob UNSUBSCRIBE t\n"
    assert a.take() == b"000 bob UNSUBSCRIBE t\n000 bob SUBSCRIBE t\n000 bob UNSUBSCRIBE t\n"


def test_no_presence_without_flag(h):
    a = h.login("alice")
    a.request("SUBSCRIBE t")
    b = h.login("bob")
    b.request("SUBSCRIBE t")
    b.request("UNSUBSCRIBE t")
    assert a.take() == b""


# ------------------------------------------------------------------ messages

def test_ucast_delivery_and_404(h):
    a, b = h.login("alice"), h.login("bob")
    assert a.request("UCAST bob hi bob") == b"200\n"
    assert b.take() == b"000 alice UCAST bob hi bob\n"
    assert a.request("UCAST nobody hi") == b"404\n"


def test_an_event_for_the_sender_and_the_replies_of_one_read_leave_in_one_write(h):
    a = h.login("alice")
    writes = []
    write = a.transport.write
    a.transport.write = lambda data: (writes.append(data), write(data))
    a.send("UCAST alice hi me\nPING\nUCAST alice again\n")
    assert writes == [b"000 alice UCAST alice hi me\n200\n000 . PONG\n000 alice UCAST alice again\n200\n"]
    b = h.login("bob")
    assert b.request("UCAST alice from bob") == b"200\n"  # events from others still go at once
    assert writes[1:] == [b"000 bob UCAST alice from bob\n"]


def test_what_one_read_delivers_to_each_peer_is_one_write_to_it(h):
    a, b, c = h.login("alice"), h.login("bob"), h.login("carol")
    for x in (b, c):
        x.request("SUBSCRIBE t")
    writes = {x: [] for x in (b, c)}
    for x, recorded in writes.items():
        x.transport.write = lambda data, write=x.transport.write, recorded=recorded: (recorded.append(data), write(data))
    assert a.request("UCAST bob 1\nMCAST t 2\nUCAST bob 3\nUCAST carol 4\nMCAST u 5\nMCAST t 6") == b"200\n" * 6
    assert writes[b] == [b"000 alice UCAST bob 1\n000 alice MCAST t 2\n000 alice UCAST bob 3\n000 alice MCAST t 6\n"]
    assert writes[c] == [b"000 alice MCAST t 2\n000 alice UCAST carol 4\n000 alice MCAST t 6\n"]
    assert a.request("UCAST bob 7") == b"200\n"  # the next read is the next write
    assert writes[b][1:] == [b"000 alice UCAST bob 7\n"]


def test_a_read_that_starts_with_a_run_and_then_does_more_is_still_one_write_to_each_peer(h):
    """A read of one MCAST run is not held (it is one write per subscriber anyway); a read
    that goes on after its first run must hold from before that run's deliveries."""
    a, b, c = h.login("alice"), h.login("bob"), h.login("carol")
    for x in (b, c):
        x.request("SUBSCRIBE t")
    writes = {x: [] for x in (b, c)}
    for x, recorded in writes.items():
        x.transport.write = lambda data, write=x.transport.write, recorded=recorded: (recorded.append(data), write(data))
    assert a.request("MCAST t 1\nMCAST t 2\nMCAST t 3") == b"200\n" * 3
    assert writes[b] == writes[c] == [b"000 alice MCAST t 1\n000 alice MCAST t 2\n000 alice MCAST t 3\n"]
    assert a.request("MCAST t 4\nMCAST t 5\nUCAST bob 6\nMCAST u 7\nMCAST t 8") == b"200\n" * 5
    assert writes[b][1:] == [b"000 alice MCAST t 4\n000 alice MCAST t 5\n000 alice UCAST bob 6\n000 alice MCAST t 8\n"]
    assert writes[c][1:] == [b"000 alice MCAST t 4\n000 alice MCAST t 5\n000 alice MCAST t 8\n"]
    assert a.request("MCAST t 9\nMCAST u 10\nMCAST t 11") == b"200\n" * 3
    assert writes[b][2:] == writes[c][2:] == [b"000 alice MCAST t 9\n000 alice MCAST t 11\n"]


def test_what_a_read_held_for_a_connection_it_then_replaces_is_written_before_the_close(h):
    """Two reads inside one begin_read/end_read stand for one read that both delivers to a
    connection and logs its identifier in again elsewhere."""
    old = h.login("bob")
    a = h.login("alice")
    new = h.connect()
    assert flow.begin_read()
    try:
        assert a.request("UCAST bob before the new login") == b"200\n"
        assert new.request("LOGIN bob open") == b"200\n"
    finally:
        flow.end_read()
    assert old.take() == b"000 alice UCAST bob before the new login\n"
    assert old.closed


def test_consecutive_ucasts_to_one_peer_go_as_one_run_and_every_one_is_answered_in_order(h):
    """A read's UCASTs to one peer are sent as one run (a Unicast run, Router.route): one write to the
    peer, one reply per UCAST in request order, a 404 for each to nobody, and an UCAST to
    oneself still puts its event before its own 200."""
    a, b, c = h.login("alice"), h.login("bob"), h.login("carol")
    writes = {x: [] for x in (b, c)}
    for x, recorded in writes.items():
        x.transport.write = lambda data, write=x.transport.write, recorded=recorded: (recorded.append(data), write(data))
    routed = []

    class Observer:
        def message_routed(self, message, recipients, dropped):
            routed.append((message.payload,))

        def messages_routed(self, messages, recipients, dropped):
            routed.append(tuple(message.payload for message in messages))

    h.broker.observer = Observer()
    reply = a.request("UCAST bob 1\nUCAST bob 2\nUCAST nobody 3\nUCAST nobody 4\nUCAST alice 5\n"
                      "UCAST bob 6\nUCAST carol 7\nPING\nUCAST carol 8")
    assert reply == b"200\n200\n404\n404\n000 alice UCAST alice 5\n200\n200\n200\n000 . PONG\n200\n"
    assert writes[b] == [b"000 alice UCAST bob 1\n000 alice UCAST bob 2\n000 alice UCAST bob 6\n"]
    assert writes[c] == [b"000 alice UCAST carol 7\n000 alice UCAST carol 8\n"]
    assert (h.broker.stats.published, h.broker.stats.delivered) == (6, 6)
    assert routed == [(b"1", b"2"), (b"5",), (b"6",), (b"7",), (b"8",)], "each run reported as one"
    assert a.request("UCAST bob 9\nUCAST bob 10") == b"200\n200\n"  # a read that is one run
    assert writes[b][1:] == [b"000 alice UCAST bob 9\n000 alice UCAST bob 10\n"]


def test_a_ucast_run_with_a_binary_payload_is_rendered_message_by_message_in_one_write(h):
    a, b = h.login("alice"), h.login("bob")
    writes = []
    b.transport.write = lambda data, write=b.transport.write: (writes.append(data), write(data))
    binary = b"\x00\x02a\nb"
    assert a.request(b"UCAST bob text\nUCAST bob " + binary + b"\nUCAST bob more") == b"200\n" * 3
    assert writes == [b"000 alice UCAST bob text\n000 alice UCAST bob " + binary + b"\n000 alice UCAST bob more\n"]


def test_what_a_read_holds_for_a_peer_is_bounded_by_the_output_limit():
    h = Harness(max_output_buffer=1000)
    a, b = h.login("alice"), h.login("bob")
    writes = []
    write = b.transport.write
    b.transport.write = lambda data: (writes.append(data), write(data))
    a.send("".join(f"UCAST bob {i:04d}{'x' * 40}\n" for i in range(100)))
    assert b"".join(writes) == b"".join(b"000 alice UCAST bob %04d" % i + b"x" * 40 + b"\n" for i in range(100))
    assert len(writes) > 1 and max(map(len, writes)) <= 1000 + 100


def test_mcast_fanout_excludes_sender_and_needs_no_subscription(h):
    a, b, c = h.login("alice"), h.login("bob"), h.login("carol")
    for x in (a, b):
        x.request("SUBSCRIBE t")
    assert a.request("MCAST t hello") == b"200\n"
    assert a.take() == b""
    assert b.take() == b"000 alice MCAST t hello\n"
    assert c.request("MCAST t from carol") == b"200\n"
    assert a.take() == b.take() == b"000 carol MCAST t from carol\n"
    assert c.request("MCAST empty-topic x") == b"200\n"


def test_bcast_reaches_each_peer_once(h):
    a, b, c, d = (h.login(n) for n in ("alice", "bob", "carol", "dave"))
    for t in ("t1", "t2"):
        a.request(f"SUBSCRIBE {t}")
        b.request(f"SUBSCRIBE {t}")
    c.request("SUBSCRIBE t2")
    d.request("SUBSCRIBE other")
    assert a.request("BCAST all") == b"200\n"
    assert b.take() == b"000 alice BCAST all\n"
    assert c.take() == b"000 alice BCAST all\n"
    assert d.take() == b""
    assert a.take() == b""


def test_binary_payload_passes_through_untouched(h):
    a, b = h.login("alice"), h.login("bob")
    b.request("SUBSCRIBE t")
    payload = b"\x00\x04\n\x00\xff\n\x01"
    assert a.request(b"MCAST t " + payload) == b"200\n"
    assert b.take() == b"000 alice MCAST t " + payload + b"\n"


def test_pipelined_requests_keep_order_across_topics_and_kinds(h):
    a, b = h.login("alice"), h.login("bob")
    b.request("SUBSCRIBE t1")
    b.request("SUBSCRIBE t2")
    a.take()
    a.send(b"MCAST t1 1\nMCAST t1 2\nMCAST t2 3\nUCAST bob 4\nMCAST t1 5\nUCAST nobody 6\n")
    assert b.take() == (
        b"000 alice MCAST t1 1\n000 alice MCAST t1 2\n000 alice MCAST t2 3\n"
        b"000 alice UCAST bob 4\n000 alice MCAST t1 5\n"
    )
    assert a.take() == b"200\n" * 5 + b"404\n"


def test_byte_by_byte_input(h):
    a, b = h.login("alice"), h.login("bob")
    b.request("SUBSCRIBE t")
    for byte in b"MCAST t " + b"\x00\x02a\nb" + b"\nMCAST t plain\n":
        a.send(bytes([byte]))
    assert b.take() == b"000 alice MCAST t \x00\x02a\nb\n000 alice MCAST t plain\n"


def test_close_answers_200_and_closes(h):
    a = h.login("alice")
    a.take()
    a.send("CLOSE\nPING\n")
    assert a.take() == b"200\n"
    assert a.closed


def test_unknown_verb_is_501_and_connection_stays(h):
    a = h.login("alice")
    assert a.request("FROB thing payload") == b"501\n"
    assert a.request("PING") == b"000 . PONG\n"


def test_grammar_violation_answers_earlier_requests_then_400(h):
    a, b = h.login("alice"), h.login("bob")
    b.request("SUBSCRIBE t")
    a.take()
    a.send("MCAST t first\nMCAST t\nMCAST t never\n")
    assert a.take() == b"200\n400\n"
    assert a.closed
    assert b.take() == b"000 alice MCAST t first\n"


def test_a_grammar_violation_after_a_ucast_run_answers_the_run_first(h):
    a, b = h.login("alice"), h.login("bob")
    a.take()
    a.send("UCAST bob first\nUCAST bob second\nUCAST bob\nUCAST bob never\n")
    assert a.take() == b"200\n200\n400\n"
    assert a.closed
    assert b.take() == b"000 alice UCAST bob first\n000 alice UCAST bob second\n"


def test_requests_read_with_the_login_are_handled_after_it_in_order(h):
    b = h.login("bob")
    b.request("SUBSCRIBE t")
    a = h.connect()
    a.send("LOGIN alice open\nUCAST bob 1\nUCAST bob 2\nMCAST t 3\nMCAST t \x00\x00z\nUCAST nobody 5\n")
    assert a.take() == b"200\n" * 5 + b"404\n"
    assert b.take() == b"000 alice UCAST bob 1\n000 alice UCAST bob 2\n000 alice MCAST t 3\n000 alice MCAST t \x00\x00z\n"


def test_disconnect_unsubscribes_everything(h):
    a = h.login("alice")
    a.request("SUBSCRIBE t1")
    a.request("SUBSCRIBE t2")
    a.lose()
    assert h.broker.active_topics() == []
    assert h.broker.stats.connections == 0


# ------------------------------------------------------------------ limits

def test_connection_limit_refuses_extra_connections():
    h = Harness(max_connections=2)
    h.login("a"), h.login("b")
    extra = h.connect()
    assert extra.closed
    assert extra.take() == b""
    assert h.broker.stats.refused_connections == 1


def test_overlong_line_is_400(h):
    a = h.login("alice")
    assert a.request("MCAST t " + "x" * 2000) == b"400\n"
    assert a.closed


def test_slow_consumer_messages_are_dropped_and_counted(h):
    a, b = h.login("alice"), h.login("bob")
    b.request("SUBSCRIBE t")
    b.protocol.pauseProducing()  # what Twisted does when b's output buffer is over the limit
    assert b.transport.producerState == "paused"  # and b's own requests are not read meanwhile
    a.request("MCAST t lost")
    a.request("MCAST t lost too")
    assert b.take() == b""
    assert b.protocol.dropped == 2
    assert h.broker.stats.slow_consumer_drops == 2
    assert h.events.of("dropped") == []  # nothing is logged per message
    b.protocol.resumeProducing()
    a.request("MCAST t delivered")
    assert b.take() == b"000 alice MCAST t delivered\n"
    # the episode is one event, written when it ends
    assert h.events.of("dropped") == [
        {"protocol": "ssmp", "kind": "dropped", "session": "bob", "reason": "slow_consumer", "dropped": 2,
         "outcome": "dropped"}
    ]
    b.protocol.pauseProducing()
    a.request("MCAST t lost again")
    b.protocol.resumeProducing()
    assert [r["dropped"] for r in h.events.of("dropped")] == [2, 1]


def test_slow_consumer_drops_are_logged_when_the_connection_ends(h):
    a, b = h.login("alice"), h.login("bob")
    b.request("SUBSCRIBE t")
    b.protocol.pauseProducing()
    for _ in range(3):
        a.request("MCAST t lost")
    b.lose()
    assert [(r["session"], r["reason"], r["dropped"]) for r in h.events.of("dropped")] == [("bob", "slow_consumer", 3)]
    b.protocol.connectionLost(None)  # a second call logs nothing more
    assert len(h.events.of("dropped")) == 1


def test_output_buffer_limit_is_applied_to_the_transport():
    h = Harness(max_output_buffer=4096)
    a = h.login("alice")
    assert a.transport.bufferSize == 4096
    assert a.transport.producer is a.protocol


def test_a_busy_session_keeps_fewer_than_30_instance_attributes(h):
    """CPython 3.11 shares one key table between a class's instances only up to 30 attribute
    names; past that every connection carries a dictionary of its own (1.3 KB more per idle
    connection, docs/performance-history.md "Scaling shape").  State most sessions never change
    belongs on the class."""
    alice, bob = h.login("alice"), h.login("bob")
    assert bob.request("SUBSCRIBE news") == b"200\n"
    alice.send("MCAST news hi\nUCAST bob hello\nPING\n")
    assert bob.take() == b"000 alice MCAST news hi\n000 alice UCAST bob hello\n"
    for client in (alice, bob):
        attributes = vars(client.protocol)
        assert len(attributes) < 30, sorted(attributes)
