"""The node agent's health samples on the real store: an agent process on the simulated GPU backend with
`--health-samples 1s` and the analyzer's feed on stores one healthy GPU-HEALTH-SAMPLE event per GPU each
second, its fields as numbers with the GPU's UUID and the node's boot id, feeds them, and opens no fault
and no condition; the analyzer process with anomaly scores on reads them from the feed and, once the
simulated GPU's correctable-ECC counter starts to climb, raises GPU-ANOMALY-ECC-SBE-VOLATILE on that GPU's
UUID (non-fatal, action NONE) and on no other GPU."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

import pytest

from devtools.cluster import LocalCluster
from devtools.mongo import LocalMongo
from faultline import kube, store
from faultline.models import fault_id
from sources import simulator
from sources.follow import current_boot_id
from tests.integration.test_agent import poll, running_agent
from tests.integration.test_analyzer import PACK, Analyzer, wait

pytestmark = pytest.mark.integration
CODE = "GPU-HEALTH-SAMPLE"
WARMUP = 5


def samples(db: Any, gpu_uuid: str | None = None) -> list[dict[str, Any]]:
    query = {"code": CODE, **({"metadata.gpu_uuid": gpu_uuid} if gpu_uuid else {})}
    return sorted(db["health_events"].find(query), key=lambda e: e["observed_at"])


def test_samples_are_stored_fed_and_raise_an_anomaly_on_a_climbing_counter(
    cluster: LocalCluster, mongo: LocalMongo, api: Any, tmp_path: Path
) -> None:
    node = cluster.node_names[1]
    gpus = simulator.devices_for(node)
    drifting = gpus[2]
    simulator.inject(node, 2, kind="field", name="ecc_sbe_volatile", value=1204, directory=tmp_path)
    extra = ("--health-samples", "1s", "--analyzer-feed", "--gpu-poll-interval", "200ms")
    with running_agent(cluster, mongo, node, tmp_path, *extra) as faults:
        db = faults.database
        poll("a sample of every GPU", lambda: {e["metadata"]["gpu_uuid"] for e in samples(db)} >= {
            g.uuid for g in gpus}, 30)  # fmt: skip
        first = samples(db, drifting.uuid)[0]
        assert (first["node"], first["healthy"], first["fatal"], first["action"]) == (
            node,
            True,
            False,
            "NONE",
        )
        assert first["entities"] == [{"type": "GPU", "id": drifting.pci}]
        assert first["metadata"] == {
            "ecc_sbe_volatile": "1204", "temperature": str(simulator.SIM_TEMPERATURE), "source": "nvml",
            "gpu_uuid": drifting.uuid, "boot_id": current_boot_id(),
        }  # fmt: skip
        other = samples(db, gpus[0].uuid)[0]["metadata"]
        assert other["temperature"] == str(simulator.SIM_TEMPERATURE) and "ecc_sbe_volatile" not in other

        poll("three samples of one GPU", lambda: len(samples(db, gpus[0].uuid)) >= 3, 30)
        times = [e["observed_at"].timestamp() for e in samples(db, gpus[0].uuid)]
        assert all(b - a >= 0.99 for a, b in itertools.pairwise(times))  # one per GPU per interval

        fed = {key for doc in store.Store(db).feed.find({"writer": node}) for key in doc["keys"]}
        assert {e["_id"] for e in samples(db)} - fed == set()  # every stored sample is in the feed

        assert faults.count_documents({"state": "open"}) == 0  # samples open no fault
        assert faults.count_documents({"code": CODE}) == 0
        conditions = kube.nodes.conditions(api, node)
        assert conditions.get("GpuHealthy", {}).get("status") in (None, "True")

        pack = tmp_path / "cluster.yaml"
        pack.write_text(PACK)
        flags = ("--anomaly", "--anomaly-warmup", str(WARMUP),
                 "--anomaly-fields", json.dumps({"ecc_sbe_volatile": {"floor": 5.0}}))  # fmt: skip
        analyzer = Analyzer(mongo, db.name, pack, tmp_path / "analyzer.log", "a", *flags)
        anomaly = fault_id(node, "GPU-UUID", drifting.uuid, "GPU-ANOMALY-ECC-SBE-VOLATILE")
        try:
            # the counter stands still while the GPU's normal is learned (one rate per sample after the first)
            count = len(samples(db, drifting.uuid))
            poll("the warm-up's samples", lambda: len(samples(db, drifting.uuid)) >= count + WARMUP + 2, 60)
            assert faults.find_one({"_id": anomaly}) is None
            ecc = 1204
            deadline = time.monotonic() + 60
            while faults.find_one({"_id": anomaly}) is None and time.monotonic() < deadline:
                ecc += 20  # correctable errors climbing: tens a second, where the normal was none
                simulator.inject(
                    node, 2, kind="field", name="ecc_sbe_volatile", value=ecc, directory=tmp_path
                )
                time.sleep(0.25)
            wait(
                "the anomaly fault",
                lambda: faults.find_one({"_id": anomaly}) is not None,
                analyzer,
                timeout=5,
            )
            fault = faults.find_one({"_id": anomaly})
            assert (fault["node"], fault["state"], fault["fatal"], fault["action"]) == (
                node,
                "open",
                False,
                "NONE",
            )
            assert fault["entity"] == {"type": "GPU-UUID", "id": drifting.uuid}
            meta = fault["metadata"]
            assert meta["anomaly"] == "ecc_sbe_volatile" and float(meta["score"]) >= 6
            assert (
                db["health_events"].find_one({"_id": meta["records"]})["code"] == CODE
            )  # the sample behind it
            others = [f["_id"] for f in faults.find({"code": {"$regex": "^GPU-ANOMALY"}})]
            assert others == [anomaly]  # the steady GPUs raise nothing
            assert analyzer.stop() == 0
        finally:
            if analyzer.alive():
                analyzer.popen.kill()
                analyzer.popen.wait(10)
        assert [f["_id"] for f in faults.find({"pattern": {"$ne": "gpu-anomaly"}})] == []  # the agent's: none
