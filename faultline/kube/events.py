"""Events: post an events.k8s.io/v1 Event about a Node (the body is shared with the agent's transport)."""

from __future__ import annotations

from faultline.kube import bodies
from faultline.kube.client import ApiClient, events_api, send_json


def post_node(
    api: ApiClient, node: str, *, reason: str, note: str, action: str, warning: bool, controller: str,
    instance: str,
) -> None:  # fmt: skip
    """An Event about a Node (in `default`, where node events live). Sent and answered as plain JSON:
    building client models for the request and the answer cost more CPU than the call."""
    body = bodies.node_event(
        node, reason=reason, note=note, action=action, warning=warning, controller=controller,
        instance=instance,
    )  # fmt: skip
    send_json("create", f"Event on Node {node}", events_api(api).create_namespaced_event, "default", body)
