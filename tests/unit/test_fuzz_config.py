"""Fuzzing what operators write besides packs: the components' settings files and environment
(`cli.settings`, the models in `faultline.config`: drain modes, repair caps, durations, ...), quarantine
rules (`workers.rules`) and an external remediator's CR template (`workers.templates`).

Whatever the text, each ends in a usable value or in a ConfigError that names the file and what in it
is wrong (the setting, the rule); nothing else escapes. What is accepted behaves: a setting read from a
file says so, rules give valid taints and labels for any fault, a template renders for any repair."""

from __future__ import annotations

import copy
import datetime as dt
import math
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from cli import settings
from faultline import config
from faultline.errors import ConfigError
from faultline.models import Action, Component
from tests.unit.fuzzing import NASTY, any_text, fuzz, near, paths
from workers import rules, templates

URI = "mongodb://db:27017"
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def dump(value: object) -> str:
    return yaml.dump(value, Dumper=_DUMPER, allow_unicode=True, sort_keys=False, width=1 << 16)


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as name:
        yield Path(name)


def written(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    return path


leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.sampled_from(NASTY), any_text,
    st.sampled_from(("10s", "5m", "1e400", ".inf", "-1s", "0", "Immediate", "AllowCompletion", "NoSchedule",
                     "{code}", "${node}", "${gpus}", "${nope}", "faultline.io/x", "a" * 64, "x" * 300)),
    st.dates(),
)  # fmt: skip
yaml_values = st.recursive(
    leaf,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10) | st.integers(), inner, max_size=4)
    ),
    max_leaves=10,
)
DEEP = "".join(
    " " * i + "- \n" for i in range(1500)
)  # nested deeper than the pure-Python YAML loader recurses


# -- component settings -------------------------------------------------------------------------------

COMPONENTS = tuple(config.COMPONENTS.items())


@st.composite
def settings_file(draw: st.DrawFn) -> tuple[str, dict[Any, Any]]:
    """A component and the mapping its file holds: its own settings with values of any shape (and the
    values' right shape from another component), some unknown or non-string keys."""
    name, model = draw(st.sampled_from(COMPONENTS))
    fields = list(model.model_fields)
    content: dict[Any, Any] = {"mongodb_uri": URI, "node": "gpu-1"} if draw(st.booleans()) else {}
    for _ in range(draw(st.integers(0, 5))):
        key = draw(st.sampled_from(fields) | st.sampled_from(("colour", "FAULTLINE_LEASE", 1, "", "lease ")))
        content[key] = draw(
            leaf | st.sampled_from(("30s", 3, True, "Immediate", [], {})) | st.lists(leaf, max_size=3)
        )
    return name, {k: v for k, v in content.items() if k in fields or draw(st.booleans())}


def resolved_or_error(model: type[config.Component], **kwargs: Any) -> settings.Resolved | ConfigError:
    try:
        return settings.resolve(model, **kwargs)
    except ConfigError as exc:
        return exc


# Found by this fuzzing: a duration no timedelta holds (.inf, 1e20 s) raised OverflowError out of the
# settings model (pydantic passes on what is not a ValueError), and a non-string key (`1: 2`) became
# "'int' object has no attribute 'lower'".
@fuzz(700)
@given(settings_file())
@example(("drain", {"mongodb_uri": URI, "delete_after": math.inf}))
@example(("quarantine", {"mongodb_uri": URI, "hold_down": 1e20}))
@example(("agent", {"mongodb_uri": URI, "node": "n", "nic_interval": 1e300}))
@example(("drain", {"mongodb_uri": URI, "poll": "9" * 400}))
@example(("drain", {"mongodb_uri": URI, 1: 2}))
def test_settings_files_resolve_or_name_the_setting(
    workdir: Path, component: tuple[str, dict[Any, Any]]
) -> None:
    name, content = component
    model = config.COMPONENTS[name]
    path = written(workdir, "settings.yaml", dump(content))
    result = resolved_or_error(model, config_file=path, environ={})
    if isinstance(result, ConfigError):
        message = str(result)
        if message.startswith(f"config file {path}: "):
            assert "\n" not in message, message
            return
        head, *lines = message.splitlines()
        assert head == f"invalid {settings._component(model)} settings:", message
        for line in lines:  # one line per bad setting: its name, what is wrong, where the value came from
            assert line.startswith("  "), message
        return
    for key in content:
        assert result.sources[key] == f"file {path}", key
    for field, value in result.config.model_dump().items():
        if isinstance(value, dt.timedelta):
            assert dt.timedelta(0) <= value <= dt.timedelta(days=365 * 100), field
        elif isinstance(value, float):
            assert math.isfinite(value), field


@fuzz(500)
@given(
    st.sampled_from(COMPONENTS),
    near(("lease: 10s\nthreads: 3\nmongodb_uri: x\n", "node: a\nstate_dir: /x\n")),
)
@example(COMPONENTS[0], DEEP)
@example(COMPONENTS[0], "lease: " + "1" * 5000)
def test_settings_file_text_of_any_shape(
    workdir: Path, component: tuple[str, type[config.Component]], text: str
) -> None:
    path = written(workdir, "settings.yaml", text)
    result = resolved_or_error(component[1], config_file=path, environ={"MONGODB_URI": URI})
    if isinstance(result, ConfigError):
        assert str(result).startswith((f"config file {path}: ", "invalid "))


@fuzz(600)
@given(
    st.sampled_from(COMPONENTS),
    st.dictionaries(
        st.sampled_from(
            (
                "FAULTLINE_LEASE",
                "FAULTLINE_THREADS",
                "FAULTLINE_PACKS",
                "FAULTLINE_DEFAULT_MODE",
                "FAULTLINE_NIC_INTERVAL",
                "FAULTLINE_JOB_ANNOTATIONS",
                "FAULTLINE_RESET_COMMAND",
                "FAULTLINE_BREAKER_MAX_SHARE",
                "NODE_NAME",
                "MONGODB_URI",
                "KUBECONFIG",
            )
        ),
        st.sampled_from(NASTY)
        | st.text(max_size=20)
        | st.sampled_from(("[1,", '{"a": 1}', "[]", "10s", "nan")),
        max_size=4,
    ),
)
def test_environment_resolves_or_names_the_variable(
    component: tuple[str, type[config.Component]], environ: dict[str, str]
) -> None:
    result = resolved_or_error(component[1], environ={"MONGODB_URI": URI, "NODE_NAME": "n", **environ})
    if isinstance(result, ConfigError):
        assert str(result).startswith(("environment: ", "invalid "))
        return
    for field, source in result.sources.items():
        assert source == "default" or source.startswith("env "), field


# -- quarantine rules ----------------------------------------------------------------------------------

RULES = {
    "rules": [
        {"name": "fatal-gpu", "match": {"fatal": True, "component": ["GPU"]}, "cordon": True,
         "taints": [{"key": "faultline.io/fault", "value": "{code}", "effect": "NoSchedule"}]},
        {"name": "flapping", "match": {"code": ["NIC-FLAPPING"], "min_count": 3, "node_labels": {"pool": "a"}},
         "labels": {"faultline.io/nic": "degraded", "example.com/code": "{code}"}},
    ]
}  # fmt: skip


@st.composite
def mutated(draw: st.DrawFn, document: dict[str, Any]) -> tuple[dict[str, Any], tuple[Any, ...]]:
    """The document with one place changed (replaced by a value of any shape, removed, or given an
    unknown key); returns it and the path changed."""
    doc = copy.deepcopy(document)
    where = draw(st.sampled_from(list(paths(doc))[1:]))
    parent = doc
    for key in where[:-1]:
        parent = parent[key]
    op = draw(st.sampled_from(("replace", "replace", "remove", "add")))
    if op == "remove":
        del parent[where[-1]]
    elif op == "add" and isinstance(parent[where[-1]], dict):
        parent[where[-1]][draw(st.sampled_from(("colour", "Cordon", "")))] = draw(leaf)
    else:
        parent[where[-1]] = draw(yaml_values)
    return doc, where


faults = st.builds(
    rules.OpenFault,
    st.text(min_size=1, max_size=10),
    st.sampled_from(("XID-79", "NIC-FLAPPING", "A" * 63, "GPU-FELL-OFF-BUS"))
    | st.sampled_from(("X.Y_Z-1", "0", "NIC-DOWN")),
    st.sampled_from(list(Component)),
    st.sampled_from(list(Action)),
    st.booleans(),
    st.integers(0, 10),
)


def rules_or_error(path: Path) -> tuple[rules.Rule, ...] | ConfigError:
    try:
        return rules.load_rules(path)
    except ConfigError as exc:
        return exc


@fuzz(700)
@given(
    mutated(RULES),
    st.lists(faults, max_size=4),
    st.dictionaries(st.sampled_from(("pool", "x")), st.sampled_from(("a", "b"))),
)
@example((RULES, ()), [], {})
def test_quarantine_rules_load_or_name_the_rule_and_give_valid_taints(
    workdir: Path, mutation: tuple[dict[str, Any], tuple[Any, ...]], open_faults: list[rules.OpenFault],
    labels: dict[str, str],
) -> None:  # fmt: skip
    doc, where = mutation
    path = written(workdir, "rules.yaml", dump(doc))
    result = rules_or_error(path)
    if isinstance(result, ConfigError):
        assert str(result).startswith(f"{path}: ")
        rule = (
            doc["rules"][where[1]]
            if where[:1] == ("rules",) and len(where) > 2 and isinstance(doc.get("rules"), list)
            else None
        )
        if isinstance(rule, dict) and isinstance(rule.get("name"), str) and rule["name"]:
            # a problem inside a rule names it (unless it is a clash between rules' names)
            assert f"(rule {rule['name']!r})" in str(result) or "unique" in str(result), result
        return
    want = rules.desired(result, open_faults, labels)
    for _key, value, effect in want.taints:
        assert len(value) <= 63 and effect in ("NoSchedule", "PreferNoSchedule", "NoExecute")
    assert set(want.faults) <= {f.key for f in open_faults}


@fuzz(500)
@given(near((dump(RULES),), max_edits=3))
@example(DEEP)  # RecursionError from the pure-Python YAML loader
@example("rules: " + "9" * 5000)  # ValueError from PyYAML's int()
@example("rules:\n  - name: \udcff\n")  # not UTF-8: UnicodeDecodeError
def test_quarantine_rules_text_of_any_shape(workdir: Path, text: str) -> None:
    path = written(workdir, "rules.yaml", text)
    result = rules_or_error(path)
    if isinstance(result, ConfigError):
        assert str(result).startswith(f"{path}: ")


# -- remediation templates -----------------------------------------------------------------------------

TEMPLATE = {
    "apiVersion": "repair.example.com/v1",
    "kind": "Repair",
    "metadata": {"labels": {"team": "gpu"}, "annotations": {"why": "${reason}"}},
    "spec": {"node": "${node}", "what": "${action} of ${gpus}", "gpus": "${gpus}", "faults": "${faultKeys}"},
}


def template_or_error(path: Path) -> dict[str, Any] | ConfigError:
    try:
        return templates.load(path)
    except ConfigError as exc:
        return exc


values = st.fixed_dictionaries(
    {
        "name": st.sampled_from(("r-1", "repair-gpu-1-2", "x" * 40)),
        "node": st.text(min_size=1, max_size=20),
        "action": st.sampled_from(("GPU_RESET", "REBOOT", "REPLACE")),
        "gpus": st.lists(st.text(max_size=12), max_size=3),
        "faultKeys": st.lists(st.text(max_size=12), max_size=3),
        "reason": any_text,
    }
)


@fuzz(1000)
@given(mutated(TEMPLATE), values)
@example(({**TEMPLATE, "metadata": {"labels": ["gpu"]}}, ("metadata", "labels")), {  # crashed render
    "name": "r", "node": "n", "action": "REBOOT", "gpus": [], "faultKeys": [], "reason": ""})  # fmt: skip
def test_templates_load_or_name_the_place_and_render_any_repair(
    workdir: Path, mutation: tuple[dict[str, Any], tuple[Any, ...]], repair: dict[str, Any]
) -> None:
    doc, _ = mutation
    path = written(workdir, "template.yaml", dump(doc))
    result = template_or_error(path)
    if isinstance(result, ConfigError):
        assert str(result).startswith(f"{path}: ")
        return
    body = templates.render(result, repair)
    assert isinstance(body["metadata"]["name"], str) and body["metadata"]["name"]
    assert body["metadata"]["labels"]["faultline.io/node"] == repair["node"]
    assert isinstance(body["kind"], str) and "/" in body["apiVersion"]


@fuzz(500)
@given(near((dump(TEMPLATE),), max_edits=3))
@example(DEEP)
@example("apiVersion: a/b\nkind: K\nx: 2026-13-01\n")
def test_template_text_of_any_shape(workdir: Path, text: str) -> None:
    path = written(workdir, "template.yaml", text)
    result = template_or_error(path)
    if isinstance(result, ConfigError):
        assert str(result).startswith(f"{path}: ")
