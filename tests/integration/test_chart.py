"""The Helm chart: `helm lint --strict`, what it renders for each set of values (image by digest, the store
it brings or the one it is given, probes, security contexts, the agent's host paths, NetworkPolicy and
PodMonitor), that values.schema.json refuses bad values by name, a real `helm install` and upgrade into
the local API server (objects created and validated; pods do not run on simulated nodes), and that the
RBAC it grants is enough for every component to do its job on the real control plane (and no more than
asked: a few refusals are checked). The workers run here as the chart's ServiceAccounts, with tokens
minted for them."""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import os
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools import procs, tools
from devtools.cluster import LocalCluster
from faultline import kube, store
from faultline.errors import ConflictError, ForbiddenError, NotFoundError, TransientError
from faultline.kube import lite
from faultline.models import Action, FaultState
from tests.integration.test_drainer import pod, pods_on
from tests.integration.test_janitor import _fault
from workers import breaker, drainer, inflight, janitor, quarantine, remediation

pytestmark = pytest.mark.integration
CHART = Path(__file__).resolve().parents[2] / "charts" / "faultline"
NS = "faultline-chart"
WORKERS = ("quarantine", "drain", "remediation", "janitor")
ALL_ON = ["quarantine.enabled=true", "drain.enabled=true", "remediation.enabled=true", "janitor.enabled=true"]
EXTERNAL = "store.external.uri=mongodb://mongo:27017"
DIGEST = "sha256:" + "0123456789abcdef" * 4
STORE_KINDS = {("StatefulSet", "fl-postgres"), ("Service", "fl-postgres"), ("Deployment", "fl-ferretdb"),
               ("Service", "fl-ferretdb")}  # fmt: skip
# a cluster pack of the user's, as analyzer.packs gives it: the same GPU (by UUID) failing again on any node
ANALYZER_PACK = """
pack: chart-cluster
patterns:
  - id: chart-gpu-repeat
    scope: cluster
    description: the same GPU (by UUID) fails again within a day, whichever node it is in
    match: {codes: [XID-79, XID-95]}
    window: {key: [gpu], within: 24h, count: 2}
    fault:
      code: CHART-GPU-REPEAT
      component: GPU
      entity: {type: GPU-UUID, id: "{gpu}"}
      fatal: true
      action: CONTACT_SUPPORT
    examples:
      match:
        - records:
            - {node: n1, code: XID-79, metadata: {gpu_uuid: GPU-1}}
            - {at: 1h, node: n2, code: XID-95, metadata: {gpu_uuid: GPU-1}}
          expect: {nodes: [n2], entity_id: GPU-1, count: 2}
      no_match:
        - records:
            - {node: n1, code: XID-79, metadata: {gpu_uuid: GPU-1}}
            - {at: 1h, node: n2, code: XID-79, metadata: {gpu_uuid: GPU-2}}
"""


def render(
    *sets: str, namespace: str = NS, hooks: bool = False, values: Path | None = None
) -> list[dict[str, Any]]:
    """The release's objects (or, with `hooks`, only its hooks' objects), with a values file if given."""
    argv = [str(tools.binary("helm")), "template", "fl", str(CHART), "--namespace", namespace]
    if values is not None:
        argv += ["-f", str(values)]
    for s in sets:
        argv += ["--set", s]
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    if out.returncode:
        raise ValueError(out.stderr.strip())
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    return [d for d in docs if ("helm.sh/hook" in (d["metadata"].get("annotations") or {})) == hooks]


def workloads(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each workload's pod spec by its object name."""
    kinds = ("DaemonSet", "Deployment", "StatefulSet")
    return {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in docs if d["kind"] in kinds}


def kinds(docs: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(d["kind"], d["metadata"]["name"]) for d in docs}


def settings_files(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each component's settings file (`config.yaml` of its ConfigMap, passed with --config), by component."""
    return {d["metadata"]["labels"]["app.kubernetes.io/component"]: yaml.safe_load(d["data"]["config.yaml"])
            for d in docs if d["kind"] == "ConfigMap" and "config.yaml" in d["data"]}  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def helm() -> None:
    tools.ensure("helm")


def test_helm_lint_strict() -> None:
    for sets in ([], [*ALL_ON, EXTERNAL, "networkPolicy.enabled=true", "podMonitor.enabled=true"]):
        argv = [str(tools.binary("helm")), "lint", "--strict", str(CHART)]
        out = subprocess.run([*argv, *(a for s in sets for a in ("--set", s))], capture_output=True, text=True,
                             check=False)  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr


def test_defaults_monitor_only_with_the_embedded_store() -> None:
    docs = render()
    assert {k for k, _ in kinds(docs)} == {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "DaemonSet",
        "ConfigMap",
        "Service",
        "StatefulSet",
        "Deployment",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",  # the agents' own-node policy
        "CronJob",  # store retention
    }  # fmt: skip  (no Secret: the hook makes them, test_the_secrets_hook_...)
    assert kinds(docs) >= STORE_KINDS
    assert {n for k, n in kinds(docs) if k == "Deployment"} == {"fl-ferretdb"}  # no worker
    agent = workloads(docs)["fl-agent"]
    args = agent["containers"][0]["args"]
    assert args == ["agent", "--config=/etc/faultline/config/config.yaml"]
    assert settings_files(docs)["agent"]["gpu_backend"] == "nvml"
    env = {e["name"]: e for e in agent["containers"][0]["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["MONGODB_URI"]["valueFrom"]["secretKeyRef"] == {"name": "fl-store", "key": "uri"}

    (store,) = [s for s in hook_secrets() if s["name"] == "fl-store"]
    assert store["random"] == {"password": 32} and store["fixed"] == {"username": "faultline"}
    uri = store["derived"]["uri"]  # the components' URI: FerretDB's Service, the role's password
    assert uri.startswith(
        f"mongodb://faultline:${{password}}@fl-ferretdb.{NS}.svc:27017/?authMechanism=PLAIN"
    )
    ferret = workloads(docs)["fl-ferretdb"]["containers"][0]
    assert f"-postgresql-url=postgres://fl-postgres.{NS}.svc:5432/postgres" in ferret["args"]  # no password
    postgres = next(d for d in docs if d["kind"] == "StatefulSet")
    claim = postgres["spec"]["volumeClaimTemplates"][0]
    assert claim["spec"]["resources"]["requests"]["storage"] == "8Gi"
    assert "storageClassName" not in claim["spec"]  # the cluster's default
    pg_env = {e["name"]: e for e in postgres["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert pg_env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "fl-store", "key": "password"}
    ephemeral = next(d for d in render("store.embedded.postgres.storage.persistent=false")
                     if d["kind"] == "StatefulSet")  # fmt: skip
    assert "volumeClaimTemplates" not in ephemeral["spec"]
    assert {"name": "data", "emptyDir": {}} in ephemeral["spec"]["template"]["spec"]["volumes"]
    claim = next(
        d
        for d in render(
            "store.embedded.postgres.storage.storageClass=fast", "store.embedded.postgres.storage.size=20Gi"
        )
        if d["kind"] == "StatefulSet"
    )
    assert claim["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"] == "fast"
    assert claim["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "20Gi"


def hook_secrets(*sets: str) -> list[dict[str, Any]]:
    """The Secrets the chart's Secrets hook makes (its ConfigMap's settings)."""
    (cm,) = [
        d
        for d in render(*sets, hooks=True)
        if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "fl-secrets"
    ]
    return list(yaml.safe_load(cm["data"]["config.yaml"])["secrets"])


def test_the_secrets_hook_makes_the_generated_secrets_and_renders_never_change() -> None:
    """Every render of the same values is the same (GitOps tools render with `helm template`): no value is
    generated in a template. The Secrets that need one are made by a pre-install/pre-upgrade hook Job
    with its own identity: create Secrets, get and update only these."""
    sets = [*ALL_ON, "preflight.enabled=true"]
    argv = [
        str(tools.binary("helm")),
        "template",
        "fl",
        str(CHART),
        "--namespace",
        NS,
        *(a for s in sets for a in ("--set", s)),
    ]
    first, second = (subprocess.run(argv, capture_output=True, check=True).stdout for _ in range(2))
    assert first == second
    assert [s["name"] for s in hook_secrets(*sets)] == ["fl-store", "fl-evidence", "fl-webhook-tls"]
    hooks = [d for d in render(*sets, hooks=True) if d["metadata"]["name"] == "fl-secrets"]
    by_kind = {d["kind"]: d for d in hooks}
    assert set(by_kind) == {"ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Job"}
    assert {d["metadata"]["annotations"]["helm.sh/hook"] for d in hooks} == {"pre-install,pre-upgrade"}
    weights = {k: int(d["metadata"]["annotations"]["helm.sh/hook-weight"]) for k, d in by_kind.items()}
    assert all(w < weights["Job"] for k, w in weights.items() if k != "Job")  # identity and settings first
    assert by_kind["Role"]["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["fl-store", "fl-evidence", "fl-webhook-tls"],
         "verbs": ["get", "update"]},
    ]  # fmt: skip
    pod = by_kind["Job"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["args"] == ["chart-secrets", "--config=/etc/faultline/config/config.yaml"]
    assert (
        pod["securityContext"]["runAsNonRoot"] is True
        and pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"]
    )
    # nothing to make: no hook
    assert not [
        d
        for d in render(EXTERNAL, "evidence.existingSecret=mine", "podSecurity.label=false", hooks=True)
        if d["metadata"]["name"] == "fl-secrets"
    ]


def test_a_private_registry_reaches_every_pod_the_chart_and_faultline_make() -> None:
    sets = [*ALL_ON, "preflight.enabled=true", "imagePullSecrets[0].name=registry-a"]
    docs = render(*sets) + render(*sets, hooks=True)
    pods = {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in docs
            if d["kind"] in ("DaemonSet", "Deployment", "StatefulSet", "Job")}  # fmt: skip
    assert {"fl-agent", "fl-janitor", "fl-webhook", "fl-secrets", "fl-uninstall"} <= set(pods)
    missing = [n for n, spec in pods.items() if spec.get("imagePullSecrets") != [{"name": "registry-a"}]]
    assert not missing
    files = settings_files(docs)
    assert files["janitor"]["image_pull_secrets"] == ["registry-a"]  # the repair Jobs
    assert files["webhook"]["image_pull_secrets"] == ["registry-a"]  # the pods preflight is injected into
    files = settings_files(render(*sets, "preflight.imagePullSecrets[0].name=tenant-registry"))
    assert files["webhook"]["image_pull_secrets"] == ["tenant-registry"]


SITE_PACK = """\
pack: site
version: 1
description: a site's own lines
patterns:
  - id: site-ecc-storm
    description: the site's ECC storm report
    regex: 'site-gpu-check: ECC storm on (?P<pci>[0-9a-f:]+)'
    code: SITE-ECC-STORM
    component: GPU
    entity: {type: GPU, id: "{pci}"}
    classify:
      - set: {fatal: false, action: NONE, description: ECC storm}
    examples:
      match:
        - line: "site-gpu-check: ECC storm on 0000:3b:00"
          expect: {code: SITE-ECC-STORM, fatal: false}
      no_match:
        - "site-gpu-check: all good"
"""


def test_the_extension_points_chart_users_expect(tmp_path: Path) -> None:
    """commonLabels on every object; pod annotations and labels chart-wide and per component; a
    component's affinity, extra environment, volumes and mounts; PodDisruptionBudgets for workers with
    more than one replica; site packs for the agent."""
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({
        "commonLabels": {"cost-center": "gpu"}, "podAnnotations": {"example.com/scrape": "yes"},
        "podLabels": {"team": "infra"},
        "quarantine": {"enabled": True, "podLabels": {"tier": "control"},
                       "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                           "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["system"]}]}]}}},
                       "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}],
                       "extraVolumes": [{"name": "ca", "configMap": {"name": "site-ca"}}],
                       "extraVolumeMounts": [{"name": "ca", "mountPath": "/etc/ssl/site", "readOnly": True}]},
        "drain": {"enabled": True, "replicas": 1},
        "agent": {"packs": {"site.yaml": SITE_PACK}, "packsConfigMap": "more-packs",
                  "extraEnv": [{"name": "TZ", "value": "UTC"}]},
    }))  # fmt: skip
    docs = render(values=values) + render(values=values, hooks=True)
    assert all(d["metadata"]["labels"].get("cost-center") == "gpu" for d in docs if "labels" in d["metadata"])
    assert all("labels" in d["metadata"] for d in docs)
    pods = {
        d["metadata"]["name"]: d["spec"]["template"]
        for d in docs
        if d["kind"] in ("DaemonSet", "Deployment", "StatefulSet")
    }
    for name, template in pods.items():
        assert template["metadata"]["labels"]["team"] == "infra", name
        assert template["metadata"]["annotations"]["example.com/scrape"] == "yes", name
    q = pods["fl-quarantine"]
    assert (
        q["metadata"]["labels"]["tier"] == "control" and "tier" not in pods["fl-agent"]["metadata"]["labels"]
    )
    assert set(q["spec"]["affinity"]) == {"nodeAffinity"}  # instead of the default spread
    assert "podAntiAffinity" in pods["fl-drain"]["spec"]["affinity"]
    container = q["spec"]["containers"][0]
    assert {"name": "HTTPS_PROXY", "value": "http://proxy:3128"} in container["env"]
    assert {"name": "ca", "mountPath": "/etc/ssl/site", "readOnly": True} in container["volumeMounts"]
    assert {"name": "ca", "configMap": {"name": "site-ca"}} in q["spec"]["volumes"]
    budgets = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "PodDisruptionBudget"}
    assert budgets == {
        "fl-quarantine": {
            "maxUnavailable": 1,
            "selector": {
                "matchLabels": {
                    "app.kubernetes.io/instance": "fl",
                    "app.kubernetes.io/component": "quarantine",
                }
            },
        }
    }  # drain has 1 replica
    assert not [
        d for d in render(*ALL_ON, "podDisruptionBudget.enabled=false") if d["kind"] == "PodDisruptionBudget"
    ]
    # the agent's site packs: a ConfigMap of the chart's, one of the user's, both directories in its settings
    agent = pods["fl-agent"]["spec"]
    (packs,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "fl-agent-packs"]
    assert packs["data"] == {"site.yaml": SITE_PACK}
    assert settings_files(docs)["agent"]["packs"] == [
        "/etc/faultline/packs/values",
        "/etc/faultline/packs/configmap",
    ]
    mounts = {m["name"]: m["mountPath"] for m in agent["containers"][0]["volumeMounts"]}
    assert (mounts["packs"], mounts["packs-configmap"]) == (
        "/etc/faultline/packs/values",
        "/etc/faultline/packs/configmap",
    )
    volumes = {v["name"]: v for v in agent["volumes"]}
    assert volumes["packs-configmap"]["configMap"] == {"name": "more-packs"}
    assert {"name": "TZ", "value": "UTC"} in agent["containers"][0]["env"]
    # the pack the chart ships is one the agent loads
    from patterns import loader  # noqa: PLC0415

    pack_dir = tmp_path / "packs"
    pack_dir.mkdir()
    (pack_dir / "site.yaml").write_text(packs["data"]["site.yaml"])
    assert "site-ecc-storm" in loader.load([pack_dir]).patterns  # with the built-in packs, as the agent does
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"agent": {"packs": {"x.yaml": "- [unclosed"}}}))
    with pytest.raises(ValueError, match=r"agent\.packs\.x\.yaml: not a pack"):
        render(values=bad)


def test_dcgm_through_the_gpu_operators_host_engine(tmp_path: Path) -> None:
    """gpuBackend=dcgm: the host engine at the node's address (the GPU Operator's standalone DCGM listens
    on each node's port 5555), given in the environment where the kubelet expands $(HOST_IP), and DCGM's
    bindings and client library copied from an image that carries them, or mounted from the node."""
    from cli import settings  # noqa: PLC0415
    from faultline import config  # noqa: PLC0415

    image = "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04"
    docs = render("agent.gpuBackend=dcgm", f"agent.dcgmBindings.image={image}")
    pod = workloads(docs)["fl-agent"]
    env = [e["name"] for e in pod["containers"][0]["env"]]
    values = {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["containers"][0]["env"]}
    assert values["HOST_IP"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
    assert env.index("HOST_IP") < env.index("FAULTLINE_DCGM_HOST")  # defined first: the kubelet expands it
    assert values["FAULTLINE_DCGM_HOST"] == "$(HOST_IP):5555"
    assert (values["FAULTLINE_DCGM_BINDINGS"], values["LD_LIBRARY_PATH"]) == (
        "/opt/dcgm/bindings",
        "/opt/dcgm/lib",
    )
    (init,) = pod["initContainers"]
    assert init["image"] == image and init["command"][3:] == [
        "/usr/share/datacenter-gpu-manager-4/bindings/python3",
        "",  # the image's own architecture's library directory: no architecture setting
    ]
    # the copy, run here on a stand-in of the DCGM image's files: libdcgm from /usr/lib/<machine>-linux-gnu
    fake = tmp_path / "dcgm-image"
    (fake / "bindings" / "pydcgm").mkdir(parents=True)
    (fake / "bindings" / "pydcgm" / "__init__.py").write_text("")
    (fake / "lib" / f"{os.uname().machine}-linux-gnu").mkdir(parents=True)
    (fake / "lib" / f"{os.uname().machine}-linux-gnu" / "libdcgm.so.4").write_text("elf")
    script = (
        init["command"][2].replace("/opt/dcgm", str(tmp_path / "pod")).replace("/usr/lib", str(fake / "lib"))
    )
    subprocess.run(["sh", "-c", script, str(fake / "bindings"), ""], check=True)
    assert (tmp_path / "pod" / "lib" / "libdcgm.so.4").read_text() == "elf"
    assert (tmp_path / "pod" / "bindings" / "pydcgm" / "__init__.py").is_file()
    assert {"name": "dcgm", "emptyDir": {"sizeLimit": "64Mi"}} in pod["volumes"]
    # the agent takes the address from its environment, as the kubelet expanded it
    file = tmp_path / "agent.yaml"
    file.write_text(yaml.safe_dump(settings_files(docs)["agent"]))
    resolved = settings.resolve(config.AgentConfig, config_file=file, environ={
        "MONGODB_URI": "mongodb://m:27017", "NODE_NAME": "n1", "FAULTLINE_DCGM_HOST": "10.0.4.17:5555"})  # fmt: skip
    assert isinstance(resolved.config, config.AgentConfig) and resolved.config.dcgm_host == "10.0.4.17:5555"
    # the node's own DCGM install instead
    pod = workloads(render("agent.gpuBackend=dcgm"))["fl-agent"]
    assert "initContainers" not in pod
    assert {
        "name": "dcgm",
        "hostPath": {"path": "/usr/local/dcgm/bindings/python3", "type": "Directory"},
    } in pod["volumes"]
    assert "LD_LIBRARY_PATH" not in {e["name"] for e in pod["containers"][0]["env"]}
    assert "HOST_IP" not in {
        e["name"] for e in workloads(render())["fl-agent"]["containers"][0]["env"]
    }  # nvml


def test_the_uninstall_hook_takes_back_the_marks_with_its_own_narrow_identity() -> None:
    docs = [
        d
        for d in render(*ALL_ON, "janitor.namespace=repairs", hooks=True)
        if d["metadata"]["name"] == "fl-uninstall"
    ]
    assert all(d["metadata"]["annotations"]["helm.sh/hook"] == "post-delete" for d in docs)
    by_kind = {(d["kind"], d["metadata"].get("namespace", "")): d for d in docs}
    job = by_kind[("Job", NS)]
    weights = {k: int(d["metadata"]["annotations"]["helm.sh/hook-weight"]) for k, d in by_kind.items()}
    assert all(w < weights[("Job", NS)] for k, w in weights.items() if k[0] != "Job")  # identity first
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["args"][:3] == ["uninstall", "--instance=fl", "--repair-namespace=repairs"]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["restartPolicy"] == "Never"
    tolerated = {t["key"] for t in pod["tolerations"]}
    assert tolerated == {"faultline.io/fault", "node.kubernetes.io/unschedulable"}
    cluster_rules = by_kind[("ClusterRole", "")]["rules"]
    assert {r["resources"][0]: tuple(r["verbs"]) for r in cluster_rules} == {
        "nodes": ("get", "list", "patch"), "nodes/status": ("get", "patch"),
        "remediationrequests": ("list", "deletecollection"),
    }  # fmt: skip
    assert by_kind[("Role", NS)]["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    assert by_kind[("Role", "repairs")]["rules"] == [
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["list", "delete"]}
    ]
    assert not [
        d for d in render("cleanup.enabled=false", hooks=True) if d["metadata"]["name"] == "fl-uninstall"
    ]


def test_an_external_store_brings_no_store_objects() -> None:
    docs = render(EXTERNAL)
    assert not STORE_KINDS & kinds(docs)
    assert {k for k, _ in kinds(docs)} & {"StatefulSet", "Service", "Deployment"} == set()
    secret = next(d for d in docs if d["kind"] == "Secret")
    assert secret["stringData"] == {"uri": "mongodb://mongo:27017"}
    assert secret["metadata"]["name"] == "fl-store-uri"  # not fl-store: the embedded store's, kept
    env = {e["name"]: e for e in workloads(docs)["fl-agent"]["containers"][0]["env"]}
    assert env["MONGODB_URI"]["valueFrom"]["secretKeyRef"] == {"name": "fl-store-uri", "key": "uri"}
    docs = render("store.external.existingSecret=my-mongo", "store.external.existingSecretKey=connection")
    assert [n for k, n in kinds(docs) if k == "Secret"] == []  # none for the store
    assert [s["name"] for s in hook_secrets("store.external.existingSecret=my-mongo")] == ["fl-evidence"]
    assert not STORE_KINDS & kinds(docs)
    env = {e["name"]: e for e in workloads(docs)["fl-agent"]["containers"][0]["env"]}
    assert env["MONGODB_URI"]["valueFrom"]["secretKeyRef"] == {"name": "my-mongo", "key": "connection"}


def test_one_image_by_digest_for_every_component_and_the_repair_jobs() -> None:
    docs = render(*ALL_ON, EXTERNAL, "image.repository=registry.local/faultline", f"image.digest={DIGEST}",
                  "image.tag=ignored")  # fmt: skip
    images = {c["image"] for spec in workloads(docs).values() for c in spec["containers"]}
    assert images == {f"registry.local/faultline@{DIGEST}"}
    assert settings_files(docs)["janitor"]["image"] == f"registry.local/faultline@{DIGEST}"
    tagged = render("janitor.enabled=true", "image.tag=1.2.3")
    assert {c["image"] for c in workloads(tagged)["fl-janitor"]["containers"]} == {
        "ghcr.io/faultline/faultline:1.2.3"
    }
    assert settings_files(tagged)["janitor"]["image"] == "ghcr.io/faultline/faultline:1.2.3"
    other = settings_files(render("janitor.enabled=true", "janitor.repairImage=repair:1"))
    assert other["janitor"]["image"] == "repair:1"
    store = workloads(render(f"store.embedded.postgres.image.digest={DIGEST}"))
    assert store["fl-postgres"]["containers"][0]["image"] == f"ghcr.io/faultline/postgres@{DIGEST}"
    assert store["fl-ferretdb"]["containers"][0]["image"] == "ghcr.io/faultline/ferretdb:1.24.2"


def _probe_port(probe: dict[str, Any]) -> int | str:
    action = probe.get("httpGet") or probe.get("tcpSocket")
    assert action is not None, probe  # exec probes name no port
    return action["port"]  # type: ignore[no-any-return]


def test_every_probe_reaches_a_port_the_container_exposes() -> None:
    docs = render(*ALL_ON)
    specs = workloads(docs)
    assert set(specs) == {"fl-agent", "fl-quarantine", "fl-drain", "fl-remediation", "fl-janitor",
                          "fl-ferretdb", "fl-postgres"}  # fmt: skip
    for name, spec in specs.items():
        (container,) = spec["containers"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert "livenessProbe" in container and "readinessProbe" in container, name
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = container.get(kind)
            if probe is None or "exec" in probe:
                continue
            port = _probe_port(probe)
            assert port in ports or port in ports.values(), (name, kind, port)
            assert probe["timeoutSeconds"] >= 1 and probe["periodSeconds"] >= probe["timeoutSeconds"]
        if name not in ("fl-ferretdb", "fl-postgres"):
            assert ports == {"metrics": 9400}
            assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    for component, values in settings_files(docs).items():  # where the server listens: the pod IP too
        if component == "retention":  # a Job that runs once: no server, no probes
            continue
        assert values["metrics_port"] == 9400 and values["metrics_address"] == "0.0.0.0", component
    off = workloads(render("quarantine.enabled=true", "metrics.port=0"))
    for name in ("fl-agent", "fl-quarantine"):
        assert "ports" not in off[name]["containers"][0] and "livenessProbe" not in off[name]["containers"][0]


def _restricted(container: dict[str, Any]) -> None:
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not sc.get("privileged")


def test_security_contexts_are_as_narrow_as_each_component_allows() -> None:
    specs = workloads(render(*ALL_ON))
    for name, spec in specs.items():
        (container,) = spec["containers"]
        _restricted(container)
        assert not spec.get("hostPID") and not spec.get("hostNetwork") and not spec.get("hostIPC"), name
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        if name == "fl-agent":  # root as the owner of root-owned host files, with no capability
            assert spec["securityContext"]["runAsUser"] == 0
            assert "add" not in container["securityContext"]["capabilities"]
        else:  # the image's user
            assert spec["securityContext"]["runAsNonRoot"] is True
            assert spec["securityContext"]["runAsUser"] == 65532
        if name in {f"fl-{w}" for w in WORKERS}:
            # SIGTERM: the worker hands back its claims within 20 s (workers/run.py)
            assert spec["terminationGracePeriodSeconds"] >= 25
    agent = workloads(render("agent.kmsg=true"))["fl-agent"]
    assert agent["containers"][0]["securityContext"] == {"privileged": True}
    mounts = {m["name"]: m for m in agent["containers"][0]["volumeMounts"]}
    assert mounts["kmsg"] == {"name": "kmsg", "mountPath": "/dev/kmsg", "readOnly": True}
    assert "hostPID" not in agent


def test_the_agents_host_paths() -> None:
    docs = render()
    agent = workloads(docs)["fl-agent"]
    mounts = {m["mountPath"]: m for m in agent["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in agent["volumes"]}

    def host(path: str) -> dict[str, Any]:
        return volumes[mounts[path]["name"]]["hostPath"]  # type: ignore[no-any-return]

    for journal in ("/var/log/journal", "/run/log/journal"):
        assert mounts[journal]["readOnly"] is True and host(journal)["path"] == journal
    assert mounts["/host/sys"]["readOnly"] is True and host("/host/sys") == {
        "path": "/sys",
        "type": "Directory",
    }
    assert not mounts["/var/lib/faultline"].get("readOnly")
    assert host("/var/lib/faultline") == {"path": "/var/lib/faultline", "type": "DirectoryOrCreate"}
    assert not mounts["/run/faultline"].get("readOnly")
    assert host("/run/faultline") == {"path": "/run/faultline", "type": "DirectoryOrCreate"}
    assert "/dev/kmsg" not in mounts
    assert volumes[mounts["/tmp"]["name"]]["emptyDir"]  # the root filesystem is read-only
    agent_file = settings_files(docs)["agent"]
    assert agent_file["sysfs_root"] == "/host/sys"  # NIC monitoring is on
    assert agent_file["journal_dir"] == "/var/log/journal"
    assert agent_file["state_dir"] == "/var/lib/faultline"
    assert agent_file["ingest_socket"] == "/run/faultline/ingest.sock"
    assert "kmsg" not in agent_file
    assert "runtimeClassName" not in agent  # the node's default runtime
    with_class = workloads(render("agent.nvidia.runtimeClassName=nvidia"))["fl-agent"]
    assert with_class["runtimeClassName"] == "nvidia"
    env = {e["name"]: e.get("value") for e in agent["containers"][0]["env"]}
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"

    docs = render("agent.sysfsRoot=", "agent.ingestSocket=", "agent.gpuBackend=sim",
                  "agent.journalDir=/var/log/other")  # fmt: skip
    agent = workloads(docs)["fl-agent"]
    mounts = {m["mountPath"]: m for m in agent["containers"][0]["volumeMounts"]}
    assert "/host/sys" not in mounts and "/run/faultline" not in mounts
    assert mounts["/var/log/other"]["readOnly"] is True
    assert "sysfs_root" not in settings_files(docs)["agent"]
    assert "NVIDIA_VISIBLE_DEVICES" not in {e["name"] for e in agent["containers"][0]["env"]}  # sim


def test_network_policy_and_pod_monitor_when_enabled() -> None:
    assert not {k for k, _ in kinds(render(*ALL_ON))} & {"NetworkPolicy", "PodMonitor"}
    docs = render(
        *ALL_ON, "networkPolicy.enabled=true", "podMonitor.enabled=true", "podMonitor.labels.release=prom"
    )
    policies = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "NetworkPolicy"}
    assert set(policies) == {f"fl-{c}" for c in ("agent", *WORKERS, "ferretdb", "postgres", "retention")}
    ferret_from = policies["fl-ferretdb"]["ingress"][0]["from"][0]["podSelector"]["matchExpressions"]
    assert {"key": "app.kubernetes.io/component", "operator": "In",
            "values": ["agent", "quarantine", "drain", "remediation", "janitor", "maintenance", "object-monitor",
                       "analyzer", "export", "retention"]} in ferret_from  # fmt: skip
    assert policies["fl-postgres"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/instance": "fl", "app.kubernetes.io/component": "ferretdb"}  # fmt: skip
    agent_egress = [r for r in policies["fl-agent"]["egress"] if "to" in r]
    assert {p["port"] for r in agent_egress for p in r["ports"]} == {443, 6443, 27017}
    monitor = next(d for d in docs if d["kind"] == "PodMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["podMetricsEndpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "30s"}
    ]
    external = {d["metadata"]["name"] for d in render(EXTERNAL, "networkPolicy.enabled=true")
                if d["kind"] == "NetworkPolicy"}  # fmt: skip
    assert external == {"fl-agent", "fl-retention"}


def test_each_worker_is_switched_on_by_its_value() -> None:
    for worker in ("quarantine", "drain", "remediation", "janitor"):
        deployments = {n for k, n in kinds(render(f"{worker}.enabled=true", EXTERNAL)) if k == "Deployment"}
        assert deployments == {f"fl-{worker}"}
    docs = render(*ALL_ON, EXTERNAL, "quarantine.dryRun=true", "drain.defaultMode=AllowCompletion", "janitor.cloud=gcp",
                  "janitor.rebootVia=cloud", "remediation.canReplace=true")  # fmt: skip
    args = {d["metadata"]["name"]: d["spec"]["template"]["spec"]["containers"][0]["args"]
            for d in docs if d["kind"] == "Deployment"}  # fmt: skip
    assert args["fl-quarantine"] == ["worker", "quarantine", "--config=/etc/faultline/config/config.yaml"]
    files = settings_files(docs)
    assert files["quarantine"]["dry_run"] is True
    assert files["drain"]["default_mode"] == "AllowCompletion"
    assert files["remediation"]["can_replace"] is True
    janitor_file = {"cloud": "gcp", "reboot_via": "cloud", "namespace": NS, "service_account": "fl-repair"}
    assert janitor_file.items() <= files["janitor"].items()


def _analyzer_values(tmp_path: Path, name: str = "analyzer", **analyzer: Any) -> Path:
    """A values file switching the analyzer on (pack texts span lines: they do not go through --set)."""
    path = tmp_path / f"{name}-values.yaml"
    path.write_text(yaml.safe_dump({"analyzer": {"enabled": True, **analyzer}}))
    return path


def test_the_analyzer_spread_over_pods_is_a_statefulset_whose_pods_know_each_other(tmp_path: Path) -> None:
    """analyzer.pods: a StatefulSet of that many pods started together, spread over nodes, a headless
    Service that publishes their names before they are Ready, every pod given every pod's name and port
    (peers, as the analyzer reads them), each process's port open to the other pods only."""
    from cli import analyzer_processes, settings  # noqa: PLC0415
    from faultline import config  # noqa: PLC0415

    values = _analyzer_values(tmp_path, pods=3, processes=2, config={"process_port": 7600})
    docs = render("networkPolicy.enabled=true", values=values)
    assert ("Deployment", "fl-analyzer") not in kinds(docs)
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    assert sts["metadata"]["name"] == "fl-analyzer"
    spec = sts["spec"]
    assert (spec["replicas"], spec["serviceName"], spec["podManagementPolicy"]) == (
        3,
        "fl-analyzer-peers",
        "Parallel",
    )
    pod = spec["template"]["spec"]
    term = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert [p["containerPort"] for p in pod["containers"][0]["ports"]] == [9400, 7600, 7601]
    service = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "fl-analyzer-peers")
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == spec["selector"]["matchLabels"]
    assert [p["port"] for p in service["spec"]["ports"]] == [7600, 7601]
    analyzer_file = settings_files(docs)["analyzer"]
    assert analyzer_file["peers"] == [f"fl-analyzer-{i}.fl-analyzer-peers:7600" for i in range(3)]
    path = tmp_path / "analyzer.yaml"
    path.write_text(yaml.safe_dump(analyzer_file))
    resolved = settings.resolve(
        config.AnalyzerConfig, config_file=path, environ={"MONGODB_URI": "mongodb://m"}
    )
    where = analyzer_processes.layout(resolved.config, hostname="fl-analyzer-2")  # type: ignore[arg-type]
    assert (where.place, where.first, len(where.hosts)) == (2, 4, 6)
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "fl-analyzer")
    selector = {"podSelector": {"matchLabels": spec["selector"]["matchLabels"]}}
    peer_ports = [{"port": 7600, "protocol": "TCP"}, {"port": 7601, "protocol": "TCP"}]
    assert {"from": [selector], "ports": peer_ports} in policy["spec"]["ingress"]
    assert {"to": [selector], "ports": peer_ports} in policy["spec"]["egress"]
    # its processes given in analyzer.config: the ports follow them; analyzer.replicas 0 stops every pod
    values = _analyzer_values(tmp_path, "cfg", pods=2, replicas=0, config={"processes": 3})
    docs = render("networkPolicy.enabled=true", values=values)
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    assert sts["spec"]["replicas"] == 0
    assert [p["containerPort"] for p in sts["spec"]["template"]["spec"]["containers"][0]["ports"]] == [
        9400, 7410, 7411, 7412,
    ]  # fmt: skip
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "fl-analyzer")
    assert {"from": [selector], "ports": [{"port": 7410 + i, "protocol": "TCP"} for i in range(3)]} in policy[
        "spec"
    ]["ingress"]
    # one pod (the default): a Deployment, no peers, no peer ports
    one = render("networkPolicy.enabled=true", values=_analyzer_values(tmp_path, "one"))
    assert ("Deployment", "fl-analyzer") in kinds(one) and ("Service", "fl-analyzer-peers") not in kinds(one)
    assert "peers" not in settings_files(one)["analyzer"]


def test_the_analyzer_runs_its_packs_from_a_configmap_with_no_more_than_lists_of_nodes_and_pods(
    tmp_path: Path,
) -> None:
    """analyzer.enabled: a Deployment of `faultline analyzer` (replicas as given: one holds the lease) as
    its own ServiceAccount, allowed to list Nodes and Pods (labels, jobs) and nothing else, not even Events; its
    packs of analyzer.packs in a ConfigMap of their own and analyzer.packsConfigMap's, each mounted as a
    directory its settings name; and the agents write the feed only while it is on."""
    from cli import settings  # noqa: PLC0415
    from faultline import config  # noqa: PLC0415
    from patterns import cluster  # noqa: PLC0415

    monitors = ("objectMonitor.enabled=true", "maintenance.enabled=true")
    plain = settings_files(render(*monitors))
    for component in ("agent", "object-monitor", "maintenance"):  # off: the writers skip the feed
        assert "analyzer_feed" not in plain[component]
    assert not {n for _, n in kinds(render()) if "analyzer" in n}
    values = _analyzer_values(
        tmp_path, replicas=2, processes=2, packs={"gpu.yaml": ANALYZER_PACK}, packsConfigMap="site-packs"
    )
    docs = render(
        "networkPolicy.enabled=true", "podMonitor.enabled=true", f"image.digest={DIGEST}", *monitors,
        values=values,
    )  # fmt: skip
    for component in ("agent", "object-monitor", "maintenance"):
        assert settings_files(docs)[component]["analyzer_feed"] is True
    deployment = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "fl-analyzer")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == ["analyzer", "--config=/etc/faultline/config/config.yaml"]
    assert container["image"] == f"ghcr.io/faultline/faultline@{DIGEST}"
    assert pod["serviceAccountName"] == "fl-analyzer" and pod["securityContext"]["runAsUser"] == 65532
    _restricted(container)
    assert container["livenessProbe"]["httpGet"] == container["readinessProbe"]["httpGet"] == {
        "path": "/healthz", "port": "metrics"}  # fmt: skip
    assert container["ports"] == [{"name": "metrics", "containerPort": 9400, "protocol": "TCP"}]
    assert container["resources"]["limits"] == {"memory": "512Mi"}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts["/etc/faultline/packs/values"]]["configMap"] == {"name": "fl-analyzer-packs"}
    assert volumes[mounts["/etc/faultline/packs/configmap"]]["configMap"] == {"name": "site-packs"}
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert set(annotations) == {"checksum/config", "checksum/packs"}  # a changed pack rolls the pods

    analyzer_file = settings_files(docs)["analyzer"]
    assert analyzer_file["packs"] == ["/etc/faultline/packs/values", "/etc/faultline/packs/configmap"]
    assert (analyzer_file["builtin"], analyzer_file["node_labels"], analyzer_file["processes"]) == (
        True,
        True,
        2,
    )
    path = tmp_path / "analyzer.yaml"
    path.write_text(yaml.safe_dump(analyzer_file))
    resolved = settings.resolve(
        config.AnalyzerConfig, config_file=path, environ={"MONGODB_URI": "mongodb://m"}
    )
    assert resolved.config.metrics_port == 9400  # type: ignore[attr-defined]
    assert resolved.config.processes == 2  # type: ignore[attr-defined]
    # the pack file as the pod sees it in its directory, loaded as the analyzer loads it
    (packs,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "fl-analyzer-packs"]
    (tmp_path / "packs").mkdir()
    for name, text in packs["data"].items():
        (tmp_path / "packs" / name).write_text(text)
    loaded = cluster.load([tmp_path / "packs"], builtin=False)
    assert list(loaded.patterns) == ["chart-gpu-repeat"]

    rules = {(d["kind"], d["metadata"]["name"]): d.get("rules") for d in docs}
    assert rules["ClusterRole", "fl-analyzer"] == [
        {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["list"]}
    ]
    assert ("Role", "fl-analyzer-events") not in rules  # it posts no Event
    bound = {(d["kind"], d["roleRef"]["name"]) for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")
             and d["subjects"][0]["name"] == "fl-analyzer"}  # fmt: skip
    assert bound == {("ClusterRoleBinding", "fl-analyzer")}
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "fl-analyzer")
    assert {p["port"] for r in policy["spec"]["egress"] for p in r["ports"]} == {53, 443, 6443, 27017}
    monitor = next(d for d in docs if d["kind"] == "PodMonitor")
    assert "analyzer" in monitor["spec"]["selector"]["matchExpressions"][1]["values"]

    # the labels off: no Kubernetes API access at all (also when switched off through analyzer.config)
    for values in (_analyzer_values(tmp_path, "value", nodeLabels=False),
                   _analyzer_values(tmp_path, "config", config={"node_labels": False})):  # fmt: skip
        docs = render(values=values)
        rules = {(d["kind"], d["metadata"]["name"]): d.get("rules") for d in docs}
        assert rules["ClusterRole", "fl-analyzer"] == []
        assert settings_files(docs)["analyzer"]["node_labels"] is False
        analyzer = workloads(docs)["fl-analyzer"]
        assert [v["name"] for v in analyzer["volumes"]] == [
            "config",
            "tmp",
            "evidence",
        ]  # no packs of the user's
        assert "packs" not in {m["name"] for m in analyzer["containers"][0]["volumeMounts"]}
        assert settings_files(docs)["analyzer"]["packs"] == []


def test_the_analyzers_anomaly_scores_switch_on_the_agents_health_samples(tmp_path: Path) -> None:
    """analyzer.anomaly.enabled turns the analyzer's scores on (anomaly) with analyzer.anomaly.fields as its
    anomaly_fields, and makes the agents store a health sample per GPU every sampleInterval
    (health_samples), as their models resolve the files; the scores off, or the analyzer off, the agents
    send none. The scores switched on through analyzer.config count too."""
    from cli import settings  # noqa: PLC0415
    from faultline import config  # noqa: PLC0415
    from faultline.config.analyzer import ANOMALY_FIELDS  # noqa: PLC0415

    assert "health_samples" not in settings_files(render())["agent"]
    no_analyzer = settings_files(render("analyzer.anomaly.enabled=true"))
    assert "health_samples" not in no_analyzer["agent"]
    off = settings_files(render(values=_analyzer_values(tmp_path)))
    assert "health_samples" not in off["agent"] and "anomaly" not in off["analyzer"]

    fields = {"temperature": {"enabled": True}, "pcie_replay": {"threshold": 10}}
    anomaly = {"enabled": True, "sampleInterval": "60s", "fields": fields}
    image = {"digest": DIGEST}  # the scores need the analyzer image (below)
    files = settings_files(render(values=_analyzer_values(tmp_path, "anomaly", anomaly=anomaly, image=image)))
    assert (files["agent"]["health_samples"], files["agent"]["analyzer_feed"]) == ("60s", True)
    assert (files["analyzer"]["anomaly"], files["analyzer"]["anomaly_fields"]) == (True, fields)
    resolved = {}
    for component in ("agent", "analyzer"):
        path = tmp_path / f"{component}.yaml"
        path.write_text(yaml.safe_dump(files[component]))
        env = {"MONGODB_URI": "mongodb://m", "NODE_NAME": "n1"}
        resolved[component] = settings.resolve(config.COMPONENTS[component], config_file=path, environ=env).config  # fmt: skip
    agent, analyzer = resolved["agent"], resolved["analyzer"]
    assert isinstance(agent, config.AgentConfig) and isinstance(analyzer, config.AnalyzerConfig)
    assert agent.health_samples == 60.0 and analyzer.anomaly is True
    scored = analyzer.anomaly_fields
    assert scored["temperature"].enabled and scored["pcie_replay"].threshold == 10
    assert scored["pcie_replay"].floor == ANOMALY_FIELDS["pcie_replay"].floor  # the rest: its defaults

    by_config = {"enabled": False, "sampleInterval": "5m", "fields": {}}
    files = settings_files(render(values=_analyzer_values(tmp_path, "config", anomaly=by_config,
                                                          config={"anomaly": True}, image=image)))  # fmt: skip
    assert files["agent"]["health_samples"] == "5m" and "anomaly_fields" not in files["analyzer"]
    every = {name: {"enabled": True, "threshold": 8, "floor": 2.5} for name in ANOMALY_FIELDS}
    every_on = {**anomaly, "fields": every}
    render(values=_analyzer_values(tmp_path, "every", anomaly=every_on, image=image))  # all are known


def test_anomaly_scores_need_the_analyzer_image_which_the_analyzer_then_runs(tmp_path: Path) -> None:
    """river (the faultline[anomaly] extra) is in the analyzer image only (`make image-analyzer`): the
    scores switched on (by analyzer.anomaly.enabled or analyzer.config.anomaly) with no analyzer.image fail
    the render by name, rather than an analyzer pod that stops at its start. Given, the analyzer's
    Deployment runs it (repository default: image.repository with -analyzer) and every other component
    the one image; not given, the analyzer runs the one image too."""
    needs = ("analyzer.anomaly.enabled", "analyzer.image", "make image-analyzer")
    for on in ({"anomaly": {"enabled": True}}, {"config": {"anomaly": True}}):
        with pytest.raises(ValueError, match=r"needs analyzer\.image") as refused:
            render(values=_analyzer_values(tmp_path, "refused", **on))
        assert all(name in str(refused.value) for name in needs), refused.value

    product = f"registry.local/faultline@{DIGEST}"
    ours = ["image.repository=registry.local/faultline", f"image.digest={DIGEST}", "quarantine.enabled=true",
            EXTERNAL]  # fmt: skip
    other = "sha256:" + "fedcba9876543210" * 4
    docs = render(
        *ours, values=_analyzer_values(tmp_path, "on", anomaly={"enabled": True}, image={"digest": other})
    )
    images = {name: [c["image"] for c in spec["containers"]] for name, spec in workloads(docs).items()}
    assert images.pop("fl-analyzer") == [f"registry.local/faultline-analyzer@{other}"]
    assert set(images) >= {"fl-agent", "fl-quarantine"}
    assert {image for found in images.values() for image in found} == {product}
    assert settings_files(docs)["analyzer"]["anomaly"] is True

    named = {"repository": "mirror.local/analyzer", "tag": "1.2.3"}
    docs = render(values=_analyzer_values(tmp_path, "named", anomaly={"enabled": True}, image=named))
    assert workloads(docs)["fl-analyzer"]["containers"][0]["image"] == "mirror.local/analyzer:1.2.3"
    docs = render(values=_analyzer_values(tmp_path, "tagged", config={"anomaly": True}, image={"tag": "2"}))
    assert (
        workloads(docs)["fl-analyzer"]["containers"][0]["image"] == "ghcr.io/faultline/faultline-analyzer:2"
    )

    docs = render(*ours, values=_analyzer_values(tmp_path, "off"))  # no scores, no analyzer image
    assert workloads(docs)["fl-analyzer"]["containers"][0]["image"] == product
    assert "anomaly" not in settings_files(docs)["analyzer"]


@pytest.mark.parametrize(
    "sets",
    [
        [],
        [*ALL_ON, "quarantine.rules=rules: []", "remediation.template=kind: X", "agent.gpuBackend=dcgm",
         "janitor.cloud=oci", "janitor.ociConfigSecret=oci", "janitor.awsRegion=eu-west-1"],
        [*ALL_ON, "quarantine.config.lease=45s", "drain.config.qps=50", "janitor.config.job_timeout=15m",
         "remediation.config.threads=7", "agent.config.gpu_poll_interval=2s", "quarantine.threads=3"],
    ],
)  # fmt: skip
def test_each_component_reads_its_settings_file(sets: list[str], tmp_path: Path) -> None:
    """Every settings file the chart renders is valid for its component's model (as `--config` reads it),
    and `<component>.config` sets any field, over the chart's own keys."""
    from cli import settings  # noqa: PLC0415
    from faultline import config  # noqa: PLC0415

    files = settings_files(render(*sets))
    resolved = {}
    for component, values in files.items():
        path = tmp_path / f"{component}.yaml"
        path.write_text(yaml.safe_dump(values))
        env = {"MONGODB_URI": "mongodb://mongo:27017", "NODE_NAME": "node-1"}
        resolved[component] = settings.resolve(config.COMPONENTS[component], config_file=path, environ=env)
        assert resolved[component].sources["database"] == f"file {path}"
    if "quarantine.config.lease=45s" in sets:
        assert resolved["quarantine"].config.lease == dt.timedelta(seconds=45)  # type: ignore[attr-defined]
        assert resolved["quarantine"].config.threads == 3  # type: ignore[attr-defined]
        assert resolved["drain"].config.qps == 50  # type: ignore[attr-defined]
        assert resolved["janitor"].config.job_timeout == dt.timedelta(minutes=15)  # type: ignore[attr-defined]
        assert resolved["remediation"].config.threads == 7  # type: ignore[attr-defined]
        assert resolved["agent"].config.gpu_poll_interval == 2.0  # type: ignore[attr-defined]


def test_every_setting_of_every_component_is_settable_from_values(tmp_path: Path) -> None:
    """`<component>.config` reaches every field of the component's settings model (so every flag of every
    command the chart runs): each field given in a values file comes out in the rendered settings file,
    and the file resolves to that value (secrets, what the pod's environment sets and what the chart sets
    from other values are left out)."""
    from cli import flags, settings  # noqa: PLC0415
    from faultline import config  # noqa: PLC0415

    from_env = {"mongodb_uri", "kubeconfig", "node"}
    by_chart = {
        "peers",
        "peer_index",
    }  # the analyzer's, from analyzer.pods (refused in config: bad values test)
    chart = {"agent": "agent", "quarantine": "quarantine", "drain": "drain", "remediation": "remediation",
             "janitor": "janitor", "maintenance": "maintenance", "object-monitor": "objectMonitor",
             "analyzer": "analyzer"}  # fmt: skip
    values: dict[str, Any] = {key: {"enabled": True} for key in chart.values() if key != "agent"}
    given: dict[str, dict[str, Any]] = {}
    for component, key in chart.items():
        model = config.COMPONENTS[component]
        required = {"mongodb_uri": "mongodb://m:27017", "node": "n"}
        example = model.model_validate({k: v for k, v in required.items() if k in model.model_fields})
        dumped = example.model_dump(
            mode="json"
        )  # durations as a person writes them ("30s"), as `config show`
        dumped.update({f: flags.format_value(getattr(example, f)) for f in model.model_fields
                       if isinstance(getattr(example, f), dt.timedelta)})  # fmt: skip
        given[component] = {
            f: dumped[f] for f in model.model_fields if f not in from_env | by_chart and dumped[f] is not None
        }
        values.setdefault(key, {})["config"] = given[component]
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    out = subprocess.run([str(tools.binary("helm")), "template", "fl", str(CHART), "--namespace", NS, "-f", str(path)],
                         capture_output=True, text=True, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr
    files = settings_files([d for d in yaml.safe_load_all(out.stdout) if d])
    for component, fields in given.items():
        assert set(fields) <= set(files[component]), component
        file = tmp_path / f"{component}.yaml"
        file.write_text(yaml.safe_dump(files[component]))
        env = {"MONGODB_URI": "mongodb://mongo:27017", "NODE_NAME": "node-1"}
        resolved = settings.resolve(config.COMPONENTS[component], config_file=file, environ=env)
        for field in fields:
            assert resolved.sources[field] == f"file {file}", (component, field)


@pytest.mark.parametrize(
    ("sets", "error"),
    [
        (["janitor.enabled=true", "janitor.cloud=ibm"], "at '/janitor/cloud': value must be one of"),
        (["janitor.enabled=true", "janitor.rebootVia=cloud"], "rebootVia=cloud needs janitor.cloud"),
        (["image.digest=sha256:abc"], "at '/image/digest'"),
        (["image.pullPolicy=Sometimes"], "at '/image/pullPolicy'"),
        (["agent.gpuBackend=cuda"], "at '/agent/gpuBackend'"),
        (["agent.stateDir=relative"], "at '/agent/stateDir'"),
        (["metrics.port=70000"], "at '/metrics/port'"),
        (["quarantine.replicas=-1"], "at '/quarantine/replicas'"),
        (["quarantine.holdDown=soon"], "at '/quarantine/holdDown'"),
        (["quarantine.breaker.maxShare=2"], "at '/quarantine/breaker/maxShare'"),
        (["drain.defaultMode=Never"], "at '/drain/defaultMode'"),
        (["store.external.uri=postgres://x"], "at '/store/external/uri'"),
        (["store.embedded.postgres.storage.size=lots"], "at '/store/embedded/postgres/storage/size'"),
        (["agent.replicas=2"], "at '/agent': additional properties 'replicas' not allowed"),
        (["mongodb.uri=mongodb://x"], "additional properties 'mongodb' not allowed"),
        (["store.external.uri=mongodb://x", "store.external.existingSecret=s"], "set uri or existingSecret"),
        (["analyzer.enabled=true", "analyzer.replicas=-1"], "at '/analyzer/replicas'"),
        (
            ["analyzer.packs.notes\\.txt=pack: x"],
            "at '/analyzer/packs': additional properties 'notes.txt' not allowed",
        ),
        (["analyzer.packs.a\\.yaml="], "at '/analyzer/packs/a.yaml'"),
        (
            ["analyzer.enabled=true", "analyzer.packs.a\\.yaml=patterns: ["],
            "analyzer.packs.a.yaml: not a pack",
        ),
        (["analyzer.packsConfigMap=My_Packs"], "at '/analyzer/packsConfigMap'"),
        (["analyzer.nodeLabels=maybe"], "at '/analyzer/nodeLabels'"),
        (["analyzer.lease=5s"], "at '/analyzer': additional properties 'lease' not allowed"),
        (
            ["analyzer.anomaly.fields.fan_speed.enabled=true"],
            "at '/analyzer/anomaly/fields': additional properties 'fan_speed' not allowed",
        ),
        (
            ["analyzer.anomaly.fields.pcie_replay.threshold=0"],
            "at '/analyzer/anomaly/fields/pcie_replay/threshold'",
        ),
        (["analyzer.anomaly.sampleInterval=often"], "at '/analyzer/anomaly/sampleInterval'"),
        (["analyzer.image.digest=sha256:abc"], "at '/analyzer/image/digest'"),
        (["analyzer.pods=0"], "at '/analyzer/pods'"),
        (
            ["analyzer.enabled=true", "analyzer.pods=2", "analyzer.replicas=2"],
            "analyzer.pods (2) with analyzer.replicas (2)",
        ),
        (
            ["analyzer.enabled=true", "analyzer.pods=2", "analyzer.config.owner=me"],
            "analyzer.config.owner: not with analyzer.pods > 1",
        ),
        (
            ["analyzer.enabled=true", "analyzer.config.peers[0]=a:7410"],
            "analyzer.config.peers: set by the chart from analyzer.pods",
        ),
        (
            ["analyzer.enabled=true", "analyzer.pods=2", "analyzer.config.peer_index=1"],
            "analyzer.config.peer_index: set by the chart from analyzer.pods",
        ),
        (["analyzer.image.pullPolicy=Always"], "at '/analyzer/image': additional properties 'pullPolicy'"),
    ],
)
def test_bad_values_are_refused_by_name(sets: list[str], error: str) -> None:
    with pytest.raises(ValueError, match=re.escape(error)):
        render(*sets)


def _helm(kubeconfig: Path, *args: str) -> str:
    out = subprocess.run([str(tools.binary("helm")), "--kubeconfig", str(kubeconfig), *args],
                         capture_output=True, text=True, check=False, timeout=90)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


def _manifest(kubeconfig: Path, release: str, ns: str) -> set[tuple[str, str]]:
    out = _helm(kubeconfig, "get", "manifest", release, "--namespace", ns)
    return kinds([d for d in yaml.safe_load_all(out) if d])


def _password(core: Any, name: str, ns: str) -> str:
    secret = core.read_namespaced_secret(name, ns)
    password = base64.b64decode(secret.data["password"]).decode()
    assert password in base64.b64decode(secret.data["uri"]).decode()  # the URI follows the password
    return password


def test_helm_install_and_upgrades_keep_the_stores_password(cluster: LocalCluster, api: Any) -> None:
    """A real install into the local API server: it validates every object (NetworkPolicies, the
    StatefulSet's claim template, security contexts), and its pre-install hook makes the store's password
    (the session's fake kubelet carries the hook out as its container would). Upgrades (every worker on;
    to an external store and back) and a GitOps tool's re-apply of `helm template` keep the password,
    which the PostgreSQL volume was initialised with; `helm uninstall` leaves it."""
    ns, release = f"chart-{uuid.uuid4().hex[:6]}", f"i{uuid.uuid4().hex[:5]}"
    core = kube.core(api)
    install = ["--namespace", ns, "--set", "networkPolicy.enabled=true", "--set", f"image.digest={DIGEST}"]
    try:
        _helm(cluster.kubeconfig, "install", release, str(CHART), "--create-namespace", *install)
        password = _password(core, f"{release}-store", ns)
        assert len(password) == 32
        evidence_key = core.read_namespaced_secret(f"{release}-evidence", ns).data["key"]
        made = _manifest(cluster.kubeconfig, release, ns)
        assert {("StatefulSet", f"{release}-postgres"), ("Deployment", f"{release}-ferretdb"),
                ("DaemonSet", f"{release}-agent"), ("NetworkPolicy", f"{release}-ferretdb")} <= made  # fmt: skip
        assert not {n for k, n in made if k == "Secret"}  # the hook's, not the release's
        postgres = kube.client.apps(api).read_namespaced_stateful_set(f"{release}-postgres", ns)
        assert postgres.spec.volume_claim_templates[0].spec.resources.requests == {"storage": "8Gi"}
        all_on = [a for s in ALL_ON for a in ("--set", s)]
        _helm(cluster.kubeconfig, "upgrade", release, str(CHART), *install, *all_on)
        assert _password(core, f"{release}-store", ns) == password
        made = _manifest(cluster.kubeconfig, release, ns)
        assert {("Deployment", f"{release}-{w}") for w in WORKERS} <= made
        # to an external store and back (docs/install/store.md): the embedded store's Secret outlives the
        # switch, so the volume's password is the same when the StatefulSet comes back
        _helm(cluster.kubeconfig, "upgrade", release, str(CHART), *install, "--set", EXTERNAL)
        made = _manifest(cluster.kubeconfig, release, ns)
        assert ("StatefulSet", f"{release}-postgres") not in made
        assert ("Secret", f"{release}-store-uri") in made
        assert _password(core, f"{release}-store", ns) == password
        _helm(cluster.kubeconfig, "upgrade", release, str(CHART), *install)
        assert _password(core, f"{release}-store", ns) == password
        # a GitOps tool's sync (Argo CD): `helm template` applied, its pre-install hook run as a PreSync
        # hook (applied, then the release's own objects), twice; nothing it applies holds a password
        rendered = [
            d
            for d in yaml.safe_load_all(_helm(cluster.kubeconfig, "template", release, str(CHART), *install))
            if d
        ]
        presync = [
            d
            for d in rendered
            if "pre-install" in (d["metadata"].get("annotations") or {}).get("helm.sh/hook", "")
        ]
        assert presync and not [d for d in rendered if d["kind"] == "Secret"]
        for _ in range(2):
            for docs in (
                presync,
                [d for d in rendered if "helm.sh/hook" not in (d["metadata"].get("annotations") or {})],
            ):
                applied = subprocess.run(
                    [str(tools.binary("kubectl")), "--kubeconfig", str(cluster.kubeconfig), "apply", "--server-side",
                     "--force-conflicts", "--field-manager=argocd-controller", "-f", "-"],
                    input=yaml.safe_dump_all(docs), text=True, capture_output=True, check=False, timeout=60,
                )  # fmt: skip
                assert applied.returncode == 0, applied.stderr
            procs.wait_for("the PreSync hook done", lambda: (kube.batch(api).read_namespaced_job(
                f"{release}-secrets", ns).status.succeeded or 0) >= 1, 30)  # fmt: skip
            kube.batch(api).delete_namespaced_job(f"{release}-secrets", ns, propagation_policy="Background")
            procs.wait_for("the hook Job gone", lambda: not kube.batch(api).list_namespaced_job(
                ns, field_selector=f"metadata.name={release}-secrets").items, 30)  # fmt: skip
            assert _password(core, f"{release}-store", ns) == password
        assert core.read_namespaced_secret(f"{release}-evidence", ns).data["key"] == evidence_key
        _helm(cluster.kubeconfig, "uninstall", release, "--namespace", ns, "--wait")
        assert _password(core, f"{release}-store", ns) == password  # the data the volume still holds
    finally:
        subprocess.run([str(tools.binary("helm")), "--kubeconfig", str(cluster.kubeconfig), "uninstall", release,
                        "--namespace", ns], capture_output=True, check=False, timeout=60)  # fmt: skip
        with contextlib.suppress(Exception):
            core.delete_namespace(ns, propagation_policy="Background")


def test_an_upgrade_brings_the_crd_to_the_charts_version(cluster: LocalCluster, api: Any) -> None:
    """Helm never upgrades a chart's CRDs; the chart's pre-upgrade hook (`faultline chart-crds`, carried
    out here by the session's fake kubelet) does: a CRD an older version left (no printer columns) has
    this version's spec after `helm upgrade`."""
    ext = kube.client.extensions(api)
    name = "remediationrequests.faultline.io"
    ns, release = f"chart-{uuid.uuid4().hex[:6]}", f"c{uuid.uuid4().hex[:5]}"
    install = ["--namespace", ns, "--set", f"image.digest={DIGEST}"]
    wanted = yaml.safe_load((CHART / "crds" / "remediationrequests.yaml").read_text())["spec"]
    try:
        _helm(cluster.kubeconfig, "install", release, str(CHART), "--create-namespace", *install)
        live = ext.read_custom_resource_definition(name)
        live.spec.versions[0].additional_printer_columns = None  # as an older chart had it
        ext.replace_custom_resource_definition(name, live)
        assert not ext.read_custom_resource_definition(name).spec.versions[0].additional_printer_columns
        _helm(cluster.kubeconfig, "upgrade", release, str(CHART), *install)
        columns = ext.read_custom_resource_definition(name).spec.versions[0].additional_printer_columns
        assert [c.name for c in columns] == [
            c["name"] for c in wanted["versions"][0]["additionalPrinterColumns"]
        ]
        assert kube.resources.apply_crds(api) == {name: "current"}  # nothing left to do
    finally:
        kube.resources.apply_crds(api)  # the session's other tests keep this version's CRD
        subprocess.run([str(tools.binary("helm")), "--kubeconfig", str(cluster.kubeconfig), "uninstall", release,
                        "--namespace", ns], capture_output=True, check=False, timeout=60)  # fmt: skip
        with contextlib.suppress(Exception):
            kube.core(api).delete_namespace(ns, propagation_policy="Background")


def test_the_agent_lands_on_gpu_nodes_with_or_without_gpu_feature_discovery(
    cluster: LocalCluster, api: Any
) -> None:
    """Placement by the real DaemonSet controller and scheduler: a node GPU Feature Discovery labelled, a
    GKE GPU node and an EKS Auto Mode GPU node (no GFD) get an agent; a CPU node does not. A nodeSelector
    of the user's decides alone."""
    core = kube.core(api)
    tag = uuid.uuid4().hex[:5]
    kinds_of = {
        f"gfd-{tag}": {"nvidia.com/gpu.present": "true"},
        f"gke-{tag}": {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
        f"eks-{tag}": {"eks.amazonaws.com/instance-gpu-count": "8"},
        f"cpu-{tag}": {"node.kubernetes.io/instance-type": "m7i.4xlarge"},
    }
    ns, release = f"chart-{uuid.uuid4().hex[:6]}", f"p{tag}"
    try:
        for name, labels in kinds_of.items():  # simulated (Ready, their pods run and stop), relabelled
            cluster.fakelet.add(name)
            gpu = {
                k: None
                for k in kube.nodes.read(api, name)["metadata"]["labels"]
                if k.startswith("nvidia.com/")
            }
            kube.nodes.patch(api, name, {"metadata": {"labels": {**gpu, **labels}}})
        _helm(cluster.kubeconfig, "install", release, str(CHART), "--namespace", ns, "--create-namespace",
              "--set", f"image.digest={DIGEST}", "--set", "store.external.uri=mongodb://m:27017")  # fmt: skip

        def placed() -> set[str]:
            pods = core.list_namespaced_pod(ns, label_selector="app.kubernetes.io/component=agent").items
            out = set()
            for pod in [p for p in pods if not p.metadata.deletion_timestamp]:  # pinned by a matchFields term
                for term in pod.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms:
                    out |= {v for f in term.match_fields or [] for v in f.values}
            return out & set(kinds_of)

        procs.wait_for(
            "agents on the three GPU nodes",
            lambda: placed() == {f"gfd-{tag}", f"gke-{tag}", f"eks-{tag}"},
            30,
        )
        _helm(cluster.kubeconfig, "upgrade", release, str(CHART), "--namespace", ns, "--set", f"image.digest={DIGEST}",
              "--set", "store.external.uri=mongodb://m:27017", "--set", f"agent.nodeSelector.kubernetes\\.io/hostname=cpu-{tag}")  # fmt: skip
        procs.wait_for("the user's nodeSelector alone", lambda: placed() == {f"cpu-{tag}"}, 30)
    finally:
        subprocess.run([str(tools.binary("helm")), "--kubeconfig", str(cluster.kubeconfig), "uninstall", release,
                        "--namespace", ns], capture_output=True, check=False, timeout=60)  # fmt: skip
        with contextlib.suppress(Exception):
            core.delete_namespace(ns, propagation_policy="Background")
        for name in kinds_of:
            cluster.fakelet.remove(name)


def test_the_agent_steps_aside_while_the_driver_is_replaced_or_a_gpu_reset(
    cluster: LocalCluster, api: Any
) -> None:
    """A process that holds the GPUs' device nodes keeps the driver's module loaded (the GPU Operator's
    upgrade then waits for it: it deletes only pods that request GPUs) and a GPU from being reset. The
    agent requests none, so it leaves by itself: the real DaemonSet controller takes its pod off a node
    whose driver upgrade is between pod deletion and validation, or whose GPUs the janitor resets, and
    brings it back after; nothing of the agent runs there meanwhile, so nothing holds a device or reports
    the driver's absence as a fault."""
    core = kube.core(api)
    tag = uuid.uuid4().hex[:5]
    node, ns, release = f"upg-{tag}", f"chart-{tag}", f"u{tag}"
    cluster.fakelet.add(node)
    upgrade = "nvidia.com/gpu-driver-upgrade-state"

    def agent_pods() -> list[str]:
        pods = core.list_namespaced_pod(ns, label_selector="app.kubernetes.io/component=agent").items
        return [
            p.metadata.name for p in pods if p.spec.node_name == node and not p.metadata.deletion_timestamp
        ]

    def label(key: str, value: str | None) -> None:
        kube.nodes.patch(api, node, {"metadata": {"labels": {key: value}}})

    try:
        # a short grace: the DaemonSet controller makes a node's next pod once the terminating one is gone
        _helm(cluster.kubeconfig, "install", release, str(CHART), "--namespace", ns, "--create-namespace",
              "--set", f"image.digest={DIGEST}", "--set", "store.external.uri=mongodb://m:27017",
              "--set", "agent.terminationGracePeriodSeconds=2")  # fmt: skip
        procs.wait_for("an agent on the node", lambda: len(agent_pods()) == 1, 30)
        first = agent_pods()
        for state in ("upgrade-required", "cordon-required", "wait-for-jobs-required"):  # GPUs still in use
            label(upgrade, state)
        time.sleep(3)
        assert agent_pods() == first
        label(upgrade, "pod-deletion-required")
        procs.wait_for("the agent gone before the driver goes", lambda: not agent_pods(), 30)
        for state in ("drain-required", "pod-restart-required", "validation-required"):
            label(upgrade, state)
            time.sleep(1)
            assert not agent_pods(), state
        label(upgrade, "uncordon-required")
        procs.wait_for("back once the new driver is validated", lambda: len(agent_pods()) == 1, 60)
        assert agent_pods() != first
        label(upgrade, "upgrade-done")
        label("faultline.io/gpu-clients", "paused")  # the janitor's GPU reset
        procs.wait_for("gone for the reset", lambda: not agent_pods(), 30)
        label("faultline.io/gpu-clients", None)
        procs.wait_for("back after it", lambda: len(agent_pods()) == 1, 60)
    finally:
        subprocess.run([str(tools.binary("helm")), "--kubeconfig", str(cluster.kubeconfig), "uninstall", release,
                        "--namespace", ns], capture_output=True, check=False, timeout=60)  # fmt: skip
        with contextlib.suppress(Exception):
            core.delete_namespace(ns, propagation_policy="Background")
        cluster.fakelet.remove(node)


def test_the_install_labels_its_namespaces_for_pod_security_and_keeps_a_choice_made(
    cluster: LocalCluster, api: Any
) -> None:
    """The pre-install hook labels the release's namespace (made by --create-namespace, unlabelled) and
    the repair Jobs' one for the privileged Pod Security level; a label someone set is kept."""
    core = kube.core(api)
    tag = uuid.uuid4().hex[:5]
    ns, jobs, release = f"ns-{tag}", f"jobs-{tag}", f"n{tag}"
    chosen = {"pod-security.kubernetes.io/enforce": "baseline"}
    core.create_namespace({"metadata": {"name": jobs, "labels": chosen}})
    try:
        _helm(cluster.kubeconfig, "install", release, str(CHART), "--namespace", ns, "--create-namespace",
              "--set", f"image.digest={DIGEST}", "--set", "janitor.enabled=true", "--set", f"janitor.namespace={jobs}")  # fmt: skip
        labels = core.read_namespace(ns).metadata.labels
        assert {k: v for k, v in labels.items() if k.startswith("pod-security")} == {
            "pod-security.kubernetes.io/enforce": "privileged", "pod-security.kubernetes.io/audit": "privileged",
            "pod-security.kubernetes.io/warn": "privileged",
        }  # fmt: skip
        labels = core.read_namespace(jobs).metadata.labels
        assert labels["pod-security.kubernetes.io/enforce"] == "baseline"  # someone's choice, kept
        assert labels["pod-security.kubernetes.io/warn"] == "privileged"
    finally:
        subprocess.run([str(tools.binary("helm")), "--kubeconfig", str(cluster.kubeconfig), "uninstall", release,
                        "--namespace", ns], capture_output=True, check=False, timeout=60)  # fmt: skip
        for name in (ns, jobs):
            with contextlib.suppress(Exception):
                core.delete_namespace(name, propagation_policy="Background")


def test_an_upgrade_from_a_chart_that_rendered_its_secrets_keeps_them(
    cluster: LocalCluster, api: Any, tmp_path: Path
) -> None:
    """Charts before the Secrets hook rendered the store's and the evidence Secrets themselves, so they
    belong to the release, and `helm upgrade` deletes what the new manifest lacks. The hook marks them
    `helm.sh/resource-policy: keep` first: the upgrade leaves them, with their values."""
    old = tmp_path / "faultline"
    shutil.copytree(CHART, old, symlinks=False)
    (old / "templates" / "secrets.yaml").unlink()
    (old / "templates" / "old-secrets.yaml").write_text(
        "{{- $n := include \"faultline.name\" . -}}\n"
        "apiVersion: v1\nkind: Secret\nmetadata: {name: '{{ $n }}-store', namespace: '{{ .Release.Namespace }}'}\n"
        "stringData: {username: faultline, password: old-password-of-the-volume-0123,\n"
        "  uri: 'mongodb://faultline:old-password-of-the-volume-0123@{{ $n }}-ferretdb.{{ .Release.Namespace }}.svc:27017/'}\n"
        "---\napiVersion: v1\nkind: Secret\nmetadata: {name: '{{ $n }}-evidence', namespace: '{{ .Release.Namespace }}'}\n"
        "stringData: {key: the-old-evidence-key-0123456789-0123456789-0123456789-0123456789}\n"
    )  # fmt: skip
    ns, release = f"chart-{uuid.uuid4().hex[:6]}", f"o{uuid.uuid4().hex[:5]}"
    core = kube.core(api)
    install = ["--namespace", ns, "--set", f"image.digest={DIGEST}"]
    try:
        _helm(cluster.kubeconfig, "install", release, str(old), "--create-namespace", *install)
        assert ("Secret", f"{release}-store") in _manifest(cluster.kubeconfig, release, ns)
        _helm(cluster.kubeconfig, "upgrade", release, str(CHART), *install)
        assert ("Secret", f"{release}-store") not in _manifest(cluster.kubeconfig, release, ns)
        secret = core.read_namespaced_secret(f"{release}-store", ns)
        assert base64.b64decode(secret.data["password"]).decode() == "old-password-of-the-volume-0123"
        assert secret.metadata.annotations["helm.sh/resource-policy"] == "keep"
        # the URI is rewritten from the stored password (the chart's current form of it)
        assert (
            base64.b64decode(secret.data["uri"])
            .decode()
            .startswith(
                f"mongodb://faultline:old-password-of-the-volume-0123@{release}-ferretdb.{ns}.svc:27017/?authMechanism=PLAIN"
            )
        )
        key = base64.b64decode(core.read_namespaced_secret(f"{release}-evidence", ns).data["key"]).decode()
        assert key.startswith("the-old-evidence-key")
    finally:
        subprocess.run([str(tools.binary("helm")), "--kubeconfig", str(cluster.kubeconfig), "uninstall", release,
                        "--namespace", ns], capture_output=True, check=False, timeout=60)  # fmt: skip
        with contextlib.suppress(Exception):
            core.delete_namespace(ns, propagation_policy="Background")


def test_helm_install_of_the_analyzer_and_its_packs(cluster: LocalCluster, api: Any, tmp_path: Path) -> None:
    """analyzer.enabled installed into the local API server (which validates every object and authorizes
    with RBAC): the Deployment, its packs' ConfigMap, the agents' feed switched on; its ServiceAccount may
    list Nodes and Pods and do nothing else asked; an upgrade with the analyzer off takes all of it away again and
    switches the agents' feed off."""
    ns, release = f"chart-{uuid.uuid4().hex[:6]}", f"a{uuid.uuid4().hex[:5]}"
    core, apps = kube.core(api), kube.client.apps(api)
    values = _analyzer_values(tmp_path, replicas=2, packs={"gpu.yaml": ANALYZER_PACK})
    install = ["--namespace", ns, "--set", "networkPolicy.enabled=true", "--set", f"image.digest={DIGEST}"]

    def agent_settings() -> dict[str, Any]:
        found = core.read_namespaced_config_map(f"{release}-agent-config", ns)
        return yaml.safe_load(found.data["config.yaml"])  # type: ignore[no-any-return]

    try:
        _helm(
            cluster.kubeconfig,
            "install",
            release,
            str(CHART),
            "--create-namespace",
            *install,
            "-f",
            str(values),
        )
        name = f"{release}-analyzer"
        made = _manifest(cluster.kubeconfig, release, ns)
        assert {("Deployment", name), ("ServiceAccount", name), ("ClusterRole", name),
                ("ClusterRoleBinding", name), ("ConfigMap", f"{name}-config"), ("ConfigMap", f"{name}-packs"),
                ("NetworkPolicy", name)} <= made  # fmt: skip
        assert not {n for _, n in made if n.startswith(f"{name}-events")}
        deployment = apps.read_namespaced_deployment(name, ns)
        assert deployment.spec.replicas == 2
        assert deployment.spec.template.spec.service_account_name == name
        assert deployment.spec.template.spec.containers[0].image == f"ghcr.io/faultline/faultline@{DIGEST}"
        packs = core.read_namespaced_config_map(f"{name}-packs", ns)
        assert packs.data == {"gpu.yaml": ANALYZER_PACK}
        analyzer_file = yaml.safe_load(
            core.read_namespaced_config_map(f"{name}-config", ns).data["config.yaml"]
        )
        assert analyzer_file["packs"] == ["/etc/faultline/packs/values"]
        assert agent_settings()["analyzer_feed"] is True

        user, groups = kube.access.service_account(ns, name)

        def may(verb: str, resource: str, group: str = "", namespace: str = "") -> bool:
            return kube.access.allowed(api, user, groups, verb=verb, resource=resource, group=group,
                                       namespace=namespace)  # fmt: skip

        procs.wait_for(
            "the analyzer's RBAC in effect", lambda: may("list", "nodes") and may("list", "pods"), 30
        )
        refused = [("get", "nodes", "", ""), ("watch", "nodes", "", ""), ("patch", "nodes", "", ""),
                   ("create", "events", "events.k8s.io", "default"), ("delete", "pods", "", ""),
                   ("get", "configmaps", "", ns), ("create", "leases", "coordination.k8s.io", ns)]  # fmt: skip
        assert [q for q in refused if may(*q)] == []

        _helm(cluster.kubeconfig, "upgrade", release, str(CHART), *install)  # the analyzer off again
        made = _manifest(cluster.kubeconfig, release, ns)
        assert not {n for _, n in made if n.startswith(name)}
        assert "analyzer_feed" not in agent_settings()
        procs.wait_for("the analyzer's RBAC gone", lambda: not may("list", "nodes"), 30)
    finally:
        subprocess.run([str(tools.binary("helm")), "--kubeconfig", str(cluster.kubeconfig), "uninstall", release,
                        "--namespace", ns, "--no-hooks"], capture_output=True, check=False, timeout=60)  # fmt: skip
        with contextlib.suppress(Exception):
            core.delete_namespace(ns, propagation_policy="Background")


def _apply_identities(api: Any, docs: list[dict[str, Any]]) -> None:
    """The chart's ServiceAccounts and RBAC (its workloads need images this machine cannot run)."""
    core, rbac = kube.core(api), kube.rbac(api)
    create = {
        "ServiceAccount": lambda d: core.create_namespaced_service_account(d["metadata"]["namespace"], d),
        "ClusterRole": rbac.create_cluster_role, "ClusterRoleBinding": rbac.create_cluster_role_binding,
        "Role": lambda d: rbac.create_namespaced_role(d["metadata"]["namespace"], d),
        "RoleBinding": lambda d: rbac.create_namespaced_role_binding(d["metadata"]["namespace"], d),
    }  # fmt: skip
    for doc in docs:
        if doc["kind"] in create:
            # made already by an earlier test in this session
            with contextlib.suppress(ConflictError), kube.client.translated("create", doc["kind"]):
                create[doc["kind"]](doc)


def _repair_progress(api: Any, db: Any, cluster: LocalCluster, node: str) -> str:
    """The node's drain and repair documents in the store, the janitor's Jobs and their pods (with when
    each was made), and the simulated kubelet's state: where a repair stopped, and how long each step
    took."""
    drains = list(db[store.Work.DRAINS].find({"_id": node}))
    repairs = list(db[store.Work.REPAIRS].find({"node": node}))
    jobs = [(j["metadata"]["name"], j["metadata"].get("creationTimestamp"), j.get("status"))
            for j in kube.jobs.list_all(api, NS)]  # fmt: skip
    pods = [(p["metadata"]["name"], p["metadata"].get("creationTimestamp"), p["spec"].get("nodeName"),
             (p.get("status") or {}).get("phase"), p["metadata"].get("labels"))
            for p in kube.pods.list_all(api, field_selector=f"metadata.namespace={NS}")]  # fmt: skip
    fakelet, now = cluster.fakelet, time.monotonic()
    return (
        f"now: {dt.datetime.now(dt.UTC).isoformat()}\ndrain: {drains}\nrepairs: {repairs}\njobs: {jobs}\n"
        f"pods: {pods}\nfakelet: errors {fakelet.errors}, loop running {fakelet.running}, "
        f"last pass {now - fakelet.last_pass:.1f} s ago, reboots of {node} "
        f"{[f'{now - t:.1f} s ago' for n, t in fakelet.reboots if n == node]}"
    )


def test_the_charts_rbac_carries_a_repair_end_to_end(
    cluster: LocalCluster, api: Any, mongo_db: Any, namespace: str
) -> None:
    """Every component as its chart ServiceAccount: the agent's calls, then a fault through quarantine,
    drain, remediation and a janitor reboot Job to uncordon."""
    core = kube.core(api)
    with contextlib.suppress(ConflictError), kube.client.translated("create", f"Namespace {NS}"):
        core.create_namespace({"metadata": {"name": NS}})
    kube.resources.ensure_crds(api)
    _apply_identities(api, render(*ALL_ON, EXTERNAL))
    as_sa = {w: cluster.service_account_kubeconfig(NS, f"fl-{w}") for w in ("agent", *WORKERS)}
    node = cluster.node_names[3]

    # the agent: read its Node, patch a condition, post an Event (its three calls)
    agent = lite.Client.connect(as_sa["agent"])
    try:
        lite.read_node_status(agent, node)
        lite.patch_node_conditions(agent, node, [{"type": "ChartRbacCheck", "status": "True", "reason": "Ok",
                                                   "message": "agent RBAC"}], [])  # fmt: skip
        lite.post_node_event(agent, node, reason="ChartRbacCheck", note="agent RBAC", action="Check",
                             warning=False, controller="faultline.io/agent", instance="test")  # fmt: skip
    finally:
        agent.close()
    assert kube.nodes.conditions(api, node)["ChartRbacCheck"]["status"] == "True"
    kube.nodes.write_conditions(api, node, [], ["ChartRbacCheck"])

    clients = {w: kube.api_client(path) for w, path in as_sa.items() if w != "agent"}
    with pytest.raises(ForbiddenError) as refused:  # the drainer may not cordon
        kube.nodes.patch(clients["drain"], node, {"spec": {"unschedulable": True}})
    assert refused.value.status == 403
    with pytest.raises(ForbiddenError) as refused:  # the janitor runs Jobs only in its own namespace
        kube.jobs.create(clients["janitor"], "default", {"metadata": {"name": "x"}, "spec": {
            "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "x", "image": "x"}]}}}})  # fmt: skip
    assert refused.value.status == 403

    core.create_namespaced_pod(namespace, pod("victim", node))
    procs.wait_for(
        "pod running", lambda: core.read_namespaced_pod("victim", namespace).status.phase == "Running", 20
    )
    st = store.Store(mongo_db)
    st.ensure_indexes()
    fault = _fault(node, "XID-79", Action.RESTART_BM)
    fast = {"lease": dt.timedelta(seconds=3), "threads": 2}
    workers: list[Any] = [
        quarantine.QuarantineWorker(st, clients["quarantine"], quarantine.Settings(
            hold_down=dt.timedelta(seconds=0.5), resync_interval=0.3,
            breaker=breaker.BreakerConfig(max_share=None, max_count=None), **fast), "q"),
        drainer.Drainer(st, clients["drain"], drainer.Settings(poll=0.3, resync_interval=0.3, **fast), "d"),
        remediation.Remediation(st, clients["remediation"], remediation.Settings(resync_interval=0.3, **fast), "r"),
        janitor.Janitor(st, clients["janitor"], janitor.Settings(
            namespace=NS, service_account="fl-repair", poll=0.3, reboot_timeout=dt.timedelta(seconds=30),
            validate_timeout=dt.timedelta(seconds=20), **fast), "j"),
    ]  # fmt: skip
    before = cluster.fakelet.nodes[node].boot_id
    users_request = f"chart-rbac-{namespace}"
    try:
        for w in workers:
            w.start()
        started = dt.datetime.now(dt.UTC).replace(microsecond=0)  # the API server's times are in seconds
        st.write_fault(fault, 1)
        procs.wait_for("cordoned", lambda: bool(core.read_node(node).spec.unschedulable), 15)
        procs.wait_for("drained", lambda: pods_on(api, namespace, node) == [], 30)
        try:  # two steps, each with its own time: the Job made (claims, leases), then its pod run
            procs.wait_for("the repair Job", lambda: any(  # made by this test (the namespace is shared)
                dt.datetime.fromisoformat(j["metadata"]["creationTimestamp"]) >= started
                for j in kube.jobs.list_all(api, NS, label_selector=f"faultline.io/node={node}")), 45)  # fmt: skip
            procs.wait_for("rebooted by the Job", lambda: cluster.fakelet.nodes[node].boot_id != before, 30)
        except TransientError as exc:  # what the repair got to, for a failure that only a loaded run shows
            raise AssertionError(f"{exc}\n{_repair_progress(api, mongo_db, cluster, node)}") from exc
        st.write_fault(
            fault.model_copy(update={"state": FaultState.RESOLVED, "resolved_at": dt.datetime.now(dt.UTC)}), 2
        )
        procs.wait_for("uncordoned", lambda: not core.read_node(node).spec.unschedulable, 30)
        repair = mongo_db["repairs"].find_one({"node": node})
        assert [r["outcome"] for r in repair["rounds"]] == ["Succeeded"]
        # a person's request: the janitor lists, adopts, cordons, reboots, uncordons as its identity
        rebooted = cluster.fakelet.nodes[node].boot_id
        kube.resources.create_request(api, {"apiVersion": kube.resources.RR_API_VERSION,
                                            "kind": "RemediationRequest", "metadata": {"name": users_request},
                                            "spec": {"node": node, "action": "REBOOT"}})  # fmt: skip
        procs.wait_for("the person's request carried out", lambda: (
            kube.resources.get_request(api, users_request).get("status") or {}).get("phase") == "Succeeded", 40)  # fmt: skip
        assert cluster.fakelet.nodes[node].boot_id != rebooted
        procs.wait_for("its cordon taken back", lambda: not core.read_node(node).spec.unschedulable, 10)
        errors = sum(w.metrics.actions.labels(result="error")._value.get() for w in workers)
        assert errors == 0  # no call was refused on the way
    finally:
        for w in workers:
            w.halt()
        core.patch_node(node, {"spec": {"unschedulable": None}})
        with contextlib.suppress(NotFoundError), kube.client.translated("delete", users_request):
            kube.custom(api).delete_cluster_custom_object("faultline.io", "v1alpha1", "remediationrequests",
                                                          users_request)  # fmt: skip
        kube.resources.delete_requests(
            api, label_selector=f"faultline.io/node={node}"
        )  # the node is shared with other tests of the session


def test_an_empty_breaker_limit_turns_it_off() -> None:
    """values.yaml says "" turns a breaker limit off: the settings file must say null, not leave the key
    out (the model's default share, 0.1, would then apply)."""
    from faultline.config import QuarantineConfig  # noqa: PLC0415

    def breaker_limits(*sets: str) -> tuple[Any, Any]:
        settings = settings_files(render("quarantine.enabled=true", *sets))["quarantine"]
        config = QuarantineConfig.model_validate({**settings, "mongodb_uri": "mongodb://mongo:27017"})
        return config.breaker_max_share, config.breaker_max_count

    assert breaker_limits() == (0.1, None)  # the default share; no count limit
    assert breaker_limits("quarantine.breaker.maxShare=", "quarantine.breaker.maxCount=20") == (None, 20)


def test_the_breakers_cap_and_the_repair_caps_reach_the_workers() -> None:
    """The cap on nodes held at once ("" and 0 turn it off) and the janitor's caps on repairs in flight
    flow from the values into each worker's settings; an older values file's `cooldown` still installs."""
    from faultline.config import JanitorConfig, QuarantineConfig  # noqa: PLC0415

    def quarantine_caps(*sets: str) -> tuple[Any, Any]:
        settings = settings_files(render("quarantine.enabled=true", *sets))["quarantine"]
        config = QuarantineConfig.model_validate({**settings, "mongodb_uri": "mongodb://mongo:27017"})
        assert quarantine.Settings.from_config(config).breaker.max_held == (config.breaker_max_held or None)
        return config.breaker_max_held_share, config.breaker_max_held

    assert quarantine_caps() == (0.1, 50)
    assert quarantine_caps("quarantine.breaker.maxHeldShare=", "quarantine.breaker.maxHeld=0") == (None, 0)
    assert quarantine_caps("quarantine.breaker.cooldown=15m", "quarantine.breaker.maxHeld=7") == (0.1, 7)
    settings = settings_files(render("janitor.enabled=true", "janitor.maxRepairsInFlight=4",
                                     "janitor.maxReplacementsInFlight=1"))["janitor"]  # fmt: skip
    config = JanitorConfig.model_validate({**settings, "mongodb_uri": "mongodb://mongo:27017"})
    assert janitor.Settings.from_config(config, None).repair_caps == inflight.Caps(4, 1)


def test_the_install_and_upgrade_hooks_run_on_nodes_faultline_has_cordoned_or_tainted() -> None:
    """A pre-upgrade hook left Pending stops `helm upgrade`: where faultline holds every node a hook could run
    on (one GPU node, or a storm), the Secrets and CRD hooks must still land, as the uninstall hook does."""
    jobs = [
        d
        for d in render(*ALL_ON, "secretsHook.tolerations[0].key=site", "secretsHook.tolerations[0].operator=Exists",
                        hooks=True)
        if d["kind"] == "Job" and d["metadata"]["annotations"].get("helm.sh/hook", "").startswith("pre-")
    ]  # fmt: skip
    assert {d["metadata"]["name"] for d in jobs} == {"fl-secrets", "fl-crds"}
    for job in jobs:
        tolerated = {t["key"] for t in job["spec"]["template"]["spec"]["tolerations"]}
        assert tolerated == {"faultline.io/fault", "node.kubernetes.io/unschedulable", "site"}, job[
            "metadata"
        ]


def test_the_exporter_its_sinks_secrets_and_egress(tmp_path: Path) -> None:
    """The exporter's Deployment reads a settings file its model accepts, each sink's secret mounted where
    its setting points; it has a ServiceAccount with no token and no RBAC (it reads the store only), egress
    to its sinks under a NetworkPolicy, and is scraped with the rest."""
    from cli import settings  # noqa: PLC0415
    from faultline import config  # noqa: PLC0415

    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({
        "export": {"enabled": True, "cluster": "gpu-east", "sinks": [
            {"name": "events", "url": "https://events.example.com/in", "hmacSecret": {"name": "ev", "key": "hmac"},
             "filter": {"fatal": True}, "backoffMax": "1m"},
            {"name": "chat", "url": "https://hooks.example.com/x", "format": "webhook",
             "bearerTokenSecret": {"name": "chat-token", "key": "token"}, "filter": {"actions": ["CONTACT_SUPPORT"]}},
        ]},
        "networkPolicy": {"enabled": True}, "podMonitor": {"enabled": True},
    }))  # fmt: skip
    docs = render(values=values)
    file = tmp_path / "export.yaml"
    file.write_text(yaml.safe_dump(settings_files(docs)["export"]))
    cfg = settings.resolve(
        config.ExportConfig, config_file=file, environ={"MONGODB_URI": "mongodb://m:27017"}
    ).config
    assert isinstance(cfg, config.ExportConfig) and cfg.cluster == "gpu-east"
    events, chat = cfg.sinks
    assert (events.filter.fatal, events.backoff_max, str(events.hmac_secret_file)) == (
        True, dt.timedelta(minutes=1), "/etc/faultline/export/events-hmac/hmac"
    )  # fmt: skip
    assert (chat.format, str(chat.bearer_token_file), chat.filter.actions) == (
        "webhook", "/etc/faultline/export/chat-token/token", ["CONTACT_SUPPORT"]
    )  # fmt: skip
    pod = workloads(docs)["fl-export"]
    mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts["/etc/faultline/export/events-hmac"]]["secret"]["secretName"] == "ev"
    assert volumes[mounts["/etc/faultline/export/chat-token"]]["secret"]["items"] == [
        {"key": "token", "path": "token"}
    ]
    assert pod["containers"][0]["args"][0] == "export"
    account = next(d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == "fl-export")
    assert account["automountServiceAccountToken"] is False
    assert not any(d["metadata"]["name"] == "fl-export" for d in docs if d["kind"].endswith("RoleBinding"))
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "fl-export")
    assert {"ports": [{"port": 443, "protocol": "TCP"}]} in policy["spec"]["egress"]
    monitor = next(d for d in docs if d["kind"] == "PodMonitor")
    assert "export" in monitor["spec"]["selector"]["matchExpressions"][1]["values"]
    with pytest.raises(ValueError, match=r"export\.enabled needs at least one sink"):
        render("export.enabled=true")


def test_store_retention_runs_on_a_schedule_with_the_stores_uri_only(tmp_path: Path) -> None:
    """The retention CronJob (on by default: it deletes only history): `store retention` with its horizons
    in a settings file its model accepts, the store's URI, no API token, as the image's non-root user; a
    NetworkPolicy lets it reach the store; off, nothing of it is rendered."""
    from cli import settings  # noqa: PLC0415
    from faultline import config  # noqa: PLC0415

    docs = render("retention.healthEvents=3d", "retention.bugReports=30d", "retention.schedule=5 3 * * *",
                  "networkPolicy.enabled=true")  # fmt: skip
    (cron,) = [d for d in docs if d["kind"] == "CronJob"]
    assert (cron["metadata"]["name"], cron["spec"]["schedule"], cron["spec"]["concurrencyPolicy"]) == (
        "fl-retention", "5 3 * * *", "Forbid"
    )  # fmt: skip
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == ["store", "retention", "--config=/etc/faultline/config/config.yaml"]
    assert pod["automountServiceAccountToken"] is False and pod["securityContext"]["runAsNonRoot"] is True
    env = {e["name"]: e for e in container["env"]}
    assert env["MONGODB_URI"]["valueFrom"]["secretKeyRef"] == {"name": "fl-store", "key": "uri"}
    file = tmp_path / "retention.yaml"
    file.write_text(yaml.safe_dump(settings_files(docs)["retention"]))
    cfg = settings.resolve(
        config.RetentionConfig, config_file=file, environ={"MONGODB_URI": "mongodb://m"}
    ).config
    assert isinstance(cfg, config.RetentionConfig)
    assert (cfg.older_than, cfg.bug_reports_older_than) == (dt.timedelta(days=3), dt.timedelta(days=30))
    assert any(d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "fl-retention" for d in docs)
    assert not [d for d in render("retention.enabled=false") if "retention" in d["metadata"]["name"]]


def test_values_a_reuse_values_upgrade_lacks_render_with_those_features_off() -> None:
    """`helm upgrade --reuse-values` from a chart without the newer features' values: the templates read
    them guarded (the docs say --reset-then-reuse-values, which takes the new defaults)."""
    docs = render("alerts=null", "dashboard=null", "export=null", "retention=null", "janitor.bugReports=null",
                  "janitor.enabled=true", "networkPolicy.enabled=true")  # fmt: skip
    names = {d["metadata"]["name"] for d in docs}
    assert "fl-janitor" in names and not names & {"fl-export", "fl-retention", "fl-dashboard"}
    assert settings_files(docs)["janitor"]["bug_report_dir"] == "/var/lib/faultline/bug-reports"
    assert (
        settings_files(render("janitor.enabled=true", "janitor.bugReports=false"))["janitor"][
            "bug_report_dir"
        ]
        == ""
    )
    exporter = next(d for d in render("export.enabled=true", "export.sinks[0].name=s", "export.sinks[0].url=http://x")
                    if d["kind"] == "Deployment" and d["metadata"]["name"] == "fl-export")  # fmt: skip
    assert exporter["spec"]["strategy"] == {"type": "Recreate"}  # never two exporters at once
