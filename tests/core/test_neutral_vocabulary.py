"""The core speaks no front end's vocabulary: its durable delivery names delivery modes, dead
letters and the server id in neutral words, and each protocol's own words (SMQP's Trash and
SUID, its name) live in that protocol's adapter (brokerd/protocols/)."""
from __future__ import annotations

import re
from pathlib import Path

import brokerd.core

CORE = Path(brokerd.core.__file__).parent
PROTOCOL_WORDS = re.compile(r"smqp|suid|\bTrash\b", re.IGNORECASE)


def protocol_words(text: str) -> list[str]:
    """The protocol's words in ``text`` (case-insensitive; ``trash`` in lower case is the
    store's API and the event log's ``trashed``, so only the capitalised box name counts)."""
    return [match.group(0) for match in PROTOCOL_WORDS.finditer(text)
            if match.group(0).lower() != "trash" or match.group(0) == "Trash"]


def test_the_check_finds_each_word():
    assert protocol_words('settings.smqp_domain, the SUID, a topic\'s Trash, "Suid"') == [
        "smqp", "SUID", "Trash", "Suid"]
    assert protocol_words("store.empty_trash(); settled.trashed") == []


def test_no_module_of_the_core_names_a_protocol_s_own_words():
    found = {path.name: words for path in sorted(CORE.rglob("*.py"))
             if (words := protocol_words(path.read_text(encoding="utf-8")))}
    assert found == {}
