from __future__ import annotations

from pathlib import Path

import pytest

from runstore.errors import ConfigError, InvalidURLError
from runstore.settings import DEFAULT_DATABASE_URL, Settings


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
    assert Settings.load(cfg, env={}).postgres.saver_synchronous_commit == "off"
    on = Settings.load({"postgres": {"saver_synchronous_commit": True}}, env={})
    assert on.postgres.saver_synchronous_commit == "on"
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
