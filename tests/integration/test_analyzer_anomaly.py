"""The cluster analyzer's anomaly scores as a process (`faultline analyzer --anomaly`) on a real store
(FerretDB): a GPU's health samples, fed as the agents' writes feed them, raise a non-fatal
GPU-ANOMALY-ECC-SBE-VOLATILE once its correctable-ECC rate jumps, with a model learned partly before an
orderly restart (kept in the partitions' checkpoints), and resolve it once the rate is back to normal."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from faultline import store
from faultline.models import Action, Component, Entity, HealthEvent, event_id, fault_id
from patterns import anomaly, cluster
from tests.integration.test_analyzer import PACK, Analyzer, wait

pytestmark = pytest.mark.integration
T0 = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(hours=2)
FIELDS = {"ecc_sbe_volatile": {"floor": 5.0}}
WARMUP = 15
FAULT = fault_id("n1", "GPU-UUID", "GPU-1", "GPU-ANOMALY-ECC-SBE-VOLATILE")


def health(minute: int, ecc: int) -> HealthEvent:
    """GPU-1's health sample at `minute`: its correctable-ECC counter since the driver loaded."""
    ts = T0 + dt.timedelta(minutes=minute)
    return HealthEvent(
        id=event_id("n1", "nvml", "GPU", "0000:3b:00", "GPU-HEALTH", ts), node="n1", component=Component.GPU,
        check="health", code="GPU-HEALTH", entities=(Entity(type="GPU", id="0000:3b:00"),), healthy=True,
        fatal=False, action=Action.NONE, generated_at=ts, observed_at=ts,
        metadata={"gpu_uuid": "GPU-1", "boot_id": "b1", "ecc_sbe_volatile": str(ecc)},
    )  # fmt: skip


def learned(db: Any) -> int:
    """How many rates GPU-1's correctable-ECC model has learned, by its partition's checkpoint."""
    saved = (
        store.Store(db)
        .analyzer_checkpoints()
        .get(cluster.partition(anomaly.PATTERN, "GPU-1"), {})
        .get("anomaly")
    )
    models = anomaly.Models.restore(anomaly.Settings({}), saved)
    gpu = models.gpus.get("GPU-1")
    return gpu.fields["ecc_sbe_volatile"].learned if gpu else 0


def test_a_gpu_anomaly_from_health_samples_across_a_restart(
    mongo: Any, mongo_db: Any, tmp_path: Path
) -> None:  # fmt: skip
    pack = tmp_path / "cluster.yaml"
    pack.write_text(PACK)
    flags = ("--anomaly", "--anomaly-warmup", str(WARMUP), "--anomaly-fields", json.dumps(FIELDS))
    st = store.Store(mongo_db)
    ecc = 1000
    for minute in range(WARMUP):  # a healthy GPU: one correctable error every few minutes
        ecc += minute % 4 == 0
        st.record_batch([health(minute, ecc)], [])

    a = Analyzer(mongo, mongo_db.name, pack, tmp_path / "a.log", "a", *flags)
    try:
        wait("the samples read and checkpointed", lambda: learned(mongo_db) == WARMUP - 1, a)
        assert a.stop() == 0
    finally:
        if a.alive():
            a.popen.kill()
            a.popen.wait(10)
    assert mongo_db["faults"].find_one({"_id": FAULT}) is None

    # restarted: one more healthy sample completes the warm-up only with what the first run learned
    b = Analyzer(mongo, mongo_db.name, pack, tmp_path / "b.log", "b", *flags)
    try:
        st.record_batch([health(WARMUP, ecc)], [])
        for minute in range(WARMUP + 1, WARMUP + 4):  # 100 correctable errors a minute
            ecc += 100
            st.record_batch([health(minute, ecc)], [])
        wait("the anomaly fault", lambda: mongo_db["faults"].find_one({"_id": FAULT}) is not None, b)
        fault = mongo_db["faults"].find_one({"_id": FAULT})
        assert (fault["state"], fault["fatal"], fault["action"]) == ("open", False, "NONE")
        assert fault["entity"] == {"type": "GPU-UUID", "id": "GPU-1"} and fault["pattern"] == anomaly.PATTERN
        meta = fault["metadata"]
        assert meta["anomaly"] == "ecc_sbe_volatile" and meta["samples"] == str(WARMUP)
        assert float(meta["score"]) >= 6 and meta["rate"].endswith("/h") and meta["normal"].endswith("/h")
        assert meta["records"] == health(WARMUP + 1, 0).id
        first = T0 + dt.timedelta(minutes=WARMUP + 1)  # read back naive (this client is not tz-aware)
        assert fault["first_seen"] == first.replace(tzinfo=None)

        for minute in range(WARMUP + 4, WARMUP + 40):  # back to normal: no new errors
            st.record_batch([health(minute, ecc)], [])
        wait("the anomaly resolved",
             lambda: (mongo_db["faults"].find_one({"_id": FAULT}) or {}).get("state") == "resolved", b)  # fmt: skip
        assert mongo_db["queue"].find_one({"_id": f"quarantine/{FAULT}"}) is None  # its work items went
        assert b.stop() == 0
    finally:
        if b.alive():
            b.popen.kill()
            b.popen.wait(10)
