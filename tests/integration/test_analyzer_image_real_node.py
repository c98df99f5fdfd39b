"""The analyzer image (`make image-analyzer`: the project's image and the faultline[anomaly] extra) as a
real pod: `helm install oci://<loopback registry>/faultline` with `analyzer.enabled`,
`analyzer.anomaly.enabled` and `analyzer.image` (the image pushed by digest, signed and its SBOM attested
by `LocalRegistry.push_analyzer_image`, built first when it is not of HEAD) into the local cluster with a
real kubelet node, the session's FerretDB as the store, the agent off.

The analyzer's pod runs the analyzer image on the real node, becomes Ready and is never restarted (with
the one image it stopped at its start: river missing), and scores: a GPU's health samples, written
through the store as an agent with health_samples and analyzer_feed writes them (`Store.record_batch`),
raise GPU-ANOMALY-ECC-SBE-VOLATILE on the GPU's UUID once its correctable-ECC counter climbs, non-fatal
with action NONE, counted by the pod's faultline_analyzer_derived_faults_total{pattern="gpu-anomaly"}.
`helm uninstall` then leaves the real node as it was.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from devtools import oci, procs
from devtools.cluster import LocalCluster
from devtools.mongo import LocalMongo
from faultline import kube, store
from faultline.errors import TransientError
from faultline.models import Action, Component, Entity, HealthEvent, event_id, fault_id
from tests.integration import chartutil
from tests.integration.chartutil import NODE

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(900),  # the first real-node test starts the cluster; the analyzer image may be built
    pytest.mark.skipif(os.geteuid() != 0, reason="real nodes need root (CI runs as root)"),
]
RELEASE = "fla"
WARMUP = 15  # the GPU's learned samples before it may raise (anomaly_warmup)
CODE = "GPU-ANOMALY-ECC-SBE-VOLATILE"
METRICS_PORT = 9400  # the chart's metrics.port


def _sample(node: str, gpu: str, at: dt.datetime, ecc: int) -> HealthEvent:
    """The GPU's health sample as an agent with health_samples writes it: its correctable-ECC counter."""
    return HealthEvent(
        id=event_id(node, "sim", "GPU", "0000:3b:00", "GPU-HEALTH-SAMPLE", at), node=node,
        component=Component.GPU, check="gpu-health-sample", code="GPU-HEALTH-SAMPLE",
        entities=(Entity(type="GPU", id="0000:3b:00"),), healthy=True, fatal=False, action=Action.NONE,
        metadata={"gpu_uuid": gpu, "boot_id": "boot-1", "ecc_sbe_volatile": str(ecc)}, generated_at=at,
        observed_at=at,
    )  # fmt: skip


def _samples(text: str, name: str) -> dict[str, float]:
    """One metric's samples from a Prometheus text page, by their labels (`name=value,...`, sorted)."""
    return {",".join(f"{k}={v}" for k, v in sorted(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples if s.name == name}  # fmt: skip


def _metrics(pod: dict[str, Any]) -> str:
    with urllib.request.urlopen(f"http://{pod['status']['podIP']}:{METRICS_PORT}/metrics", timeout=5) as page:
        return str(page.read().decode())


@pytest.mark.usefixtures("sim_nodes_cordoned")
def test_the_analyzer_image_runs_the_anomaly_scores_as_a_real_pod(
    real_cluster: LocalCluster, real_store: str, store_db: tuple[str, Any], helm_env: dict[str, str],
    mongo: LocalMongo, tmp_path: Path,
) -> None:  # fmt: skip
    real = real_cluster.real
    assert real is not None
    started = time.monotonic()
    seconds: dict[str, float] = {}
    image = real.registry.push_analyzer_image()  # built here when it is not of HEAD
    seconds["analyzer image pushed"] = time.monotonic() - started
    repository, _, digest = image.partition("@")
    api = real_cluster.api()
    core = kube.core(api)
    database, db = store_db
    suffix = uuid.uuid4().hex[:6]
    ns, node, gpu = f"fla-{suffix}", f"gpu-{suffix}", f"GPU-{suffix}"
    uri = f"mongodb://{real_store}/?retryWrites=false&directConnection=true"
    values = chartutil.chart_values(real_cluster, uri, database, tmp_path / "node" / "state")
    values["agent"]["enabled"] = False
    values["analyzer"] = {
        "enabled": True, "image": {"repository": repository, "digest": digest},
        "anomaly": {"enabled": True, "fields": {"ecc_sbe_volatile": {"floor": 5.0}}},
        "config": {"poll": "100ms", "checkpoint_interval": "500ms", "anomaly_warmup": WARMUP},
        "nodeSelector": {"kubernetes.io/hostname": NODE},
    }  # fmt: skip
    with chartutil.Release(
        real_cluster, helm_env, RELEASE, ns, values=tmp_path / "values.yaml", db=db
    ) as release:
        core.create_namespace({"metadata": {"name": ns}})  # type: ignore[arg-type]
        installed = release.install(values, ready=("analyzer",))
        seconds["install to Ready"] = time.monotonic() - installed
        pod = release.pod("analyzer")
        assert pod is not None and pod["spec"]["nodeName"] == NODE
        running: dict[str, Any] = pod
        (container,) = pod["spec"]["containers"]
        assert container["image"] == image  # the analyzer image, by digest
        (status,) = pod["status"]["containerStatuses"]
        assert status["imageID"].endswith(digest), status
        assert real.image.split("@")[1] != digest  # not the one image

        # a GPU's health samples: a healthy counter for the warm-up, then 100 correctable errors a minute
        t0 = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(hours=1)
        st = store.connect(mongo.uri, database)
        try:
            ecc = 1000
            for minute in range(WARMUP + 1):
                ecc += minute % 4 == 0
                assert st.record_batch([_sample(node, gpu, t0 + dt.timedelta(minutes=minute), ecc)], []) == 1
            written = time.monotonic()
            for minute in range(WARMUP + 1, WARMUP + 4):
                ecc += 100
                assert st.record_batch([_sample(node, gpu, t0 + dt.timedelta(minutes=minute), ecc)], []) == 1
        finally:
            st.close()
        key = fault_id(node, "GPU-UUID", gpu, CODE)
        try:
            procs.wait_for(f"{CODE} derived by the analyzer's pod",
                           lambda: db["faults"].find_one({"_id": key}) is not None, 60, interval=0.5)  # fmt: skip
        except TransientError as exc:
            raise AssertionError(release.diagnosis()) from exc
        seconds["samples to anomaly fault"] = time.monotonic() - written
        fault = db["faults"].find_one({"_id": key})
        assert (fault["state"], fault["fatal"], fault["action"]) == ("open", False, "NONE")
        assert fault["entity"] == {"type": "GPU-UUID", "id": gpu} and fault["pattern"] == "gpu-anomaly"
        assert fault["metadata"]["anomaly"] == "ecc_sbe_volatile" and float(fault["metadata"]["score"]) >= 6
        procs.wait_for("the derived write counted by the pod",
                       lambda: _samples(_metrics(running), "faultline_analyzer_derived_faults_total")
                       == {"pattern=gpu-anomaly": 1.0}, 10, interval=0.2)  # fmt: skip
        assert _samples(_metrics(running), "faultline_analyzer_active") == {"": 1.0}

        pod = release.pod("analyzer")
        assert pod is not None and chartutil.ready(pod)
        assert [s["restartCount"] for s in pod["status"]["containerStatuses"]] == [0], pod["status"]
        log = core.read_namespaced_pod_log(pod["metadata"]["name"], ns)
        assert "faultline[anomaly]" not in log and "forbidden" not in log.lower(), log

        release.uninstall()
        seconds["test"] = time.monotonic() - started
        print("\nanalyzer image on a real node: " + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()))


def test_the_analyzer_image_s_arm64_build_imports_its_extra_under_emulation(
    real_cluster: LocalCluster,
) -> None:
    """The same index's arm64 image: its interpreter loads river and the aarch64 numpy and scipy wheels
    (their vendored OpenBLAS included) under QEMU user emulation (devtools/foreign.py)."""
    assert real_cluster.real is not None
    real_cluster.real.registry.push_analyzer_image()  # built when it is not of HEAD
    root_dir = Path(__file__).resolve().parents[2]
    work = Path(tempfile.mkdtemp(prefix="analyzer-arm64-"))
    try:
        root = work / "root"  # not the temporary directory itself (0700): the image's user walks into "/"
        config = oci.unpack(
            root_dir / ".cache" / "image" / "analyzer" / "faultline-analyzer.oci.tar", root, "arm64"
        )
        code = (
            "import platform, river, numpy, scipy.stats; print(platform.machine(), scipy.stats.norm.cdf(0))"
        )
        argv = oci.chroot_argv(root, {**config, "Entrypoint": ["/opt/faultline/bin/python", "-c"]}, [code])
        done = subprocess.run([str(root_dir / ".venv" / "bin" / "python"), "-m", "devtools.foreign", "arm64", "--",
                               *argv], cwd=root_dir, capture_output=True, text=True, check=False, timeout=300)  # fmt: skip
        assert (done.returncode, done.stdout.split()) == (0, ["aarch64", "0.5"]), done.stderr
    finally:
        shutil.rmtree(work, ignore_errors=True)
