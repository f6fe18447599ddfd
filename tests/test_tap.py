"""brokerd.tap's Options and settings: the command-line contract of DESIGN.md, in memory."""
from __future__ import annotations

from pathlib import Path

import pytest

from brokerd.config import PROTOCOLS, Settings, setting_fields, settings_from, value_problems
from brokerd.errors import ConfigurationError
from brokerd.settingspec import kind, option_of
from brokerd.tap import Options, StartupError, front_end_named, makeService
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


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_listener_option_of_each_protocol(protocol):
    assert parse(f"--{protocol}", "tcp:1", f"--{protocol}", "tcp:2").listeners == {
        protocol: ["tcp:1", "tcp:2"]
    }


def test_each_listener_option_has_its_front_end():
    assert [front_end_named(protocol).name for protocol in PROTOCOLS] == list(PROTOCOLS)
    with pytest.raises(ConfigurationError, match="the nosuchprotocol front end is not available yet"):
        front_end_named("nosuchprotocol")


def test_zero_is_accepted_where_it_is_documented():
    """docs/operations.md: ``--mqtt-max-keep-alive 0`` is "any", ``--mqtt-topic-alias-maximum 0``
    is "none"; 0 stays a mistake for every other number."""
    settings = parse("--mqtt-max-keep-alive", "0", "--mqtt-topic-alias-maximum", "0")
    assert settings.mqtt_max_keep_alive == 0
    assert settings.mqtt_topic_alias_maximum == 0
    with pytest.raises(StartupError, match="mqtt-max-keep-alive: must be 0 or more"):
        parse("--mqtt-max-keep-alive", "-1")
    with pytest.raises(StartupError, match="mqtt-max-keep-alive: at most 65535"):
        parse("--mqtt-max-keep-alive", "65536")
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


NUMBERS = sorted(name for name, spec in setting_fields().items() if kind(spec) == "number")


@pytest.mark.parametrize("name", NUMBERS)
def test_every_number_takes_its_documented_range_and_nothing_beyond(name):
    """Each number's range comes from its definition in Settings (what docs/operations.md
    shows): the lowest and the highest documented values are taken, a value beyond either end,
    a fraction of a whole number, NaN, infinity or a boolean is one line naming the option."""
    spec = setting_fields()[name]
    option = option_of(spec)
    whole = spec.type == "int"
    lowest = 0 if option.zero else (1 if whole else 0.5)
    assert getattr(settings_from({name: str(lowest)}), spec.name) == lowest
    refused = ["-1", True, "lots"] + (["2.5"] if whole else ["nan", "inf"])
    if not option.zero:
        refused.append("0")
    if option.maximum is not None:
        assert getattr(settings_from({name: str(option.maximum)}), spec.name) == option.maximum
        refused.append(str(option.maximum + 1))
    for value in refused:
        with pytest.raises(ConfigurationError, match=f"^{name}: "):
            settings_from({name: value})


def test_the_documented_zero_of_anonymous_sessions_is_taken():
    """``--mqtt-anonymous-sessions 0`` (none), the documented default, given explicitly."""
    assert parse("--mqtt-anonymous-sessions", "0").mqtt_anonymous_sessions == 0
    assert parse("--mqtt-anonymous-sessions", "3").mqtt_anonymous_sessions == 3


def test_a_number_beyond_its_range_is_refused_from_the_command_line_and_the_file(tmp_path):
    assert parse("--smqp-max-notify-window", "1024").smqp_max_notify_window == 1024
    with pytest.raises(StartupError, match="^brokerd: smqp-max-notify-window: at most 1024, not '1025'$"):
        parse("--smqp-max-notify-window", "1025")
    config = tmp_path / "c.toml"
    config.write_text("mqtt-max-inflight = 65536\n")
    with pytest.raises(StartupError, match="^brokerd: mqtt-max-inflight: at most 65535, not 65536$"):
        parse("--config", str(config))


@pytest.mark.parametrize("line, error", [
    ("secret-file = 5", "secret-file: 5 is not a file name"),
    ("node-name = 5", "node-name: 5 is not a string"),
    ("smqp-connectto-allow = [1, 2]", r"smqp-connectto-allow: \[1, 2\] is not a string or a list of strings"),
    ("ssmp = 5", "ssmp: endpoints must be strings"),
    ("max-connections = 2.5", "max-connections: 2.5 is not a whole number"),
    ("max-connections = true", "max-connections: True is not a number"),
    ("max-connections = 'lots'", "max-connections: 'lots' is not a number"),
    ("login-timeout = nan", "login-timeout: nan is not a number"),
])
def test_a_value_of_the_wrong_type_in_the_file_is_one_line_naming_the_key(tmp_path, line, error):
    config = tmp_path / "c.toml"
    config.write_text(line + "\n")
    with pytest.raises(StartupError, match=f"^brokerd: {error}$"):
        parse("--config", str(config))
    config.write_text("max-connections = 7\n")  # the same file with a good value is taken
    assert parse("--config", str(config)).max_connections == 7


def test_an_embedders_settings_are_held_to_the_same_ranges(tmp_path):
    """makeService with Settings built in code refuses what the options would refuse."""
    assert value_problems(Settings(smqp_max_notify_window=1024)) == []
    settings = Settings(data_dir=tmp_path, listeners={"ssmp": ["tcp:0:interface=127.0.0.1"]},
                        smqp_max_notify_window=2000)
    with pytest.raises(StartupError, match="^brokerd: smqp-max-notify-window: at most 1024, not 2000$"):
        makeService(settings)
