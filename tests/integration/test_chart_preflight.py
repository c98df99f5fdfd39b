"""The chart's preflight (`preflight.enabled`, off by default): what it renders (the webhook's Deployment,
Service, MutatingWebhookConfiguration, identity, TLS Secret, the gang ClusterRole and its per-namespace
bindings; cert-manager's Issuer and Certificate instead of the webhook's own certificates), that the
webhook's settings file resolves, that the init container the webhook then makes is one whose settings
the preflight accepts, and that bad values are refused by name. Installing it with every component, and
asking the API server what its identity may do, is tests/integration/test_rbac_matrix.py."""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from cli import flags, settings
from devtools import tools
from faultline import config
from tests.integration.test_chart import hook_secrets, render, workloads
from workers import preflight_inject

pytestmark = pytest.mark.integration
ON = "preflight.enabled=true"
DIGEST = "sha256:" + "0123456789abcdef" * 4


def named(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def webhook_settings(docs: list[dict[str, Any]], tmp: Path) -> config.WebhookConfig:
    data = named(docs)[("ConfigMap", "fl-webhook-config")]["data"]["config.yaml"]
    path = tmp / "webhook.yaml"
    path.write_text(data)
    resolved = settings.resolve(
        config.WebhookConfig, config_file=path, environ={"POD_NAMESPACE": "faultline-chart"}
    )
    assert isinstance(resolved.config, config.WebhookConfig)
    return resolved.config


def test_off_by_default() -> None:
    assert not [
        d for d in render() if "webhook" in d["metadata"]["name"] or "preflight" in d["metadata"]["name"]
    ]


def test_the_webhook_and_its_configuration(tmp_path: Path) -> None:
    docs = render(ON, f"image.digest={DIGEST}")
    objects = named(docs)
    for kind, name in [
        ("ServiceAccount", "fl-webhook"),
        ("ClusterRole", "fl-webhook"),
        ("Role", "fl-webhook"),
        ("Service", "fl-webhook"),
        ("Deployment", "fl-webhook"),
        ("MutatingWebhookConfiguration", "fl-preflight"),
        ("ClusterRole", "fl-preflight-gang"),
    ]:
        assert (kind, name) in objects, (kind, name)
    assert not [
        d for d in docs if d["kind"] == "RoleBinding" and d["metadata"]["name"] == "fl-preflight-gang"
    ]
    (hook,) = objects[("MutatingWebhookConfiguration", "fl-preflight")]["webhooks"]
    assert hook["failurePolicy"] == "Ignore" and hook["timeoutSeconds"] == 5
    assert hook["namespaceSelector"] == {"matchLabels": {"faultline.io/preflight": "enabled"}}
    assert hook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    assert hook["clientConfig"] == {
        "service": {"name": "fl-webhook", "namespace": "faultline-chart", "path": "/mutate", "port": 443}
    }  # the webhook sets the caBundle
    assert (hook["sideEffects"], hook["admissionReviewVersions"]) == ("None", ["v1"])
    # its TLS Secret: made empty by the chart's Secrets hook (never rendered: kept as the webhook fills it)
    assert ("Secret", "fl-webhook-tls") not in objects
    assert "fl-webhook-tls" in [s["name"] for s in hook_secrets(ON)]

    rules = {json.dumps(r, sort_keys=True) for r in objects[("ClusterRole", "fl-webhook")]["rules"]}
    assert rules == {
        json.dumps(r, sort_keys=True)
        for r in [
            {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]},
            {
                "apiGroups": ["admissionregistration.k8s.io"],
                "resources": ["mutatingwebhookconfigurations"],
                "resourceNames": ["fl-preflight"],
                "verbs": ["get", "patch"],
            },
        ]
    }
    assert objects[("Role", "fl-webhook")]["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": ["fl-webhook-tls"],
            "verbs": ["get", "update"],
        }
    ]

    pod = workloads(docs)["fl-webhook"]
    (container,) = pod["containers"]
    assert container["args"] == ["webhook", "--config=/etc/faultline/config/config.yaml"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "https", "scheme": "HTTPS"}
    assert (
        pod["securityContext"]["runAsNonRoot"] is True
        and container["securityContext"]["readOnlyRootFilesystem"]
    )
    assert objects[("Service", "fl-webhook")]["spec"]["ports"] == [
        {"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}
    ]

    cfg = webhook_settings(docs, tmp_path)
    assert cfg.image == f"ghcr.io/faultline/faultline@{DIGEST}" and cfg.namespace == "faultline-chart"
    assert (cfg.service, cfg.webhook_config, cfg.tls_secret, cfg.tls_source) == (
        "fl-webhook",
        "fl-preflight",
        "fl-webhook-tls",
        "secret",
    )
    # by default no host path: findings leave on the termination message, the journal is not mounted
    assert cfg.ingest_socket is None and cfg.journal_dirs == ()
    monitor = yaml.safe_load(objects[("ConfigMap", "fl-object-monitor-config")]["data"]["config.yaml"])
    assert monitor["preflight_findings"] is True and monitor["preflight_digests"] == [DIGEST]
    assert monitor["builtin_rules"] is False and monitor["rules"] == []  # the reader alone: no object rule
    journal = webhook_settings(render(ON, "preflight.journal=true"), tmp_path)
    assert journal.journal_dirs == (Path("/var/log/journal"), Path("/run/log/journal"))


def test_the_init_container_it_makes_accepts_its_settings(tmp_path: Path) -> None:
    """The chart's values through the webhook's settings to the init container's environment, which the
    preflight resolves as given (gang timeout, DCGM diagnostics on the node's host engine, a setting by name)."""
    docs = render(
        ON,
        "preflight.gang.timeout=10m",
        "preflight.dcgm.diagLevel=2",
        "preflight.preflightSettings.pcie_generation=true",
        "preflight.checks={ecc,xid,dcgm}",
        "preflight.journal=true",
    )
    cfg = webhook_settings(docs, tmp_path)
    inject = preflight_inject.InjectSettings(
        image=cfg.image,
        checks=cfg.checks,
        gang_keys=cfg.gang_keys,
        gang_size_keys=cfg.gang_size_keys,
        gang_round_keys=cfg.gang_round_keys,
        ingest_socket=cfg.ingest_socket,
        journal_dirs=cfg.journal_dirs,
        env=cfg.preflight_settings,
        resources=cfg.init_resources,
    )
    pod = {
        "metadata": {
            "labels": {"jobset.sigs.k8s.io/jobset-name": "llm"},
            "annotations": {"faultline.io/gang-size": "4"},
        },
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]},
    }
    body = {
        "request": {"uid": "u", "kind": {"group": "", "kind": "Pod"}, "operation": "CREATE", "object": pod}
    }
    response = preflight_inject.review(body, inject, namespace_labels={"faultline.io/preflight": "enabled"})[
        "response"
    ]
    (op, *_) = json.loads(base64.b64decode(response["patch"]))
    (init,) = op["value"]
    downward = {"NODE_NAME": "gpu-7", "POD_NAME": "llm-0", "POD_NAMESPACE": "train", "HOST_IP": "10.0.0.7"}
    env = {e["name"]: e.get("value", "") for e in init["env"] if "value" in e}
    env = {
        k: re.sub(r"\$\((\w+)\)", lambda m: downward[m.group(1)], v) for k, v in env.items()
    }  # the kubelet's
    resolved = settings.resolve(config.PreflightConfig, environ={**downward, **env}).config
    assert isinstance(resolved, config.PreflightConfig)
    assert resolved.checks == ("ecc", "xid", "dcgm")
    assert resolved.gang_timeout == 600.0 and resolved.gang_size == 4
    assert resolved.gang == "jobset.sigs.k8s.io/jobset-name=llm"
    assert (resolved.dcgm_diag_level, resolved.dcgm_host) == (2, "10.0.0.7:5555")
    assert resolved.pcie_generation is True and resolved.expected_gpus == 8
    assert resolved.journal_dirs == (Path("/var/log/journal"), Path("/run/log/journal"))
    assert resolved.ingest_socket is None


def test_a_simulator_directory(tmp_path: Path) -> None:
    """preflight.simDir (tests and the demo): the init container mounts that node directory and its
    settings resolve to the simulated GPUs there; unset, NVML."""
    assert webhook_settings(render(ON), tmp_path).sim_dir is None
    cfg = webhook_settings(render(ON, "preflight.simDir=/var/lib/faultline/sim"), tmp_path)
    assert cfg.sim_dir == Path("/var/lib/faultline/sim")
    inject = preflight_inject.InjectSettings(image=cfg.image, sim_dir=cfg.sim_dir, env=cfg.preflight_settings)
    pod = {"spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}
    body = {
        "request": {"uid": "u", "kind": {"group": "", "kind": "Pod"}, "operation": "CREATE", "object": pod}
    }
    response = preflight_inject.review(body, inject, namespace_labels={"faultline.io/preflight": "enabled"})
    ops = json.loads(base64.b64decode(response["response"]["patch"]))
    (init,) = ops[0]["value"]
    assert ops[1]["value"] == [
        {
            "name": "faultline-preflight-sim",
            "hostPath": {"path": "/var/lib/faultline/sim", "type": "Directory"},
        }
    ]
    env = {e["name"]: e["value"] for e in init["env"] if "value" in e}
    resolved = settings.resolve(config.PreflightConfig, environ={"NODE_NAME": "gpu-7", **env}).config
    assert isinstance(resolved, config.PreflightConfig)
    assert (resolved.gpu_backend, resolved.sim_dir) == ("sim", Path("/var/lib/faultline/sim"))


def test_switches(tmp_path: Path) -> None:
    docs = render(
        ON,
        "preflight.failurePolicy=Fail",
        "preflight.timeoutSeconds=10",
        "preflight.journal=false",
        "preflight.report=false",
        "preflight.gang.namespaces={train,research}",
    )
    objects = named(docs)
    (hook,) = objects[("MutatingWebhookConfiguration", "fl-preflight")]["webhooks"]
    assert (hook["failurePolicy"], hook["timeoutSeconds"]) == ("Fail", 10)
    cfg = webhook_settings(docs, tmp_path)
    assert (
        cfg.ingest_socket is None and cfg.journal_dirs == ()
    )  # no host path: the init container runs as 65532
    bindings = [
        d for d in docs if d["kind"] == "RoleBinding" and d["metadata"]["name"] == "fl-preflight-gang"
    ]
    assert {(b["metadata"]["namespace"], b["subjects"][0]["name"]) for b in bindings} == {
        ("train", "system:serviceaccounts:train"),
        ("research", "system:serviceaccounts:research"),
    }
    assert {b["roleRef"]["name"] for b in bindings} == {"fl-preflight-gang"}
    assert objects[("ClusterRole", "fl-preflight-gang")]["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "patch"]}
    ]
    assert ("Deployment", "fl-object-monitor") not in objects  # report off: no reader


def test_cert_manager_instead(tmp_path: Path) -> None:
    docs = render(ON, "preflight.certManager.enabled=true")
    objects = named(docs)
    assert ("Role", "fl-webhook") not in objects
    assert "fl-webhook-tls" not in [s["name"] for s in hook_secrets(ON, "preflight.certManager.enabled=true")]
    cert = objects[("Certificate", "fl-webhook")]
    assert cert["spec"]["secretName"] == "fl-webhook-tls"
    assert "fl-webhook.faultline-chart.svc" in cert["spec"]["dnsNames"]
    assert cert["spec"]["issuerRef"] == {"name": "fl-webhook", "kind": "Issuer"}
    assert objects[("Issuer", "fl-webhook")]["spec"] == {"selfSigned": {}}
    mwc = objects[("MutatingWebhookConfiguration", "fl-preflight")]
    assert mwc["metadata"]["annotations"] == {"cert-manager.io/inject-ca-from": "faultline-chart/fl-webhook"}
    assert objects[("ClusterRole", "fl-webhook")]["rules"] == [
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]}
    ]  # no Secret, no caBundle to write
    cfg = webhook_settings(docs, tmp_path)
    assert (cfg.tls_source, cfg.tls_cert, cfg.webhook_config) == (
        "files",
        Path("/etc/faultline/tls/tls.crt"),
        "",
    )
    volumes = {v["name"]: v for v in workloads(docs)["fl-webhook"]["volumes"]}
    assert volumes["tls"] == {"name": "tls", "secret": {"secretName": "fl-webhook-tls"}}
    theirs = named(
        render(
            ON,
            "preflight.certManager.enabled=true",
            "preflight.certManager.issuer=corp",
            "preflight.certManager.issuerKind=ClusterIssuer",
        )
    )
    assert ("Issuer", "fl-webhook") not in theirs
    assert theirs[("Certificate", "fl-webhook")]["spec"]["issuerRef"] == {
        "name": "corp",
        "kind": "ClusterIssuer",
    }


def test_the_webhooks_network_policy() -> None:
    """Ingress only to its HTTPS port and (from where the others allow scrapes) its metrics port; egress only
    to DNS and the API server."""
    assert ("NetworkPolicy", "fl-webhook") not in named(render(ON))
    scrapers = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    docs = render(
        ON,
        "networkPolicy.enabled=true",
        "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=monitoring",
    )
    objects = named(docs)
    policy = objects[("NetworkPolicy", "fl-webhook")]["spec"]
    selector = objects[("Deployment", "fl-webhook")]["spec"]["selector"]["matchLabels"]
    assert (
        policy["podSelector"]["matchLabels"]
        == selector
        == {
            "app.kubernetes.io/instance": "fl",
            "app.kubernetes.io/component": "webhook",
        }
    )
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    assert policy["ingress"] == [
        {"ports": [{"port": 8443, "protocol": "TCP"}]},
        {"ports": [{"port": 9400, "protocol": "TCP"}], "from": [scrapers]},
    ]
    assert policy["egress"] == [
        {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]},
        {
            "to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}],
            "ports": [{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}],
        },
    ]
    no_metrics = named(render(ON, "networkPolicy.enabled=true", "metrics.port=0"))
    assert no_metrics[("NetworkPolicy", "fl-webhook")]["spec"]["ingress"] == [
        {"ports": [{"port": 8443, "protocol": "TCP"}]}
    ]


def test_every_webhook_setting_is_settable_from_values(tmp_path: Path) -> None:
    """preflight.config reaches each field of the webhook's settings (as `<component>.config` does for the
    others), and preflight.preflightSettings each setting of the init container the webhook may pass."""
    example = config.WebhookConfig(image="x", namespace="n")
    dumped = example.model_dump(mode="json", exclude={"kubeconfig", "namespace"})
    dumped.update(
        {
            f: flags.format_value(getattr(example, f))
            for f in dumped
            if isinstance(getattr(example, f), dt.timedelta)
        }
    )  # durations as people write them
    given = {k: v for k, v in dumped.items() if v is not None}
    path = tmp_path / "values.yaml"
    init = {
        "gpu_backend": "sim",
        "nvlink_min_active": 12,
        "xid_min_action": "RESTART_BM",
        "kmsg": "/dev/kmsg",
    }
    path.write_text(
        yaml.safe_dump({"preflight": {"enabled": True, "config": given, "preflightSettings": init}})
    )
    out = subprocess.run(
        [
            str(tools.binary("helm")),
            "template",
            "fl",
            str(Path(__file__).resolve().parents[2] / "charts" / "faultline"),
            "--namespace",
            "faultline-chart",
            "-f",
            str(path),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    cfg = webhook_settings(docs, tmp_path)
    for name in given:
        assert getattr(cfg, name) == getattr(example, name) or name in ("preflight_settings",), name
    assert {k: cfg.preflight_settings[k] for k in init} == {k: str(v) for k, v in init.items()}


@pytest.mark.parametrize(
    ("sets", "error"),
    [
        ([ON, "preflight.failurePolicy=Sometimes"], "at '/preflight/failurePolicy'"),
        ([ON, "preflight.timeoutSeconds=31"], "at '/preflight/timeoutSeconds'"),
        ([ON, "preflight.checks={ecc,ecx}"], "at '/preflight/checks/1'"),
        ([ON, "preflight.gang.timeout=soon"], "at '/preflight/gang/timeout'"),
        ([ON, "preflight.gang.namespaces={Bad_NS}"], "at '/preflight/gang/namespaces/0'"),
        ([ON, "preflight.dcgm.diagLevel=5"], "at '/preflight/dcgm/diagLevel'"),
        ([ON, "preflight.certManager.issuerKind=Vault"], "at '/preflight/certManager/issuerKind'"),
        ([ON, "preflight.simDir=sim"], "at '/preflight/simDir'"),
        ([ON, "preflight.gangs.timeout=1m"], "additional properties 'gangs' not allowed"),
    ],
)
def test_bad_values_are_refused_by_name(sets: list[str], error: str) -> None:
    with pytest.raises(ValueError, match=re.escape(error)):
        render(*sets)


@pytest.mark.parametrize(
    "sets", [[ON], [ON, "preflight.certManager.enabled=true", "preflight.gang.namespaces={a,b}"]]
)
def test_helm_lint_strict(sets: list[str]) -> None:
    argv = [
        str(tools.binary("helm")),
        "lint",
        "--strict",
        str(Path(__file__).resolve().parents[2] / "charts" / "faultline"),
    ]
    out = subprocess.run(
        [*argv, *(a for s in sets for a in ("--set", s))], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr
