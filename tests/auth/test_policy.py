"""The UAL as the core's policy: how principals and core topics map onto it, and the file
watch that installs each good version in the Broker."""
from __future__ import annotations

from twisted.internet.task import Clock

from brokerd.auth.accounts import run_inline
from brokerd.auth.policy import AccessListFile, UALPolicy, ual_path
from brokerd.auth.ual import AccessList, parse_access_list, read_access_list
from brokerd.core.access import ALL, Perm
from brokerd.core.broker import Broker
from brokerd.core.principal import (
    ACCOUNT,
    ANONYMOUS,
    CERTIFICATE,
    GUEST,
    OPEN,
    OPENPGP,
    SECRET,
    Principal,
)

UAL = """\
/private   *          -
/private   alice      ps
/news      @accounts  s
"""


def test_core_topics_map_onto_ual_paths():
    assert ual_path(b"News/Sec") == ("news", "sec")
    assert ual_path(b"a//b/") == ("a", "b")
    assert ual_path(b"") == ()


def test_only_proven_principals_are_named_by_entries():
    policy = UALPolicy(parse_access_list(UAL))
    for realm in (ACCOUNT, CERTIFICATE):
        assert policy.permissions(Principal("Alice", realm), b"private/x") == Perm.PUBLISH | Perm.SUBSCRIBE
        assert policy.permissions(Principal("bob", realm), b"news") == Perm.SUBSCRIBE  # @accounts
    for realm in (SECRET, OPEN, ANONYMOUS, OPENPGP):
        claimed = Principal("alice", realm)  # claims alice's name, proves nothing
        assert policy.permissions(claimed, b"private/x") == Perm.NONE
        assert policy.permissions(claimed, b"news") == Perm.SUBSCRIBE  # the guest default
    assert policy.permissions(Principal("guest", GUEST), b"elsewhere") == Perm.SUBSCRIBE
    assert policy.permissions(Principal("bob", ACCOUNT), b"elsewhere") == ALL


def test_the_file_is_installed_and_reloaded_into_the_broker(tmp_path):
    ual = tmp_path / "ual"
    ual.write_text("/ alice psacr\n")
    broker, clock = Broker(), Clock()
    watched = AccessListFile(ual, read_access_list(ual), broker, clock, run_inline)
    alice = Principal("alice", ACCOUNT)
    assert broker.may_publish(alice, b"t")
    watched.startService()
    ual.write_text("/ alice s   # read-only now\n")
    clock.advance(5)
    assert not broker.may_publish(alice, b"t")
    ual.write_text("/ alice zzz\n")  # broken: the last good list stays
    clock.advance(5)
    assert not broker.may_publish(alice, b"t") and watched.current.entries
    watched.stopService()


def test_no_file_means_no_policy():
    broker = Broker()
    AccessListFile(None, AccessList(), broker, Clock(), run_inline)
    assert broker.access.policy is None
