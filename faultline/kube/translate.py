"""The one table from a Kubernetes API answer to faultline's error tree (`faultline.errors`).

Both transports (`faultline.kube.client`, the generated client, and `faultline.kube.lite`, the agent's) call
`error()` with what the server said; nothing else in faultline looks at an HTTP status. No I/O here and no
import of the `kubernetes` package (the agent loads this module).
"""

from __future__ import annotations

import email.utils
import json
import time
from collections.abc import Mapping
from typing import Any

from faultline import bounds
from faultline.errors import (
    AlreadyExistsError,
    ApiError,
    ApiRejectedError,
    ApiUnavailableError,
    ConflictError,
    ForbiddenError,
    InvalidError,
    NotFoundError,
    ThrottledError,
)

DEFAULT_DELAY_S = 1.0  # when a transient answer names no Retry-After
MAX_DELAY_S = 300.0  # a Retry-After past this is taken as this (a worker re-reads the world by then)

_BY_STATUS: dict[int, type[ApiError]] = {
    400: InvalidError,
    401: ForbiddenError,
    403: ForbiddenError,
    404: NotFoundError,
    409: ConflictError,
    422: InvalidError,
    429: ThrottledError,
}


def retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date); None when absent or unreadable."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    return min(MAX_DELAY_S, max(0.0, seconds))


def status_body(data: bytes | str | None) -> dict[str, Any]:
    """The server's Status object (message, reason, details), or {} when the body is not one."""
    if not data:
        return {}
    try:
        body = json.loads(data)
    except (ValueError, TypeError):
        return {}
    return body if isinstance(body, dict) else {}


def error(
    status: int | None, verb: str, what: str, *, body: bytes | str | None = None,
    headers: Mapping[str, str] | None = None,
) -> ApiError:  # fmt: skip
    """The exception for a failed call: `status` None means no answer came. The message keeps the
    server's own words (bounded)."""
    doc = status_body(body)
    message = str(doc.get("message") or "")
    if not message and body:
        text = body if isinstance(body, str) else body.decode(errors="replace")
        message = bounds.clip(text, bounds.EXCERPT)
    message = bounds.clip(message, bounds.STORED_TEXT)
    reason = str(doc.get("reason") or "")
    if status is None or status == 0:
        return ApiUnavailableError(verb, what, message or "no answer from the API server")
    if status in (408, 429) or status >= 500:  # timed out, throttled, failed: try again later
        header = None
        for key, value in (headers or {}).items():
            if key.lower() == "retry-after":
                header = value
        delay = retry_after(header)
        if delay is None:  # the Status object may carry it instead
            details = doc.get("details") or {}
            delay = retry_after(str(details.get("retryAfterSeconds", "")) or None)
        transient = ThrottledError if status == 429 else ApiUnavailableError
        return transient(verb, what, message, status=status, reason=reason,
                         delay=DEFAULT_DELAY_S if delay is None else delay)  # fmt: skip
    kind = _BY_STATUS.get(status, ApiRejectedError)
    if kind is ConflictError and reason == "AlreadyExists":
        kind = AlreadyExistsError
    return kind(verb, what, message, status=status, reason=reason)
