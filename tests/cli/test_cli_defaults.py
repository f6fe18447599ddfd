"""What a first day meets without options: each client's default port is the one a broker
started without listener options listens on (SMQP included), and every hint to install the
``cluster`` extra says it as README.md installs brokerd."""
from __future__ import annotations

import re
import sys

import pytest

from brokerd.cli import mcchat, mqtt, smqp, ssmp
from brokerd.config import DEFAULT_PORTS
from brokerd.errors import INSTALL_CLUSTER, ConfigurationError
from brokerd.store import choice
from tests.support.broker import REPO


@pytest.mark.parametrize("protocol, client", [("ssmp", ssmp), ("mcchat", mcchat), ("smqp", smqp), ("mqtt", mqtt)])
def test_each_client_reaches_a_broker_started_without_options(protocol: str, client: object) -> None:
    assert client.DEFAULT_PORT == DEFAULT_PORTS[protocol]  # type: ignore[attr-defined]
    assert DEFAULT_PORTS[protocol] > 1024  # no root needed


def test_the_cluster_extra_is_installed_as_readme_installs_brokerd(monkeypatch: pytest.MonkeyPatch) -> None:
    readme = (REPO / "README.md").read_text()
    assert "pip install '.[cluster]'" in readme and "pip install '.[cluster]'" in INSTALL_CLUSTER
    monkeypatch.setitem(sys.modules, "psycopg", None)  # not installed
    monkeypatch.setattr(choice.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigurationError, match=re.escape(INSTALL_CLUSTER)):
        choice.check_store_url("postgresql://brokerd@127.0.0.1:5432/brokerd", None)
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        assert "brokerd[cluster]" not in page.read_text(), page.name  # one way, README's
    recipe = (REPO / "docs" / "cluster.md").read_text().partition("## Three nodes and Redis on one machine")[2]
    assert "pip install '.[cluster]'" in recipe.partition("```sh")[0]  # said before the recipe's commands
