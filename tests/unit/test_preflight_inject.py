"""The admission webhook's decision (pure): which pods get the preflight init container, what it is, and
which pods are refused with a message naming the annotation, the bad value and the valid ones. The real
API server applying the patch is tests/integration/test_preflight_webhook.py."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from faultline.config.preflight import GANG_KEYS, GANG_ROUND_KEYS, GANG_SIZE_KEYS
from workers import preflight_inject
from workers.preflight_inject import InjectSettings

SETTINGS = InjectSettings(
    image="registry.local/faultline@sha256:" + "ab" * 32,
    gang_keys=GANG_KEYS,
    gang_size_keys=GANG_SIZE_KEYS,
    gang_round_keys=GANG_ROUND_KEYS,
    ingest_socket=Path("/run/faultline/ingest.sock"),
    journal_dirs=(Path("/var/log/journal"), Path("/run/log/journal")),
    env={"gang_timeout": "10m"},
    resources={"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
)
ENABLED = {"faultline.io/preflight": "enabled", "kubernetes.io/metadata.name": "train"}


def pod(
    gpus: list[int | str | None],
    *,
    init: list[int | str | None] | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    volumes: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    def container(name: str, n: int | str | None) -> dict[str, Any]:
        return {
            "name": name,
            "image": "train:1",
            "resources": {"limits": {"nvidia.com/gpu": n}} if n is not None else {},
        }

    spec: dict[str, Any] = {"containers": [container(f"c{i}", n) for i, n in enumerate(gpus)]}
    if init is not None:
        spec["initContainers"] = [container(f"i{i}", n) for i, n in enumerate(init)]
    if volumes is not None:
        spec["volumes"] = volumes
    meta = {
        "generateName": "train-",
        "namespace": "train",
        "annotations": annotations or {},
        "labels": labels or {},
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def review(
    obj: dict[str, Any],
    *,
    labels: dict[str, str] | None = ENABLED,
    operation: str = "CREATE",
    kind: str = "Pod",
    settings: InjectSettings = SETTINGS,
) -> dict[str, Any]:
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": "", "version": "v1", "kind": kind},
            "operation": operation,
            "namespace": "train",
            "object": obj,
        },
    }
    answer = preflight_inject.review(body, settings, namespace_labels=labels)
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == "u-1"
    return dict(answer["response"])


def patch_of(response: dict[str, Any]) -> list[dict[str, Any]]:
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"
    return list(json.loads(base64.b64decode(response["patch"])))


def apply(obj: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSONPatch adds this webhook makes (`add` at a new member, an index or `-`), applied."""
    out = copy.deepcopy(obj)
    for op in ops:
        assert op["op"] == "add"
        *parents, last = (p.replace("~1", "/").replace("~0", "~") for p in op["path"].strip("/").split("/"))
        target: Any = out
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if isinstance(target, list):
            target.insert(len(target) if last == "-" else int(last), op["value"])
        else:
            assert last not in target
            target[last] = op["value"]
    return out


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_a_gpu_pod_in_an_enabled_namespace_gets_the_init_container() -> None:
    obj = pod([4, 2, None])
    patched = apply(obj, patch_of(review(obj)))
    (init,) = patched["spec"]["initContainers"]
    assert init["name"] == "faultline-preflight" and init["image"] == SETTINGS.image
    assert init["args"] == ["preflight"]
    # the pod's effective GPU request: the device plugin hands it the GPUs the containers then reuse
    assert init["resources"] == {
        "limits": {"memory": "256Mi", "nvidia.com/gpu": "6"},
        "requests": {"cpu": "100m", "memory": "128Mi", "nvidia.com/gpu": "6"},
    }
    env = env_of(init)
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["FAULTLINE_EXPECTED_GPUS"] == "6"
    assert json.loads(env["FAULTLINE_CHECKS"]) == ["count", "remap", "ecc", "nvlink", "pcie", "xid", "dcgm"]
    assert env["FAULTLINE_INGEST_SOCKET"] == "/run/faultline/ingest.sock"
    assert env["FAULTLINE_GANG_TIMEOUT"] == "10m"  # the webhook's preflight_settings
    assert "FAULTLINE_GANG" not in env  # in no gang
    assert init["securityContext"]["runAsUser"] == 0  # the agent's socket is root's, 0600
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert init["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"]: m for m in init["volumeMounts"]}
    assert mounts["/var/log/journal"]["readOnly"] is True and not mounts["/run/faultline"].get("readOnly")
    volumes = {v["name"]: v for v in patched["spec"]["volumes"]}
    assert volumes["faultline-preflight-ingest"]["hostPath"] == {
        "path": "/run/faultline",
        "type": "Directory",
    }
    assert patched["spec"]["containers"] == obj["spec"]["containers"]  # the pod's own containers untouched


def test_it_goes_first_and_appends_its_volumes() -> None:
    obj = pod([8], init=[1, 8], volumes=[{"name": "data", "emptyDir": {}}])
    patched = apply(obj, patch_of(review(obj)))
    assert [c["name"] for c in patched["spec"]["initContainers"]] == ["faultline-preflight", "i0", "i1"]
    assert [v["name"] for v in patched["spec"]["volumes"]] == [
        "data",
        "faultline-preflight-ingest",
        "faultline-preflight-journal-0",
        "faultline-preflight-journal-1",
    ]
    assert env_of(patched["spec"]["initContainers"][0])["FAULTLINE_EXPECTED_GPUS"] == "8"  # max(8, 1, 8)


def test_the_pod_gets_the_registrys_pull_secrets_once() -> None:
    private = InjectSettings(image="img", image_pull_secrets=("registry-a", "registry-b"))
    patched = apply(pod([1]), patch_of(review(pod([1]), settings=private)))
    assert patched["spec"]["imagePullSecrets"] == [{"name": "registry-a"}, {"name": "registry-b"}]
    own = pod([1])
    own["spec"]["imagePullSecrets"] = [{"name": "team"}, {"name": "registry-b"}]
    patched = apply(own, patch_of(review(own, settings=private)))
    assert patched["spec"]["imagePullSecrets"] == [
        {"name": "team"},
        {"name": "registry-b"},
        {"name": "registry-a"},
    ]
    assert (
        "imagePullSecrets"
        not in apply(pod([1]), patch_of(review(pod([1]), settings=InjectSettings(image="img"))))["spec"]
    )


def test_without_host_files_it_runs_as_an_ordinary_user() -> None:
    plain = InjectSettings(image="img")
    patched = apply(pod([1]), patch_of(review(pod([1]), settings=plain)))
    (init,) = patched["spec"]["initContainers"]
    assert init["securityContext"]["runAsUser"] == 65532 and init["securityContext"]["runAsNonRoot"] is True
    assert "volumes" not in patched["spec"] and "volumeMounts" not in init


def test_a_simulator_directory_makes_it_check_the_simulated_gpus() -> None:
    """Tests and the demo: the host's simulator control directory mounted read-only, the sim backend
    named, and the same setting given through `env` not repeated (the webhook's own wins)."""
    sim = InjectSettings(image="img", sim_dir=Path("/var/lib/faultline/sim"), env={"gpu_backend": "sim"})
    patched = apply(pod([8]), patch_of(review(pod([8]), settings=sim)))
    (init,) = patched["spec"]["initContainers"]
    names = [e["name"] for e in init["env"]]
    assert names.count("FAULTLINE_GPU_BACKEND") == 1
    env = env_of(init)
    assert (env["FAULTLINE_GPU_BACKEND"], env["FAULTLINE_SIM_DIR"]) == ("sim", "/var/lib/faultline/sim")
    assert init["volumeMounts"] == [
        {"name": "faultline-preflight-sim", "mountPath": "/var/lib/faultline/sim", "readOnly": True}
    ]
    assert patched["spec"]["volumes"] == [
        {
            "name": "faultline-preflight-sim",
            "hostPath": {"path": "/var/lib/faultline/sim", "type": "Directory"},
        }
    ]
    assert init["securityContext"]["runAsUser"] == 65532  # the control files are world-readable


@pytest.mark.parametrize(
    ("obj", "kwargs"),
    [
        (pod([None]), {}),  # no GPU
        (pod([0]), {}),  # nvidia.com/gpu: 0
        (pod(["two"]), {}),  # not an integer: the API server's validation refuses it, not this webhook
        (pod([2]), {"labels": {"kubernetes.io/metadata.name": "train"}}),  # namespace not enabled
        (pod([2]), {"labels": {"faultline.io/preflight": "disabled"}}),
        (pod([2], annotations={"faultline.io/preflight": "false"}), {}),  # opted out
        (pod([2], annotations={"faultline.io/preflight": " False "}), {}),
        (pod([2]), {"operation": "UPDATE"}),
        (pod([2]), {"kind": "Deployment"}),
    ],
)
def test_allowed_unchanged(obj: dict[str, Any], kwargs: dict[str, Any]) -> None:
    response = review(obj, **kwargs)
    assert response == {"uid": "u-1", "allowed": True}


def test_unreadable_namespace_labels_follow_the_selector() -> None:
    assert "patch" in review(pod([1]), labels=None)


def test_a_pod_that_has_it_already_is_left_alone() -> None:
    obj = pod([1])
    patched = apply(obj, patch_of(review(obj)))
    assert review(patched) == {"uid": "u-1", "allowed": True}


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        (
            {"faultline.io/preflight-checks": "ecc,ecx,xid"},
            "annotation faultline.io/preflight-checks: unknown check 'ecx'; valid checks: count, remap, ecc, nvlink, "
            "pcie, xid, dcgm",
        ),
        ({"faultline.io/preflight-checks": " "}, "annotation faultline.io/preflight-checks: no check named"),
        (
            {"faultline.io/preflight": "no"},
            'annotation faultline.io/preflight: \'no\' is not "true" or "false"',
        ),
        (
            {"jobset.sigs.k8s.io/jobset-name": "t", "faultline.io/gang-size": "four"},
            "gang of this pod: faultline.io/gang-size: 'four' is not a gang size (a positive integer)",
        ),
    ],
)
def test_bad_annotations_are_refused_by_name(annotations: dict[str, str], message: str) -> None:
    response = review(pod([1], annotations=annotations))
    assert response["allowed"] is False and "patch" not in response
    assert response["status"]["code"] == 400
    assert response["status"]["message"].startswith(message)


def test_checks_annotation_and_model() -> None:
    annotations = {"faultline.io/preflight-checks": "xid, ECC", "faultline.io/preflight-gpu-model": "H100"}
    env = env_of(
        apply(pod([1]), patch_of(review(pod([1], annotations=annotations))))["spec"]["initContainers"][0]
    )
    assert json.loads(env["FAULTLINE_CHECKS"]) == ["ecc", "xid"]
    assert env["FAULTLINE_EXPECTED_MODEL"] == "H100"


@pytest.mark.parametrize(
    ("labels", "annotations", "gang", "size"),
    [
        (
            {"jobset.sigs.k8s.io/jobset-name": "llm", "jobset.sigs.k8s.io/restart-attempt": "2"},
            {"faultline.io/gang-size": "16"},
            "jobset.sigs.k8s.io/jobset-name=llm,jobset.sigs.k8s.io/restart-attempt=2",
            "16",
        ),
        (
            {"leaderworkerset.sigs.k8s.io/name": "serve", "leaderworkerset.sigs.k8s.io/group-key": "3e23"},
            {"leaderworkerset.sigs.k8s.io/size": "4"},
            "leaderworkerset.sigs.k8s.io/group-key=3e23",
            "4",
        ),
        (
            {"kueue.x-k8s.io/pod-group-name": "g"},
            {"kueue.x-k8s.io/pod-group-total-count": "2"},
            "kueue.x-k8s.io/pod-group-name=g",
            "2",
        ),
        ({"training.kubeflow.org/job-name": "bert"}, {}, "training.kubeflow.org/job-name=bert", None),
        ({}, {"scheduling.k8s.io/group-name": "pg-1"}, "scheduling.k8s.io/group-name=pg-1", None),
        ({"volcano.sh/job-name": "vj", "faultline.io/gang": "mine"}, {}, "faultline.io/gang=mine", None),
    ],
)
def test_gangs_from_the_jobs_labels(
    labels: dict[str, str], annotations: dict[str, str], gang: str, size: str | None
) -> None:
    env = env_of(
        apply(pod([8]), patch_of(review(pod([8], labels=labels, annotations=annotations))))["spec"][
            "initContainers"
        ][0]
    )
    assert env["FAULTLINE_GANG"] == gang
    assert env.get("FAULTLINE_GANG_SIZE") == size


def refusal(response: dict[str, Any]) -> str:
    assert response["allowed"] is False and "patch" not in response
    assert response["status"]["code"] == 400
    return str(response["status"]["message"])


def test_the_reserved_names_are_the_injected_volumes() -> None:
    sim = InjectSettings(
        image="img",
        ingest_socket=Path("/run/x/ingest.sock"),
        journal_dirs=(Path("/j"),),
        sim_dir=Path("/sim"),
    )
    patched = apply(pod([1]), patch_of(review(pod([1]), settings=sim)))
    names = [v["name"] for v in patched["spec"]["volumes"]]
    assert names and all(n.startswith(preflight_inject.RESERVED_VOLUME_PREFIX) for n in names)


@pytest.mark.parametrize(
    "volume",
    [
        {
            "name": "faultline-preflight-journal-0",
            "emptyDir": {},
        },  # a crafted journal next to the real socket
        {"name": "faultline-preflight-journal-0", "hostPath": {"path": "/var/log/journal"}},
        {"name": "faultline-preflight-ingest", "hostPath": {"path": "/run/faultline"}},
        {"name": "faultline-preflight-sim", "configMap": {"name": "fake"}},
        {"name": "faultline-preflight-journal-7", "emptyDir": {}},  # any name under the prefix
    ],
)
@pytest.mark.redteam
def test_a_pod_bringing_a_reserved_volume_is_refused(volume: dict[str, Any]) -> None:
    message = refusal(review(pod([1], volumes=[volume])))
    assert message.startswith(f"volume {volume['name']!r}: the names faultline-preflight-* are reserved")
    # refused whether or not the pod asks for GPUs or opts out: the names are faultline's in the namespace
    assert refusal(review(pod([None], volumes=[volume]))) == message
    assert refusal(review(pod([1], volumes=[volume], annotations={"faultline.io/preflight": "false"})))


@pytest.mark.redteam
def test_a_pod_mounting_a_reserved_volume_is_refused() -> None:
    obj = pod([1])
    obj["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "faultline-preflight-ingest", "mountPath": "/run/faultline"}
    ]
    assert refusal(review(obj)).startswith(
        "container 'c0' mounts volume 'faultline-preflight-ingest': the names faultline-preflight-* are reserved"
    )
    injected = apply(pod([1], init=[None]), patch_of(review(pod([1], init=[None]))))
    injected["spec"]["initContainers"][1]["volumeMounts"] = [
        {"name": "faultline-preflight-journal-1", "mountPath": "/j", "readOnly": True}
    ]  # an application init container reaching for the injected host journal
    assert refusal(review(injected)).startswith(
        "container 'i0' mounts volume 'faultline-preflight-journal-1'"
    )


def test_outside_an_enabled_namespace_the_names_are_not_checked() -> None:
    obj = pod([1], volumes=[{"name": "faultline-preflight-ingest", "emptyDir": {}}])
    assert review(obj, labels={"kubernetes.io/metadata.name": "train"}) == {"uid": "u-1", "allowed": True}


def test_a_pod_injected_already_keeps_its_volumes() -> None:
    """A re-invocation (or the ServiceAccount plugin adding its token to every container meanwhile): the
    webhook's own init container and volumes pass, and nothing is added twice."""
    patched = apply(pod([2], init=[None]), patch_of(review(pod([2], init=[None]))))
    for c in patched["spec"]["initContainers"] + patched["spec"]["containers"]:
        c.setdefault("volumeMounts", []).append(
            {"name": "kube-api-access-x", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}
        )
    for v in patched["spec"]["volumes"]:
        v["hostPath"].setdefault("type", "")  # the API server's default
    patched["spec"]["initContainers"][0]["env"].append({"name": "OTHER_WEBHOOKS", "value": "x"})
    assert review(patched) == {"uid": "u-1", "allowed": True}


def _injected() -> dict[str, Any]:
    return apply(pod([1]), patch_of(review(pod([1]))))


def _other_image(obj: dict[str, Any]) -> None:
    obj["spec"]["initContainers"][0]["image"] = "attacker/faultline:1"


def _a_command(obj: dict[str, Any]) -> None:
    obj["spec"]["initContainers"][0]["command"] = ["sh", "-c", "send-fake-xid"]


def _other_args(obj: dict[str, Any]) -> None:
    obj["spec"]["initContainers"][0]["args"] = ["ingest-send", "--xid", "79"]


def _journal_swapped(obj: dict[str, Any]) -> None:
    obj["spec"]["volumes"][1] = {"name": "faultline-preflight-journal-0", "emptyDir": {}}


def _journal_elsewhere(obj: dict[str, Any]) -> None:
    obj["spec"]["volumes"][1]["hostPath"]["path"] = "/home/tenant/journal"


def _extra_reserved(obj: dict[str, Any]) -> None:
    obj["spec"]["volumes"].append({"name": "faultline-preflight-sim", "hostPath": {"path": "/tmp/sim"}})


def _journal_redirected(obj: dict[str, Any]) -> None:
    init = obj["spec"]["initContainers"][0]
    obj["spec"]["volumes"].append({"name": "mine", "emptyDir": {}})
    init["volumeMounts"].append({"name": "mine", "mountPath": "/mine"})
    for e in init["env"]:
        if e["name"] == "FAULTLINE_JOURNAL_DIRS":
            e["value"] = '["/mine"]'  # the check reads the tenant's crafted journal


def _settings_from_a_config_map(obj: dict[str, Any]) -> None:
    obj["spec"]["initContainers"][0]["envFrom"] = [{"configMapRef": {"name": "mine"}}]


def _two_of_ours(obj: dict[str, Any]) -> None:
    obj["spec"]["initContainers"].append(copy.deepcopy(obj["spec"]["initContainers"][0]))


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        (_other_image, "init container 'faultline-preflight' is reserved"),
        (_a_command, "init container 'faultline-preflight' is reserved"),
        (_other_args, "init container 'faultline-preflight' is reserved for faultline's preflight: its args"),
        (_journal_swapped, "volume 'faultline-preflight-journal-0': the names"),
        (_journal_elsewhere, "volume 'faultline-preflight-journal-0': the names"),
        (_extra_reserved, "volume 'faultline-preflight-sim': the names"),
        (_two_of_ours, "init container 'faultline-preflight' is reserved"),
        (
            _journal_redirected,
            "init container 'faultline-preflight' is reserved for faultline's preflight: its "
            "FAULTLINE_* environment",
        ),
        (
            _settings_from_a_config_map,
            "init container 'faultline-preflight' is reserved for faultline's "
            "preflight: its FAULTLINE_* environment",
        ),
    ],
)
@pytest.mark.redteam
def test_a_pod_posing_as_injected_is_refused(tamper: Callable[[dict[str, Any]], None], message: str) -> None:
    """The init container's name alone does not make a pod "injected already": a copy of an injected pod
    with its journal swapped for the tenant's, or the container made to run something else, is refused."""
    obj = _injected()
    tamper(obj)
    assert refusal(review(obj)).startswith(message)


@pytest.mark.redteam
def test_an_injected_container_given_code_of_the_tenants_is_refused() -> None:
    """PYTHONPATH (or LD_PRELOAD) on the webhook's own container would run the tenant's code in faultline's
    image, whose termination message the object monitor believes: refused."""
    for name in ("PYTHONPATH", "LD_PRELOAD"):
        patched = apply(pod([1]), patch_of(review(pod([1]))))
        patched["spec"]["initContainers"][0]["env"].append({"name": name, "value": "/work"})
        assert f"its environment has '{name}'" in refusal(review(patched))
