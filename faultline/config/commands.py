"""Settings of the small commands that only read or maintain the store."""

from __future__ import annotations

import datetime as dt

from pydantic import Field

from faultline.config.base import Component, Duration, StoreFields


class StatusConfig(Component, StoreFields):
    """`faultline status`: the breaker and the nodes faultline holds."""


class RetentionConfig(Component, StoreFields):
    """`faultline store retention`: delete old health events (FerretDB and DocumentDB have no TTL index)."""

    older_than: Duration = Field(
        default=dt.timedelta(days=14), ge=dt.timedelta(hours=1),
        description="delete health events older than this (duration); at least 1h, so the analyzer and "
        "`explain` keep recent history",
    )  # fmt: skip
