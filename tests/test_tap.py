"""brokerd.tap's Options and settings: the command-line contract of DESIGN.md, in memory."""
from __future__ import annotations

from pathlib import Path

import pytest

from brokerd.config import Settings, settings_from
from brokerd.errors import ConfigurationError
from brokerd.tap import Options, StartupError, front_end
from tests.support.secrets import write_private


def parse(*args: str) -> Settings:
    options = Options()
    options.parseOptions(list(args))
    return options.settings


def test_every_design_option_parses(tmp_path):
    secret = tmp_path / "secret"
    write_private(secret, "x\n")
    settings = parse(
        "--ssmp", "tcp:1", "--ssmp", "unix:/tmp/s", "--data-dir", str(tmp_path), "--open-login",
        "--anonymous", "--secret-file", str(secret), "--accounts", str(tmp_path / "acc"),
    )
    assert settings.listeners == {"ssmp": ["tcp:1", "unix:/tmp/s"]}
    assert settings.open_login and settings.anonymous
    assert settings.data_dir == tmp_path
    assert settings.secret() == b"x"
    assert settings.accounts_file == tmp_path / "acc"


def test_defaults():
    settings = parse()
    assert settings.listeners == {}
    assert settings.data_dir == Path("brokerd-data")
    assert not settings.open_login
    assert settings.login_timeout == 5.0
    assert settings.max_output_buffer == 1 << 20


def test_tuning_options_are_numbers():
    settings = parse("--login-timeout", "1.5", "--max-connections", "10", "--max-output-buffer", "4096")
    assert settings.login_timeout == 1.5
    assert settings.max_connections == 10
    assert settings.max_output_buffer == 4096
    with pytest.raises(StartupError, match="must be positive"):
        parse("--max-connections", "0")


def test_config_file_and_command_line(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('ssmp = "tcp:9"\nanonymous = true\nping-interval = 12\n')
    settings = parse("--config", str(config), "--ping-interval", "3")
    assert settings.listeners == {"ssmp": ["tcp:9"]}
    assert settings.anonymous
    assert settings.ping_interval == 3.0
    assert parse("--config", str(config), "--ssmp", "tcp:10").listeners == {"ssmp": ["tcp:10"]}


def test_config_file_errors(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("this is = = not toml")
    with pytest.raises(ConfigurationError, match="--config"):
        settings_from({}, str(bad))
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("colour = 'blue'\n")
    with pytest.raises(ConfigurationError, match="unknown setting 'colour'"):
        settings_from({}, str(unknown))
    lists = tmp_path / "lists.toml"
    lists.write_text("ssmp = [1, 2]\n")
    with pytest.raises(ConfigurationError, match="endpoints must be strings"):
        settings_from({}, str(lists))


def test_tls_options_go_together():
    with pytest.raises(StartupError, match="go together"):
        parse("--tls-cert", "c.pem")
    with pytest.raises(StartupError, match="--tls-ca needs"):
        parse("--tls-ca", "ca.pem")


def test_empty_secret_file_is_refused(tmp_path):
    empty = tmp_path / "empty"
    write_private(empty, "\n")
    with pytest.raises(StartupError, match="the file is empty"):
        parse("--secret-file", str(empty))


@pytest.mark.parametrize("protocol", ["ssmp", "mcchat", "smqp", "socketmq"])
def test_listener_option_of_each_protocol(protocol):
    if front_end(protocol) is None:
        with pytest.raises(StartupError, match=f"the {protocol} front end is not available yet"):
            parse(f"--{protocol}", "tcp:1")
    else:
        assert parse(f"--{protocol}", "tcp:1", f"--{protocol}", "tcp:2").listeners == {
            protocol: ["tcp:1", "tcp:2"]
        }


def test_front_ends_are_found_by_name():
    assert front_end("ssmp") is not None
    assert front_end("nosuchprotocol") is None


def test_zero_is_accepted_where_it_is_documented():
    """docs/operations.md: ``--mqtt-max-keep-alive 0`` is "any", ``--mqtt-topic-alias-maximum 0``
    is "none"; 0 stays a mistake for every other number."""
    settings = parse("--mqtt-max-keep-alive", "0", "--mqtt-topic-alias-maximum", "0")
    assert settings.mqtt_max_keep_alive == 0
    assert settings.mqtt_topic_alias_maximum == 0
    with pytest.raises(StartupError, match="mqtt-max-keep-alive: must be 0 or more"):
        parse("--mqtt-max-keep-alive", "-1")
    with pytest.raises(StartupError, match="mqtt-max-inflight: must be positive"):
        parse("--mqtt-max-inflight", "0")


@pytest.mark.parametrize("text, expected", [("true", True), ("On", True), ("1", True), ("yes", True),
                                            ("false", False), ("off", False), ("0", False), ("No", False)])
def test_boolean_words_both_ways(tmp_path, text, expected):
    config = tmp_path / "c.toml"
    config.write_text(f'mqtt-anonymous = "{text}"\nevent-log = {str(expected).lower()}\n')
    settings = parse("--config", str(config))
    assert settings.mqtt_anonymous is expected
    assert settings.event_log is expected


def test_a_boolean_that_is_no_boolean_is_an_error_naming_the_option(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('mqtt-anonymous = "flase"\n')
    with pytest.raises(StartupError, match="mqtt-anonymous: 'flase' is not a boolean"):
        parse("--config", str(config))
