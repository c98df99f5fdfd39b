"""Component settings: one model resolved from defaults < file < environment < flags, with sources."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app as cli_app
from cli import flags, options, settings
from faultline import config, store
from faultline.errors import ConfigError
from workers import drainer, janitor, quarantine, remediation

URI = "mongodb://admin:hunter2@db:27017"


pytestmark = pytest.mark.usefixtures("restore_logging")


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "settings.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30), ("10m", 600), ("7d", 604800), ("250ms", 0.25), ("1.5h", 5400), (45, 45), (0.3, 0.3),
     ("12", 12), (dt.timedelta(minutes=2), 120)],
)  # fmt: skip
def test_durations_accept_units_and_numbers_of_seconds(text: object, seconds: float) -> None:
    assert config.parse_seconds(text) == seconds
    cfg = config.DrainConfig(mongodb_uri=URI, poll=text)
    assert cfg.poll == dt.timedelta(seconds=seconds)


@pytest.mark.parametrize("bad", ["abc", "10 minutes", "-5s", True, "", None])
def test_bad_durations_are_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        config.parse_seconds(bad)


def test_file_then_env_then_flags(tmp_path: Path) -> None:
    file = _file(tmp_path, "lease: 10s\nthreads: 3\nhold_down: 2m\ndatabase: from-file\n")
    env = {"MONGODB_URI": URI, "FAULTLINE_HOLD_DOWN": "5m", "FAULTLINE_THREADS": "4"}
    resolved = settings.resolve(
        config.QuarantineConfig, config_file=file, flags={"threads": "5"}, environ=env
    )
    cfg = resolved.config
    assert isinstance(cfg, config.QuarantineConfig)
    assert (cfg.lease, cfg.hold_down, cfg.threads, cfg.database) == (
        dt.timedelta(seconds=10), dt.timedelta(minutes=5), 5, "from-file",
    )  # fmt: skip
    assert resolved.sources["lease"] == f"file {file}"
    assert resolved.sources["hold_down"] == "env FAULTLINE_HOLD_DOWN"
    assert resolved.sources["threads"] == "flag --threads"
    assert resolved.sources["mongodb_uri"] == "env MONGODB_URI"
    assert resolved.sources["qps"] == "default"


def test_prefixed_environment_wins_over_the_established_unprefixed_name() -> None:
    env = {"MONGODB_URI": "mongodb://old", "FAULTLINE_MONGODB_URI": URI, "NODE_NAME": "n1"}
    resolved = settings.resolve(config.AgentConfig, environ=env)
    cfg = resolved.config
    assert isinstance(cfg, config.AgentConfig)
    assert cfg.mongodb_uri.get_secret_value() == URI
    assert resolved.sources["mongodb_uri"] == "env FAULTLINE_MONGODB_URI"
    assert (cfg.node, resolved.sources["node"]) == ("n1", "env NODE_NAME")
    assert cfg.state_dir.name == "faultline-agent-n1"  # the default follows the node


def test_list_and_mapping_settings_from_each_source(tmp_path: Path) -> None:
    env = {"MONGODB_URI": URI, "NODE_NAME": "n", "FAULTLINE_PACKS": '["/p1", "/p2"]'}
    agent = settings.resolve(config.AgentConfig, environ=env).config
    assert isinstance(agent, config.AgentConfig)
    assert agent.packs == (Path("/p1"), Path("/p2"))
    file = _file(tmp_path, "job_annotations: {team: gpu}\nreboot_command: [systemctl, reboot]\n")
    given = flags.flags_given(config.JanitorConfig, {"job_annotations": '{"a": "b"}', "threads": None})
    cfg = settings.resolve(config.JanitorConfig, config_file=file, flags=given, environ={"MONGODB_URI": URI})
    assert isinstance(cfg.config, config.JanitorConfig)
    assert cfg.config.job_annotations == {"a": "b"}
    assert cfg.config.reboot_command == ("systemctl", "reboot")


def test_errors_name_the_field_and_where_the_value_came_from(tmp_path: Path) -> None:
    file = _file(tmp_path, "threads: 0\n")
    with pytest.raises(ConfigError) as err:
        settings.resolve(config.DrainConfig, config_file=file, flags={"lease": "soon"},
                         environ={"FAULTLINE_QPS": "-1"})  # fmt: skip
    text = str(err.value)
    assert "invalid drainer settings" in text
    assert f"threads: Input should be greater than or equal to 1 (got 0) [file {file}]" in text
    assert "lease: not a duration: 'soon'" in text and "[flag --lease]" in text
    assert "qps: Input should be greater than 0 (got '-1') [env FAULTLINE_QPS]" in text
    assert "mongodb_uri: Field required [not set: give --mongodb-uri or FAULTLINE_MONGODB_URI]" in text


def test_a_bad_secret_is_not_echoed() -> None:
    with pytest.raises(ConfigError) as err:
        settings.resolve(config.StatusConfig, flags={"mongodb_uri": 12345}, environ={})
    assert "12345" not in str(err.value)
    assert "[flag --mongodb-uri]" in str(err.value)


def test_unknown_keys_in_a_file_are_errors(tmp_path: Path) -> None:
    file = _file(tmp_path, "leese: 3s\n")
    with pytest.raises(ConfigError, match=r"unknown setting 'leese' for drainer"):
        settings.resolve(config.DrainConfig, config_file=file, environ={"MONGODB_URI": URI})
    with pytest.raises(ConfigError, match="not found"):
        settings.resolve(config.DrainConfig, config_file=tmp_path / "missing.yaml", environ={})


def test_checks_across_fields_are_reported() -> None:
    with pytest.raises(ConfigError, match=r"reboot_via=cloud needs a cloud provider"):
        settings.resolve(config.JanitorConfig, flags={"reboot_via": "cloud"}, environ={"MONGODB_URI": URI})


def test_models_are_frozen_and_secrets_masked_in_dumps() -> None:
    cfg = config.QuarantineConfig(mongodb_uri=URI)
    with pytest.raises(ValueError, match="frozen"):
        cfg.threads = 3  # type: ignore[misc]
    assert "hunter2" not in cfg.model_dump_json()
    assert "hunter2" not in repr(cfg)
    assert "hunter2" not in str(cfg.model_dump())


def test_every_field_is_documented_and_has_a_flag() -> None:
    for name, model in config.COMPONENTS.items():
        for field, info in model.model_fields.items():
            assert info.description, f"{name}.{field} has no description"
        flags = {p.name for p in options.parameters(model)}
        assert flags == {"config", *model.model_fields}, name


def test_worker_settings_come_from_the_model_without_copies(tmp_path: Path) -> None:
    env = {"MONGODB_URI": URI}
    q = settings.resolve(config.QuarantineConfig, flags={"lease": "7s", "resync_interval": "250ms",
                                                          "breaker_window": "1m"}, environ=env).config  # fmt: skip
    assert isinstance(q, config.QuarantineConfig)
    qs = quarantine.Settings.from_config(q)
    assert (qs.lease, qs.resync_interval, qs.breaker.window) == (
        dt.timedelta(seconds=7), dt.timedelta(milliseconds=250), dt.timedelta(minutes=1),
    )  # fmt: skip
    d = config.DrainConfig(mongodb_uri=URI, qps=5, burst=7, backoff_max="3s")
    assert drainer.Settings.from_config(d).model_dump() == {
        k: getattr(d, k) for k in config.DrainTuning.model_fields
    }
    r = remediation.Settings.from_config(config.RemediationConfig(mongodb_uri=URI, window="2d", threads=9))
    assert (r.caps.window, r.threads, r.template) == (dt.timedelta(days=2), 9, None)
    j = janitor.Settings.from_config(config.JanitorConfig(mongodb_uri=URI, job_timeout="90s"), None)
    assert j.job_timeout == dt.timedelta(seconds=90)
    builtin = (*janitor._NSENTER, "sh", "-c", janitor.RESET_SCRIPT, "gpu-reset")
    assert j.reset_command == builtin  # empty in the settings: the built-in script, in the host's mounts


def test_config_show_prints_values_and_their_sources(tmp_path: Path) -> None:
    file = _file(tmp_path, "hold_down: 2m\n")
    result = CliRunner().invoke(
        cli_app.app, ["config", "show", "quarantine", "--config", str(file), "--threads", "3"],
        env={"MONGODB_URI": URI, "FAULTLINE_LEASE": "45s"},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line.split(None, 2)[1:] for line in result.stdout.splitlines()}
    assert rows["hold_down"] == ["2m", f"file {file}"]
    assert rows["lease"] == ["45s", "env FAULTLINE_LEASE"]
    assert rows["threads"] == ["3", "flag --threads"]
    assert rows["qps"] == ["200.0", "default"]
    assert rows["mongodb_uri"] == ["**********", "env MONGODB_URI"]
    assert "hunter2" not in result.output


def test_config_show_yaml_is_a_config_file_the_component_reads(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli_app.app,
        ["config", "show", "drain", "--poll", "500ms", "--output", "yaml"],
        env={"MONGODB_URI": URI},
    )
    assert result.exit_code == 0, result.output
    assert "hunter2" not in result.stdout
    text = "\n".join(line for line in result.stdout.splitlines() if not line.startswith("mongodb_uri"))
    cfg = settings.resolve(
        config.DrainConfig, config_file=_file(tmp_path, text), environ={"MONGODB_URI": URI}
    )
    assert cfg.config == config.DrainConfig(mongodb_uri=URI, poll="500ms")


def test_a_bad_setting_stops_the_command_before_it_connects() -> None:
    result = CliRunner().invoke(cli_app.app, ["worker", "drain", "--lease", "abc"], env={"MONGODB_URI": URI})
    assert isinstance(result.exception, ConfigError)
    assert "[flag --lease]" in str(result.exception)


def test_a_model_built_directly_reads_no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only `cli.settings.resolve` reads the environment: a model built in code (tests, benchmarks) holds
    exactly the values given."""
    monkeypatch.setenv("FAULTLINE_THREADS", "99")
    monkeypatch.setenv("MONGODB_URI", "mongodb://elsewhere")
    cfg = config.DrainConfig(mongodb_uri=URI)
    assert cfg.threads == 8
    assert cfg.mongodb_uri.get_secret_value() == URI


def test_the_webhooks_host_paths_and_simulator_are_checked() -> None:
    """What the webhook mounts from the host must be absolute (the kubelet takes no other), and a simulator
    directory is not paired with another GPU backend for the init container."""
    base = {"image": "img", "namespace": "faultline"}
    sim = settings.resolve(
        config.WebhookConfig, flags={**base, "sim_dir": "/var/lib/faultline/sim"}, environ={}
    )
    assert sim.config.sim_dir == Path("/var/lib/faultline/sim")  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=r"sim_dir: a path on the host must be absolute, not 'sim' \(got"):
        settings.resolve(config.WebhookConfig, flags={**base, "sim_dir": "sim"}, environ={})
    with pytest.raises(ConfigError, match=r"journal_dirs: a path on the host must be absolute, not 'log/j"):
        settings.resolve(config.WebhookConfig, flags={**base, "journal_dirs": ["log/journal"]}, environ={})
    with pytest.raises(ConfigError, match=r"preflight_settings gpu_backend 'nvml' contradicts it"):
        settings.resolve(config.WebhookConfig, environ={},
                         flags={**base, "sim_dir": "/sim", "preflight_settings": {"gpu_backend": "nvml"}})  # fmt: skip


@pytest.mark.parametrize(
    "tls",
    [
        {},
        {"ingest_tls_cert": "/tls/crt", "ingest_tls_key": "/tls/key"},  # TLS, but anyone may connect
        {"ingest_tls_client_ca": "/tls/ca"},
    ],
)
@pytest.mark.redteam
def test_tcp_ingest_is_refused_without_mutual_tls(tls: dict[str, str]) -> None:
    env = {"MONGODB_URI": URI, "NODE_NAME": "n"}
    with pytest.raises(
        ConfigError, match=r"ingest_tcp needs ingest_tls_cert, ingest_tls_key and ingest_tls_c"
    ):
        settings.resolve(config.AgentConfig, flags={"ingest_tcp": "0.0.0.0:7443", **tls}, environ=env)
    mutual = {"ingest_tls_cert": "/tls/crt", "ingest_tls_key": "/tls/key", "ingest_tls_client_ca": "/tls/ca"}
    agent = settings.resolve(config.AgentConfig, flags={"ingest_tcp": "0.0.0.0:7443", **mutual}, environ=env)
    assert agent.config.ingest_tls_client_ca == Path("/tls/ca")  # type: ignore[attr-defined]
    assert settings.resolve(config.AgentConfig, flags={"ingest_socket": "/run/i.sock"}, environ=env).config


@pytest.mark.parametrize(
    ("uri", "says"),
    [
        ("garbage", "it must begin with mongodb:// or mongodb+srv://"),
        ("mongodb://", "Must provide at least one hostname or IP"),
        ("mongodb://faultline:s3cret@db:99999/faultline", "Port must be an integer"),
        ("mongodb://faultline:s3c@ret@db/faultline", "must be escaped"),
    ],
)
def test_a_bad_store_uri_is_a_config_error_naming_the_setting(uri: str, says: str) -> None:
    with pytest.raises(ConfigError, match=r"^mongodb_uri \(MONGODB_URI\): not a ") as caught:
        store.connect(uri)
    assert says in str(caught.value)
    assert "s3c" not in str(caught.value)  # the URI may hold a password: never quoted


@pytest.mark.redteam
def test_a_bad_store_uri_is_one_line_from_the_cli() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "faultline", "status"], capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "MONGODB_URI": "mongodb://faultline:s3cret@db:99999"},
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: mongodb_uri (MONGODB_URI): not a usable MongoDB URI: Port must be an integer between 0 and 65535"
    ]
