"""The SMQP delivery settings (--durable-retry-timeout, --durable-max-attempts,
--durable-dead-letter-retention) go from the command line and the TOML file through Settings into
the factory the SMQP plugin builds, and Settings' defaults are the durable service's."""
from __future__ import annotations

from pathlib import Path

import pytest
from twisted.internet.task import Clock

from brokerd.config import Settings
from brokerd.protocols.smqp.plugin import front_end as smqp
from brokerd.store.memory import MemoryStore
from brokerd.tap import Options, StartupError
from tests.support.services import services_for


class ReactorClock(Clock):
    """What the SMQP plugin needs of a reactor: the clock and a thread pool it never uses
    here (the accounts file is read in the test's thread)."""

    def getThreadPool(self):  # noqa: N802 - the reactor's name
        raise AssertionError("no thread work expected")


def factory_for(settings: Settings):
    factory = smqp.build(services_for(settings, ReactorClock(), store=MemoryStore()))
    assert factory.started.called and factory.start_error is None
    return factory


def parsed(tmp_path: Path, *args: str) -> Settings:
    options = Options()
    options.parseOptions(["--data-dir", str(tmp_path), *args])
    return options.settings


def test_the_options_reach_the_factory(tmp_path):
    settings = parsed(tmp_path, "--durable-retry-timeout", "2.5", "--durable-max-attempts", "3",
                      "--durable-dead-letter-retention", "600")
    assert (settings.durable_retry_timeout, settings.durable_max_attempts, settings.durable_dead_letter_retention) == (2.5, 3, 600.0)
    service = factory_for(settings).durable
    assert (service.retry_timeout, service.max_attempts, service.dead_letter_retention) == (2.5, 3, 600.0)


def test_the_defaults_are_those_of_settings(tmp_path):
    service = factory_for(parsed(tmp_path)).durable
    assert (service.retry_timeout, service.max_attempts, service.dead_letter_retention) == (30.0, 5, 3600.0)


def test_the_config_file_sets_them_and_the_command_line_wins(tmp_path):
    config = tmp_path / "brokerd.toml"
    config.write_text('durable-retry-timeout = 4\ndurable-max-attempts = 7\ndurable-dead-letter-retention = 90.5\n')
    settings = parsed(tmp_path, "--config", str(config), "--durable-max-attempts", "2")
    service = factory_for(settings).durable
    assert (service.retry_timeout, service.max_attempts, service.dead_letter_retention) == (4.0, 2, 90.5)


@pytest.mark.parametrize("args", [
    ["--durable-retry-timeout", "0"],
    ["--durable-max-attempts", "-1"],
    ["--durable-max-attempts", "many"],
    ["--durable-dead-letter-retention", "soon"],
])
def test_bad_values_are_usage_errors(tmp_path, args):
    with pytest.raises(StartupError):
        parsed(tmp_path, *args)
