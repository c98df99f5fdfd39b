"""faultline's exception tree, by what the caller does next.

    FaultlineError
    ├── ConfigError              bad settings or flags: fix the configuration
    │   └── PackError            a pattern pack that cannot be loaded (file, pattern id, reason)
    ├── InputError               an input that cannot be read at all (missing file, not a log)
    ├── TransientError           retry after `delay` seconds
    │   └── ApiUnavailableError  the Kubernetes API server was not reached, timed out or failed (5xx)
    │       └── ThrottledError   it said 429 (too many requests; an eviction a PodDisruptionBudget refuses
    │                            now): `delay` is its Retry-After
    ├── PermanentError           do not retry
    │   └── ApiRejectedError     the Kubernetes API server refused the request (a 4xx not listed below)
    │       ├── NotFoundError    404: the object (or its namespace) does not exist
    │       ├── ConflictError    409: changed since read (a stale resourceVersion) ...
    │       │   └── AlreadyExistsError   ... or, on a create, exists already
    │       ├── ForbiddenError   401, 403: this identity may not (RBAC, an expired token)
    │       └── InvalidError     400, 422: the body or the request is malformed
    └── LeaseLostError           another worker owns the claim now: stop touching the document

Every Kubernetes API error is one of `ApiError` (a mixin of the `Api*` classes above, with `status`, `verb`,
`what` and the server's `reason`), translated once inside `faultline.kube`: callers branch on the classes,
never on HTTP status codes. Bad *lines* inside an input are not exceptions: parsers count them and report
them as diagnostics.
"""

from __future__ import annotations


class FaultlineError(Exception):
    """Root of every error faultline raises on purpose."""


class ConfigError(FaultlineError):
    pass


class PackError(ConfigError):
    """A pattern pack failed to load; names the file, the pattern id (when known) and the reason."""

    def __init__(self, file: str, reason: str, pattern_id: str | None = None) -> None:
        self.file = file
        self.pattern_id = pattern_id
        self.reason = reason
        where = f"{file}: pattern {pattern_id!r}" if pattern_id else file
        super().__init__(f"{where}: {reason}")


class InputError(FaultlineError):
    pass


class TransientError(FaultlineError):
    def __init__(self, message: str, delay: float = 1.0) -> None:
        self.delay = delay
        super().__init__(message)


class PermanentError(FaultlineError):
    pass


class LeaseLostError(FaultlineError):
    pass


class ApiError(FaultlineError):
    """A Kubernetes API call that failed: `verb` (get, patch, evict, ...) on `what` (`Node gpu-7`),
    the HTTP `status` (None when no answer came) and the server's `reason` (`NotFound`, `AlreadyExists`)."""

    def __init__(
        self, verb: str, what: str, message: str, *, status: int | None = None, reason: str = "",
        delay: float = 1.0,
    ) -> None:  # fmt: skip
        self.verb, self.what, self.status, self.reason = verb, what, status, reason
        self.delay = delay  # read by callers of the transient kinds (TransientError's contract)
        answer = f"HTTP {status}" + (f" {reason}" if reason else "") if status else "no answer"
        Exception.__init__(self, f"{verb} {what}: {answer}: {message}")


class ApiUnavailableError(ApiError, TransientError):
    pass


class ThrottledError(ApiUnavailableError):
    pass


class ApiRejectedError(ApiError, PermanentError):
    pass


class NotFoundError(ApiRejectedError):
    pass


class ConflictError(ApiRejectedError):
    pass


class AlreadyExistsError(ConflictError):
    pass


class ForbiddenError(ApiRejectedError):
    pass


class InvalidError(ApiRejectedError):
    pass
