"""pytest fixtures shared across test packages; import the ones a module uses by name:

    from tests.support.fixtures import pki  # noqa: F401
"""
from __future__ import annotations

import pytest

from tests.support.certs import TestPKI, make_pki


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPKI:
    """One test PKI per test session: key generation is the slow part, the files are
    read-only for tests."""
    return make_pki(tmp_path_factory.mktemp("pki"))
