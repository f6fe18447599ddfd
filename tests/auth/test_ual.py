"""User Access Lists: the file format, inheritance up to the root, principal precedence,
the defaults, and the built-in login-topic rules."""
from __future__ import annotations

import pytest

from brokerd.auth.ual import (
    ALL,
    AccessList,
    Perm,
    format_permissions,
    parse_access_list,
    parse_permissions,
    read_access_list,
)
from brokerd.errors import ConfigurationError

P, S, A, C, R = Perm.PUBLISH, Perm.SUBSCRIBE, Perm.ADMINISTER, Perm.CREATE, Perm.REPLY

EXAMPLE = """
# topic     who         permissions
/           @accounts   s
/           Editor      PSACR        # letters in any case
/news       *           s
/news/desk  editor      -
/news/desk  @accounts   ps
/private    *           -
"""


def path(text: str) -> tuple[str, ...]:
    return tuple(text.strip("/").split("/")) if text != "/" else ()


def test_permission_letters():
    assert parse_permissions("sp") == P | S
    assert parse_permissions("-") == Perm.NONE
    assert format_permissions(ALL) == "psacr" and format_permissions(Perm.NONE) == "-"
    for bad in ("x", "", "p-"):
        with pytest.raises(ValueError):
            parse_permissions(bad)


def test_inheritance_and_precedence():
    ual = parse_access_list(EXAMPLE)
    assert ual.permissions("editor", path("/anything/deep")) == ALL
    assert ual.permissions("bob", path("/anything")) == S
    # /news names '*' only: every login inherits nothing from '/' there
    assert ual.permissions("editor", path("/news")) == S
    assert ual.permissions("editor", path("/news/desk/today")) == Perm.NONE  # own name wins
    assert ual.permissions("bob", path("/news/desk/today")) == P | S  # @accounts beats *
    assert ual.permissions("guest", path("/news/desk")) == S  # guest is not in @accounts
    assert ual.permissions("guest", path("/")) == Perm.SUBSCRIBE  # no entry: the default
    assert not ual.visible("bob", path("/private/x"))
    assert ual.allows("bob", path("/news/desk"), P) and not ual.allows("bob", path("/news"), P)


def test_defaults_without_a_file():
    ual = AccessList()
    assert ual.permissions("alice", path("/x")) == ALL
    assert ual.permissions("guest", path("/x")) == S
    assert AccessList(guest_default=P | S).permissions("guest", path("/x")) == P | S


def test_login_topics_are_built_in():
    ual = AccessList()
    assert ual.permissions("alice", path("/accounts")) == Perm.NONE
    assert ual.permissions("alice", path("/accounts/alice/orange")) == P | S | A | R
    assert ual.permissions("bob", path("/accounts/alice/orange")) == Perm.NONE
    opened = parse_access_list("/accounts/alice bob p\n/accounts alice s\n")
    assert opened.permissions("bob", path("/accounts/alice/orange")) == P
    assert opened.permissions("alice", path("/accounts")) == S
    assert opened.permissions("alice", path("/accounts/alice")) == P | S | A | R


@pytest.mark.parametrize("text, line", [
    ("/ alice\n", 1),
    ("\n/news bob s\nnews bob s\n", 3),
    ("/a/9 bob s\n", 1),
    ("/ b-o-b s\n", 1),
    ("/ bob s\n/ BOB p\n", 2),
    ("/ bob q\n", 1),
    ("/~ bob s\n", 1),
    ("/~~sys bob s\n", 1),
    ("/a~b bob s\n", 1),
])
def test_bad_files_name_the_line(text: str, line: int):
    with pytest.raises(ConfigurationError, match=f"line {line}"):
        parse_access_list(text)


def test_the_other_protocols_tilde_trees_can_be_named():
    ual = parse_access_list("/~sys * -\n/~SYS/brokerd ops s\n")
    assert ual.permissions(None, path("/~sys/brokerd/topics")) == Perm.NONE
    assert ual.permissions("ops", path("/~sys/brokerd/topics")) == S


def test_read_from_a_file(tmp_path):
    file = tmp_path / "ual"
    file.write_text("/ bob s\n")
    assert read_access_list(file).permissions("bob", ()) == S
    with pytest.raises(ConfigurationError, match="cannot read"):
        read_access_list(tmp_path / "missing")
