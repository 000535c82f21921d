from __future__ import annotations

from pathlib import Path

import pytest

from runstore.errors import ConfigError, InvalidURLError
from runstore.plugins.postgres.settings import PostgresSettings
from runstore.plugins.redis.settings import RedisSettings
from runstore.plugins.sqlite.settings import SqliteSettings
from runstore.settings import DEFAULT_DATABASE_URL, MAX_INT_SETTING, Settings


def test_defaults_are_the_embedded_default() -> None:
    s = Settings.load(env={})
    assert s.checkpointer == s.events == DEFAULT_DATABASE_URL
    assert s.streams == "memory://"
    assert s.checkpoint_channel_mode == "full"
    assert s.checkpoint_delta.snapshot_frequency == 10
    assert s.stream_bridge.queue_maxsize == 256


def test_precedence_file_env_mapping_keywords(tmp_path: Path) -> None:
    cfg = tmp_path / "runstore.yaml"
    cfg.write_text("events: jsonl:///from-file\nstream_bridge:\n  queue_maxsize: 5\n  heartbeat_interval_seconds: 2\n")
    env = {"RUNSTORE_EVENTS_URL": "memory://", "RUNSTORE_STREAM_BRIDGE__QUEUE_MAXSIZE": "7"}
    s = Settings.load(cfg, env=env)
    assert s.events == "memory://"
    assert s.stream_bridge.queue_maxsize == 7
    assert s.stream_bridge.heartbeat_interval_seconds == 2.0
    s = Settings.load({"stream_bridge": {"queue_maxsize": 4}}, env=env)
    assert s.stream_bridge.queue_maxsize == 4
    s = Settings.load({"events": "sqlite:///a.db"}, env=env, events="jsonl:///kw")
    assert s.events == "jsonl:///kw"


def test_config_file_from_env(tmp_path: Path) -> None:
    cfg = tmp_path / "custom.yaml"
    cfg.write_text("checkpoint_channel_mode: delta\n")
    assert Settings.load(env={"RUNSTORE_CONFIG": str(cfg)}).checkpoint_channel_mode == "delta"


def test_yaml_on_off_reaches_an_on_off_setting(tmp_path: Path) -> None:
    # PyYAML reads a bare `off` as False; an on/off setting must still accept it.
    cfg = tmp_path / "runstore.yaml"
    cfg.write_text("postgres:\n  saver_synchronous_commit: off\n")
    assert Settings.load(cfg, env={}).section(PostgresSettings).saver_synchronous_commit == "off"
    on = Settings.load({"postgres": {"saver_synchronous_commit": True}}, env={})
    assert on.section(PostgresSettings).saver_synchronous_commit == "on"
    with pytest.raises(ConfigError, match="must be one of normal, full; got False"):
        Settings.load({"sqlite": {"synchronous": False}}, env={})


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"stream_brige": {}}, r"unknown config key 'stream_brige'.*accepted: .*stream_bridge"),
        ({"stream_bridge": {"queue_max": 1}}, r"'stream_bridge.queue_max'.*accepted: .*queue_maxsize"),
        ({"stream_bridge": {"queue_maxsize": 0}}, r"'stream_bridge.queue_maxsize' must be >= 1"),
        ({"stream_bridge": {"queue_maxsize": "lots"}}, r"must be an integer"),
        ({"stream_bridge": {"queue_maxsize": True}}, r"must be an integer"),
        ({"checkpoint_channel_mode": "partial"}, r"must be one of full, delta"),
        ({"checkpoint_delta": {"snapshot_frequency": 0}}, r"snapshot_frequency' must be >= 1"),
        ({"stream_bridge": 3}, r"is a section"),
        ({"sqlite": {"synchronous": "off"}}, r"must be one of normal, full"),
    ],
)
def test_bad_config_names_key_and_accepted(config: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Settings.load(config, env={})


def test_bad_env_value_is_config_error() -> None:
    with pytest.raises(ConfigError, match="queue_maxsize"):
        Settings.load(env={"RUNSTORE_STREAM_BRIDGE__QUEUE_MAXSIZE": "x"})
    with pytest.raises(ConfigError, match="unknown config key 'stream_bridge.nope'"):
        Settings.load(env={"RUNSTORE_STREAM_BRIDGE__NOPE": "1"})


def test_bad_yaml_is_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("events: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        Settings.load(bad, env={})
    with pytest.raises(ConfigError, match="cannot read"):
        Settings.load(tmp_path / "missing.yaml", env={})


def test_bad_url_in_config_hides_password() -> None:
    with pytest.raises(InvalidURLError) as info:
        Settings.load({"events": "postgresql://u:hunter2@h:notaport/db"}, env={})
    assert "hunter2" not in str(info.value)


def test_public_dict_masks_passwords() -> None:
    s = Settings.load({"events": "postgresql://u:hunter2@h/db"}, env={})
    assert "hunter2" not in repr(s.public_dict())
    assert s.url("events").password == "hunter2"


def test_merged_validates() -> None:
    s = Settings()
    assert s.merged({"run_events": {"max_trace_content": 10}}).run_events.max_trace_content == 10
    with pytest.raises(ConfigError):
        s.merged({"run_events": {"max_trace_content": -1}})


def test_plugin_sections_read_from_yaml_env_and_mappings(tmp_path: Path) -> None:
    cfg = tmp_path / "runstore.yaml"
    cfg.write_text("sqlite:\n  busy_timeout_ms: 100\n  synchronous: full\nredis:\n  max_connections: 9\n")
    s = Settings.load(cfg, env={"RUNSTORE_SQLITE__BUSY_TIMEOUT_MS": "250"})
    assert s.section(SqliteSettings) == SqliteSettings(synchronous="full", busy_timeout_ms=250)
    assert s.section(RedisSettings).max_connections == 9
    assert s.section(PostgresSettings) == PostgresSettings(), "an unset section has its defaults"
    merged = s.merged({"postgres": {"pool_max_size": 3}})
    assert merged.section(PostgresSettings).pool_max_size == 3
    assert merged.section(SqliteSettings).busy_timeout_ms == 250, "merging keeps the other sections"
    public = merged.public_dict()
    assert public["sqlite"] == {"synchronous": "full", "busy_timeout_ms": 250}
    assert public["postgres"]["pool_max_size"] == 3 and public["redis"]["max_connections"] == 9
    assert Settings.load(env={}).public_dict()["sqlite"]["busy_timeout_ms"] == 5000
    assert hash(s) == hash(Settings.load(cfg, env={"RUNSTORE_SQLITE__BUSY_TIMEOUT_MS": "250"}))


@pytest.mark.parametrize(
    ("config", "env", "match"),
    [
        ({"sqlite": {"busy_timeout": 1}}, {}, r"unknown config key 'sqlite.busy_timeout' in section 'sqlite'; accepted: busy_timeout_ms, synchronous"),
        ({}, {"RUNSTORE_SQLITE__BUSY_TIMEOUT": "1"}, r"unknown config key 'sqlite.busy_timeout'"),
        ({}, {"RUNSTORE_REDIS__MAX_CONNECTION": "1"}, r"unknown config key 'redis.max_connection'.*accepted: .*max_connections"),
        ({"postgres": {"pool_min_size": 1}}, {}, r"unknown config key 'postgres.pool_min_size'"),
        ({"sqlit": {}}, {}, r"unknown config key 'sqlit' in the top level; accepted: .*redis, retention, run_events, runs, sqlite"),
        ({"sqlite": 5}, {}, r"config key 'sqlite' is a section"),
        ({}, {"RUNSTORE_SQLITE__BUSY_TIMEOUT_MS": "-1"}, r"'sqlite.busy_timeout_ms' must be >= 0; got '-1'"),
        ({"redis": {"max_connections": 0}}, {}, r"'redis.max_connections' must be >= 1"),
        ({"sqlite": {"synchronous": "off"}}, {}, r"'sqlite.synchronous' must be one of normal, full"),
    ],
)
def test_plugin_sections_follow_the_builtin_rules(config: dict, env: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Settings.load(config, env=env)


def test_unknown_runstore_variables_are_still_ignored() -> None:
    assert Settings.load(env={"RUNSTORE_NOSUCH__KEY": "1", "RUNSTORE_TOKEN": "x"}) == Settings.load(env={})


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", "1.0e+26", "1e26", "inf", "nan"])
@pytest.mark.parametrize(
    ("section", "key", "accepted"),
    [
        ("stream_bridge", "queue_maxsize", f"an integer from 1 to {MAX_INT_SETTING}"),
        ("stream_bridge", "heartbeat_interval_seconds", "a number from 0.001 to 1000000000"),
        ("sqlite", "busy_timeout_ms", f"an integer from 0 to {MAX_INT_SETTING}"),
        ("postgres", "pool_recycle_seconds", "a number from 0 to 1000000000"),
    ],
)
def test_non_finite_and_huge_numbers_name_the_key_and_range(
    tmp_path: Path, section: str, key: str, accepted: str, value: str
) -> None:
    """YAML's .nan/.inf and 1e26 (a float from YAML, a str from the environment) are refused."""
    cfg = tmp_path / "runstore.yaml"
    cfg.write_text(f"{section}:\n  {key}: {value}\n")
    expected = rf"config key '{section}.{key}' must be ({accepted}|>= .*); got"
    with pytest.raises(ConfigError, match=expected):
        Settings.load(cfg, env={})
    with pytest.raises(ConfigError, match=expected):
        Settings.load(env={f"RUNSTORE_{section.upper()}__{key.upper()}": value.lstrip(".")})


def test_numbers_at_the_edges_of_their_range_are_accepted() -> None:
    edge = Settings.load(
        {"stream_bridge": {"queue_maxsize": MAX_INT_SETTING, "heartbeat_interval_seconds": 1e9},
         "sqlite": {"busy_timeout_ms": 0}},
        env={},
    )
    assert edge.stream_bridge.queue_maxsize == MAX_INT_SETTING
    assert edge.stream_bridge.heartbeat_interval_seconds == 1e9
    assert edge.section(SqliteSettings).busy_timeout_ms == 0
    with pytest.raises(ConfigError, match=rf"must be an integer from 1 to {MAX_INT_SETTING}; got {MAX_INT_SETTING + 1}"):
        Settings.load({"stream_bridge": {"queue_maxsize": MAX_INT_SETTING + 1}}, env={})


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"\xff\xfe\x00\x01binary", r"is not UTF-8 text \(byte 0xff at offset 0\)"),
        (b"events: memory://\n\x80\x81", r"is not UTF-8 text \(byte 0x80 at offset 18\)"),
        (b"events: \x00\n", r"is not valid YAML"),
        (b"- a list\n", r"must hold a mapping at the top level"),
    ],
)
def test_a_config_file_that_is_not_yaml_text_is_a_config_error(
    tmp_path: Path, content: bytes, match: str
) -> None:
    cfg = tmp_path / "runstore.yaml"
    cfg.write_bytes(content)
    with pytest.raises(ConfigError, match=match) as info:
        Settings.load(cfg, env={})
    assert str(cfg) in str(info.value)


@pytest.mark.parametrize(
    ("url", "accepted"),
    [
        ("postgresql://h/db?command_timeout=0", "a number from 0.001 to 1000000000"),
        ("postgresql://h/db?connect_timeout=nan", "a number from 0.001 to 1000000000"),
        ("redis://h/0?socket_timeout=0.0005", "a number from 0.001 to 1000000000"),
        ("redis://h/0?operation_timeout=1e10", "a number from 0.001 to 1000000000"),
        ("redis://h/0?health_check_interval=-1", "a number from 0 to 1000000000"),
    ],
)
def test_url_durations_are_checked_like_their_settings(url: str, accepted: str) -> None:
    from runstore.plugins.postgres.settings import PostgresTimeouts
    from runstore.plugins.redis.client import RedisTimeouts
    from runstore.urls import BackendURL

    parsed = BackendURL.parse(url)
    resolve = (
        (lambda: PostgresTimeouts.resolve(parsed, PostgresSettings()))
        if parsed.scheme == "postgresql"
        else (lambda: RedisTimeouts.resolve(parsed, RedisSettings()))
    )
    option = url.partition("?")[2].partition("=")[0]
    with pytest.raises(InvalidURLError, match=rf"URL option {option}=.*must be {accepted} \(seconds\)"):
        resolve()


def test_url_durations_override_their_settings() -> None:
    from runstore.plugins.postgres.settings import PostgresTimeouts
    from runstore.plugins.redis.client import RedisTimeouts
    from runstore.urls import BackendURL

    pg = PostgresTimeouts.resolve(BackendURL.parse("postgresql://h/db?command_timeout=5"), PostgresSettings())
    assert (pg.connect, pg.command, pg.operation) == (10.0, 5.0, 90.0)
    redis = RedisTimeouts.resolve(BackendURL.parse("redis://h/0?health_check_interval=0"), RedisSettings())
    assert redis.health_check_interval == 0.0 and redis.socket_timeout == 10.0
