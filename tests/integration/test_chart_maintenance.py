"""The chart's cloud maintenance monitor (`maintenance.enabled`, off by default): its Deployment runs
`faultline maintenance` with a settings file its model accepts (every value mapped), its identity lists
Nodes and nothing more, the agents relay Azure's Scheduled Events only when Azure is watched, the OCI key
comes from a Secret, the NetworkPolicies let it reach the providers and the agent Azure's metadata
service, and bad values are refused by name. Installing it with every component and asking the API
server what its identity may do is tests/integration/test_rbac_matrix.py."""

from __future__ import annotations

import datetime as dt
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from cli import settings
from devtools import tools
from faultline import config
from tests.integration.test_chart import CHART, render, settings_files, workloads

pytestmark = pytest.mark.integration
ON = "maintenance.enabled=true"


@pytest.fixture(scope="module", autouse=True)
def helm() -> None:
    tools.ensure("helm")


def named(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def resolve(values: dict[str, Any], tmp: Path, component: str, model: type[config.Component]) -> Any:
    path = tmp / f"{component}.yaml"
    path.write_text(yaml.safe_dump(values))
    env = {"MONGODB_URI": "mongodb://mongo:27017", "NODE_NAME": "node-1"}
    return settings.resolve(model, config_file=path, environ=env).config


def test_off_by_default() -> None:
    docs = render()
    assert not [d for d in docs if "maintenance" in d["metadata"]["name"]]
    assert "scheduled_events" not in settings_files(docs)["agent"]


def test_the_monitor_its_settings_and_its_identity(tmp_path: Path) -> None:
    docs = render(ON, "maintenance.leadTime=3h", "maintenance.interval=30s", "maintenance.settle=15m",
                  "maintenance.quarantineKinds={REBOOT,REDEPLOY,TERMINATE,FREEZE}", "maintenance.awsRegion=eu-west-1",
                  "maintenance.endpoints.gcp=https://compute.example.com/compute/v1",
                  "maintenance.watchSelector=pool=gpu", "maintenance.azure.acknowledge=false",
                  "maintenance.serviceAccountAnnotations.eks\\.amazonaws\\.com/role-arn=arn:aws:iam::1:role/m")  # fmt: skip
    objects = named(docs)
    deployment = objects[("Deployment", "fl-maintenance")]
    assert deployment["spec"]["replicas"] == 1
    pod = workloads(docs)["fl-maintenance"]
    container = pod["containers"][0]
    assert container["args"] == ["maintenance", "--config=/etc/faultline/config/config.yaml"]
    assert pod["serviceAccountName"] == "fl-maintenance"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    cfg = resolve(settings_files(docs)["maintenance"], tmp_path, "maintenance", config.MaintenanceConfig)
    assert isinstance(cfg, config.MaintenanceConfig)
    assert (cfg.lead_time, cfg.interval, cfg.settle) == (dt.timedelta(hours=3), dt.timedelta(seconds=30),
                                                         dt.timedelta(minutes=15))  # fmt: skip
    assert cfg.quarantine_kinds == ("REBOOT", "REDEPLOY", "TERMINATE", "FREEZE")
    assert (cfg.clouds, cfg.aws_region, cfg.node_selector, cfg.acknowledge) == (
        ("aws", "gcp", "azure", "oci"), "eu-west-1", "pool=gpu", False)  # fmt: skip
    assert (cfg.gcp_endpoint, cfg.aws_endpoint) == ("https://compute.example.com/compute/v1", None)
    account = objects[("ServiceAccount", "fl-maintenance")]
    assert account["metadata"]["annotations"] == {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/m"}
    assert objects[("ClusterRole", "fl-maintenance")]["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}
    ]
    events = objects[("Role", "fl-maintenance-events")]
    assert events["metadata"]["namespace"] == "default"
    # the agents relay Azure's Scheduled Events (the agent's settings accept it)
    agent = resolve(settings_files(docs)["agent"], tmp_path, "agent", config.AgentConfig)
    assert isinstance(agent, config.AgentConfig) and agent.scheduled_events is True


def test_azure_relay_only_when_azure_is_watched_and_the_oci_key_from_a_secret(tmp_path: Path) -> None:
    docs = render(ON, "maintenance.clouds={aws,oci}", "maintenance.ociConfigSecret=oci-key")
    assert "scheduled_events" not in settings_files(docs)["agent"]
    pod = workloads(docs)["fl-maintenance"]
    assert {"name": "oci", "secret": {"secretName": "oci-key"}} in pod["volumes"]
    assert {"name": "oci", "mountPath": "/etc/faultline/oci", "readOnly": True} in pod["containers"][0][
        "volumeMounts"
    ]
    cfg = resolve(settings_files(docs)["maintenance"], tmp_path, "maintenance", config.MaintenanceConfig)
    assert cfg.clouds == ("aws", "oci") and cfg.oci_config == Path("/etc/faultline/oci/config")
    off = render(ON, "maintenance.azure.scheduledEvents=false")
    assert "scheduled_events" not in settings_files(off)["agent"]


def test_network_policies_reach_the_providers_and_the_metadata_service() -> None:
    docs = render(ON, "networkPolicy.enabled=true", "podMonitor.enabled=true")
    policies = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "NetworkPolicy"}
    egress = policies["fl-maintenance"]["egress"]
    assert {"ports": [{"port": 443, "protocol": "TCP"}]} in egress  # the providers' APIs, wherever they are
    assert {
        "to": [{"ipBlock": {"cidr": "169.254.0.0/16"}}],
        "ports": [{"port": 80, "protocol": "TCP"}],
    } in egress
    agent = policies["fl-agent"]["egress"]
    assert {
        "to": [{"ipBlock": {"cidr": "169.254.169.254/32"}}],
        "ports": [{"port": 80, "protocol": "TCP"}],
    } in agent
    ferret = policies["fl-ferretdb"]["ingress"][0]["from"][0]["podSelector"]["matchExpressions"]
    assert "maintenance" in next(e["values"] for e in ferret if e["key"] == "app.kubernetes.io/component")
    monitor = next(d for d in docs if d["kind"] == "PodMonitor")
    selected = monitor["spec"]["selector"]["matchExpressions"]
    assert "maintenance" in next(e["values"] for e in selected if e["key"] == "app.kubernetes.io/component")
    plain = {
        d["metadata"]["name"]: d["spec"]
        for d in render("networkPolicy.enabled=true")
        if d["kind"] == "NetworkPolicy"
    }
    assert not [r for r in plain["fl-agent"]["egress"] if "169.254.169.254/32" in str(r)]


def test_helm_lint_strict_with_the_monitor() -> None:
    argv = [str(tools.binary("helm")), "lint", "--strict", str(CHART), "--set", ON, "--set", "networkPolicy.enabled=true",
            "--set", "maintenance.ociConfigSecret=oci-key"]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize(
    ("sets", "error"),
    [
        ([ON, "maintenance.replicas=2"], "at '/maintenance/replicas'"),
        ([ON, "maintenance.leadTime=soon"], "at '/maintenance/leadTime'"),
        ([ON, "maintenance.clouds={ibm}"], "at '/maintenance/clouds/0'"),
        ([ON, "maintenance.quarantineKinds={REBOOT,SHUTDOWN}"], "at '/maintenance/quarantineKinds/1'"),
        ([ON, "maintenance.endpoints.aws=ftp://ec2"], "at '/maintenance/endpoints/aws'"),
        ([ON, "maintenance.endpoints.azure=https://x"], "additional properties 'azure' not allowed"),
        ([ON, "maintenance.azure.acknowledge=maybe"], "at '/maintenance/azure/acknowledge'"),
    ],
)
def test_bad_values_are_refused_by_name(sets: list[str], error: str) -> None:
    with pytest.raises(ValueError, match=re.escape(error)):
        render(*sets)
