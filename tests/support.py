"""Helpers shared by tests (fixtures live in conftest.py)."""

from __future__ import annotations

import postroom

#: The manual clock's starting time in every test.
START = 1_000_000.0

#: Store settings of every test (and every test subprocess): fixed backoffs, so the times a
#: test advances to are exact.
SETTINGS = postroom.Settings(backoff=postroom.FixedBackoff(seconds=10.0),
                             delivery_backoff=postroom.FixedBackoff(seconds=5.0))


def envelope(message_id: str = "m-1", **fields: object) -> postroom.Envelope:
    """An envelope from ``planner`` with a far deadline, overridable field by field."""
    values: dict[str, object] = {"message_id": message_id, "sender": "planner",
                                 "payload": {"n": 1}, "deadline": START + 3600}
    values.update(fields)
    return postroom.Envelope(**values)  # type: ignore[arg-type]


def latest_schema(store: postroom.Store, component: str = "store") -> int:
    """The newest schema version this postroom ships for ``component`` on the store's dialect."""
    return store.database.dialect.migrations(component)[-1][0]
