"""The preflight admission webhook called by the real API server: `faultline webhook` runs on loopback
(the local API server runs on loopback too, so a MutatingWebhookConfiguration with a `url:` clientConfig
reaches it; pods of simulated nodes do not run, so the webhook cannot be one of them here).

- the webhook makes its CA and certificate in a Secret and sets the configuration's caBundle itself;
- a GPU pod created in a namespace labelled faultline.io/preflight=enabled gets the init container, one in
  an unlabelled namespace does not (the namespaceSelector; the webhook checks the label again), a pod
  without GPUs and an opted-out pod neither;
- a pod naming an unknown check is refused with the webhook's message;
- a serving certificate renewed while it serves (every sync here) keeps admissions going, signed by the
  same CA;
- the webhook down does not block pod creation under the default failurePolicy (Ignore);
- the chart's Secret, filled and renewed by the webhook, keeps Helm's labels and annotations."""

from __future__ import annotations

import contextlib
import datetime as dt
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from devtools import procs
from devtools.cluster import LocalCluster
from faultline import kube
from faultline.errors import ApiRejectedError, FaultlineError, NotFoundError
from faultline.kube import lite
from faultline.kube import preflight as ops
from workers import webhook_certs

pytestmark = pytest.mark.integration
MWC = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
IMAGE = "registry.local/faultline@sha256:" + "ab" * 32


def configuration(name: str, port: int, policy: str = "Ignore") -> dict[str, Any]:
    """What the chart's MutatingWebhookConfiguration says, with a url: clientConfig and no caBundle yet."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": "preflight.faultline.io",
                "clientConfig": {"url": f"https://127.0.0.1:{port}/mutate"},
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                        "scope": "Namespaced",
                    }
                ],
                "namespaceSelector": {"matchLabels": {"faultline.io/preflight": "enabled"}},
                "failurePolicy": policy,
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 5,
                "reinvocationPolicy": "Never",
                "matchPolicy": "Equivalent",
            }
        ],
    }


@contextlib.contextmanager
def running_webhook(
    cluster: LocalCluster, namespace: str, config: str, port: int, *extra: str
) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "faultline",
            "webhook",
            "--kubeconfig",
            str(cluster.kubeconfig),
            "--address",
            "127.0.0.1",
            "--port",
            str(port),
            "--namespace",
            namespace,
            "--service",
            "fl-webhook",
            "--hosts",
            "127.0.0.1",
            "--webhook-config",
            config,
            "--image",
            IMAGE,
            "--check-interval",
            "1s",
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    drain = None
    try:
        assert proc.stderr is not None
        seen = []  # its log lines come first (the certificates written, the caBundle set)
        while not (line := proc.stderr.readline()).startswith("webhook: serving"):
            seen.append(line)
            assert line, f"the webhook exited: {''.join(seen)}"
        assert line.startswith(f"webhook: serving https://127.0.0.1:{port}/mutate"), line
        stderr = proc.stderr  # drained from now on: a full pipe would stop the webhook mid-log-line
        drain = threading.Thread(target=lambda: seen.extend(stderr), daemon=True)
        drain.start()
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        if drain is not None:
            drain.join(10)  # the pipe ends with the process
        if proc.stderr is not None:
            proc.stderr.close()


def gpu_pod(name: str, gpus: int | None = 2, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return {
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "train", "image": "trainer:1", "resources": {"limits": limits}}],
        },
    }


def init_names(api: Any, namespace: str, name: str) -> list[str]:
    spec = kube.pods.read(api, namespace, name)["spec"]
    return [c["name"] for c in spec.get("initContainers") or []]


@pytest.fixture
def labelled(api: Any, namespace: str) -> Iterator[tuple[str, str]]:
    """(the test's namespace, labelled faultline.io/preflight=enabled; another one, not labelled)."""
    core = kube.core(api)
    core.patch_namespace(namespace, {"metadata": {"labels": {"faultline.io/preflight": "enabled"}}})
    other = f"{namespace[:50]}-off"
    core.create_namespace({"metadata": {"name": other}})
    procs.wait_for(
        "the namespace's default ServiceAccount",
        lambda: bool(core.read_namespaced_service_account("default", other)),
        30,
    )
    yield namespace, other
    core.delete_namespace(other, propagation_policy="Background")


def test_the_api_server_calls_the_webhook(cluster: LocalCluster, api: Any, labelled: tuple[str, str]) -> None:
    enabled, off = labelled
    client = lite.Client.connect(cluster.kubeconfig)
    name = f"fl-preflight-{uuid.uuid4().hex[:6]}"
    port = procs.free_port()
    client.request("POST", MWC, configuration(name, port))
    core = kube.core(api)
    try:
        with running_webhook(
            cluster, enabled, name, port, "--cert-validity", "1h", "--rotate-before", "3599s"
        ):
            procs.wait_for(
                "the caBundle set by the webhook", lambda: ops.webhook_ca_bundles(client, name)[0][0], 30
            )
            secret = ops.read_secret(client, enabled, "faultline-webhook-tls")
            assert secret is not None
            assert ops.webhook_ca_bundles(client, name)[0] == [secret[0]["ca.crt"]]

            core.create_namespaced_pod(enabled, gpu_pod("train-0"))
            assert init_names(api, enabled, "train-0") == ["faultline-preflight"]
            init = kube.pods.read(api, enabled, "train-0")["spec"]["initContainers"][0]
            assert init["image"] == IMAGE and init["args"] == ["preflight"]
            assert init["resources"]["limits"]["nvidia.com/gpu"] == "2"
            env = {e["name"]: e for e in init["env"]}
            assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"

            core.create_namespaced_pod(off, gpu_pod("train-0"))  # not labelled: never asked
            assert init_names(api, off, "train-0") == []
            core.create_namespaced_pod(enabled, gpu_pod("web", gpus=None))  # no GPU
            assert init_names(api, enabled, "web") == []
            core.create_namespaced_pod(
                enabled, gpu_pod("out", annotations={"faultline.io/preflight": "false"})
            )
            assert init_names(api, enabled, "out") == []

            with pytest.raises(ApiRejectedError) as refused, kube.client.translated("create", "Pod bad"):
                core.create_namespaced_pod(
                    enabled, gpu_pod("bad", annotations={"faultline.io/preflight-checks": "ecc,ecx"})
                )
            assert "unknown check 'ecx'; valid checks: count, remap, ecc, nvlink, pcie, xid, dcgm" in str(
                refused.value
            )
            with pytest.raises(NotFoundError), kube.client.translated("get", "Pod bad"):
                core.read_namespaced_pod("bad", enabled)

            # renewed at every sync (less than rotate_before left of it), served without a restart
            first = x509.load_pem_x509_certificate(secret[0]["tls.crt"]).serial_number

            def renewed() -> bool:
                now = ops.read_secret(client, enabled, "faultline-webhook-tls")
                return (
                    now is not None
                    and x509.load_pem_x509_certificate(now[0]["tls.crt"]).serial_number != first
                )

            procs.wait_for("a renewed serving certificate", renewed, 30)
            after = ops.read_secret(client, enabled, "faultline-webhook-tls")
            assert after is not None and after[0]["ca.crt"] == secret[0]["ca.crt"]  # the same CA
            procs.wait_for("the webhook serving it", lambda: _admits(api, enabled), 30)

        # the webhook is down: pods are created (failurePolicy Ignore), without the init container
        core.create_namespaced_pod(enabled, gpu_pod("while-down"))
        assert init_names(api, enabled, "while-down") == []
    finally:
        with contextlib.suppress(NotFoundError):
            client.request("DELETE", f"{MWC}/{name}")
        client.close()


_ADMITTED: list[int] = []


def _admits(api: Any, namespace: str) -> bool:
    """A new pod gets the init container (the webhook answered over TLS with its current certificate)."""
    name = f"later-{len(_ADMITTED)}"
    _ADMITTED.append(1)
    kube.core(api).create_namespaced_pod(namespace, gpu_pod(name))
    return init_names(api, namespace, name) == ["faultline-preflight"]


def test_a_fail_policy_blocks_pods_while_the_webhook_is_down(
    cluster: LocalCluster, api: Any, labelled: tuple[str, str]
) -> None:
    """failurePolicy Fail (the chart's preflight.failurePolicy) is what makes preflight mandatory: with the
    webhook away, a GPU pod in an enabled namespace is refused, one elsewhere is not."""
    enabled, off = labelled
    client = lite.Client.connect(cluster.kubeconfig)
    name = f"fl-preflight-{uuid.uuid4().hex[:6]}"
    client.request(
        "POST", MWC, configuration(name, procs.free_port(), policy="Fail")
    )  # nothing listens there
    try:
        with pytest.raises(FaultlineError) as refused, kube.client.translated("create", "Pod p"):
            kube.core(api).create_namespaced_pod(enabled, gpu_pod("p"))
        assert "preflight.faultline.io" in str(refused.value)
        kube.core(api).create_namespaced_pod(off, gpu_pod("p"))
    finally:
        with contextlib.suppress(NotFoundError):
            client.request("DELETE", f"{MWC}/{name}")
        client.close()


def test_the_charts_secret_stays_the_releases_when_the_webhook_writes_it(
    cluster: LocalCluster, namespace: str
) -> None:
    """The chart makes the webhook's TLS Secret empty, as Helm's (its managed-by label and release
    annotations); the webhook fills it and renews it by replacing it. Helm 4 deletes at uninstall only what
    still carries those, so a replacement keeps the Secret's metadata: once without it, the Secret
    outlived every `helm uninstall` and a new install into the namespace refused to take it over. A Secret
    the webhook makes itself (no chart) is labelled as faultline's."""
    ours = {"labels": {"app.kubernetes.io/managed-by": "Helm", "app.kubernetes.io/instance": "fl"},
            "annotations": {"meta.helm.sh/release-name": "fl", "meta.helm.sh/release-namespace": namespace}}  # fmt: skip
    client = lite.Client.connect(cluster.kubeconfig)
    try:
        client.request("POST", f"/api/v1/namespaces/{namespace}/secrets",
                       {"metadata": {"name": "fl-webhook-tls", **ours}, "type": "Opaque"})  # fmt: skip

        def keeper(secret: str, days: int = 0) -> webhook_certs.Keeper:
            now = dt.datetime.now(dt.UTC) + dt.timedelta(days=days)
            return webhook_certs.Keeper(
                client, namespace=namespace, secret=secret, webhook_config=None,
                hosts=webhook_certs.service_hosts("fl-webhook", namespace), validity=webhook_certs.Validity(),
                clock=lambda: now,
            )  # fmt: skip

        first = keeper("fl-webhook-tls").sync()
        renewed = keeper("fl-webhook-tls", days=340).sync()  # less than rotate_before (30 d) left of 365 d
        assert renewed.cert != first.cert and renewed.ca_cert == first.ca_cert
        found = ops.read_secret(client, namespace, "fl-webhook-tls")
        assert found is not None and found.data["tls.crt"] == renewed.cert
        assert {k: found.metadata.get(k) for k in ours} == ours  # Helm's still, after two writes

        keeper("standalone-tls").sync()
        own = ops.read_secret(client, namespace, "standalone-tls")
        assert own is not None and own.metadata["labels"] == {"app.kubernetes.io/managed-by": "faultline"}
    finally:
        client.close()


def test_bad_webhook_settings_are_refused_by_name(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "faultline", "webhook", "--image", "x", "--tls-source", "files"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2
    assert "tls_source files needs tls_cert and tls_key" in out.stderr
