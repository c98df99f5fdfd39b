"""How long a text faultline writes may be: the Kubernetes API's own limits, and faultline's bounds on
the text it carries on from elsewhere (an exception's words, another system's answer, a log line) into
a log field, a store document, a status or its own error message. An unbounded text there can be a page
of HTML, a server's call stack or a flood's line: one bad answer must not swell every record of it.

Every length is in characters (what `clip` cuts). A limit that one module alone uses is named there
(a node condition's message: `faultline.conditions.MESSAGE_LIMIT`). Import the module:
`bounds.clip(note, bounds.EVENT_NOTE)`, `bounds.quote(line)`.
"""

from __future__ import annotations

# -- Kubernetes: the API server (or a CRD's schema) refuses a longer value ---------------------------------
# An events.k8s.io/v1 Event's note: at most 1024 (bytes to the API server; one per ASCII character).
EVENT_NOTE = 1024
EVENT_INSTANCE = 128  # an Event's reportingInstance: at most 128 characters
OBJECT_NAME = 253  # an object's name as a DNS-1123 subdomain (a RemediationRequest's)
LABEL_VALUE = 63  # a label value; also a Job's name, which its pods carry in their `job-name` label
REQUEST_TEXT = 1024  # a RemediationRequest's spec.reason and status.message (maxLength in its CRD)

# -- faultline's own bounds --------------------------------------------------------------------------------
STORED_TEXT = 500  # a reason, evidence or error kept in a record: a store document, a status, an API error
ERROR_TEXT = 300  # another system's error text carried on in a log field or in faultline's own error
EXCERPT = 200  # a piece of another's text (an answer that did not parse, a log line) quoted in a message
QUOTED_INPUT = 80  # rejected input quoted back in the error that rejects it: enough to recognise it by


def clip(text: str, limit: int) -> str:
    """The first `limit` characters of `text` (all of it when shorter)."""
    return text[:limit]


def quote(text: str, limit: int = QUOTED_INPUT) -> str:
    """The first `limit` characters of `text` as a Python literal (`repr`), to quote in a message."""
    return repr(text[:limit])
