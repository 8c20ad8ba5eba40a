"""postroom's logs: one logger tree under ``postroom``, structured fields, never payloads.

Every record carries what identifies the work it is about as ``extra`` fields a log pipeline
can filter on -- ``task_id``, ``reply_id``, ``owner``, ``fence``, ``attempt``, ``state`` and
``last_error`` (those that apply; an operator's decision also names its ``operator``, a lost
COMMIT its ``xid``, an endpoint's change its ``principal``) -- and repeats them in its
message as ``name=value`` for a plain formatter. Nothing else is ever passed: not a
payload, not a result, not a token, not a secret.

Levels (loggers ``postroom.inbox``, ``.tasks``, ``.outbox``, ``.postgres``, ``.sqlite``,
``.pool``):

- DEBUG: every transition (a task received, claimed, finished, failed, cancelled; a reply
  claimed, a delivery recorded);
- INFO: what an operator follows without it being wrong (a lease recovered, a deadline
  passed, a failure that is not retryable, a dead reply requeued, a lost COMMIT resolved, a
  listener reconnected, the connection pool's reconnect messages);
- WARNING: what needs a look (a handler that raised, with its traceback; a task's attempts
  exhausted, a reply dead, a COMMIT whose outcome is unknown, a listener that cannot
  connect).

Transitions are logged after their transaction commits (``Tx.log``), so a record never
tells of something that rolled back. Like any library, postroom adds a ``NullHandler`` to
its logger and configures nothing else: the application decides where records go.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

__all__ = ["FIELDS", "event", "get", "logger", "raised", "route"]

#: The structured fields a postroom record may carry.
FIELDS = ("task_id", "reply_id", "owner", "fence", "attempt", "state", "last_error")

logger = logging.getLogger("postroom")
logger.addHandler(logging.NullHandler())


def get(name: str) -> logging.Logger:
    """The child logger ``postroom.<name>`` (e.g. ``postroom.tasks``)."""
    return logger.getChild(name)


class _Fields:
    """``name=value`` pairs, rendered only if a handler formats the record."""

    __slots__ = ("_fields",)

    def __init__(self, fields: Mapping[str, object]) -> None:
        self._fields = fields

    def __str__(self) -> str:
        return " ".join(f"{name}={_text(value)}" for name, value in self._fields.items())


def _text(value: object) -> str:
    text = str(value)
    return repr(text) if not text or any(ch.isspace() or ch in "='\"" for ch in text) else text


def event(log: logging.Logger, level: int, message: str, **fields: object) -> None:
    """Emit ``message`` on ``log`` with structured ``fields``, if ``log`` would at ``level``.

    Pass identities and states only (see the module docstring), never what the work carries.
    Fields that are ``None`` are left out.
    """
    _emit(log, level, message, fields, None)


def raised(log: logging.Logger, message: str, error: BaseException, **fields: object) -> None:
    """``event`` at WARNING for an error whose place in the code matters (a handler's):
    with ``error``'s traceback."""
    _emit(log, logging.WARNING, message, fields, error)


def _emit(log: logging.Logger, level: int, message: str, fields: Mapping[str, object],
          error: BaseException | None) -> None:
    if log.isEnabledFor(level):
        present = {name: value for name, value in fields.items() if value is not None}
        # The message is the record's template, so that tools grouping records by it
        # (Sentry, say) see one group per event, not one per task.
        template = message.replace("%", "%%")
        if present:
            log.log(level, template + " %s", _Fields(present), extra=present, exc_info=error)
        else:
            log.log(level, template, exc_info=error)


class _Route(logging.Handler):
    """Re-emits a library's records under a postroom logger, one level lower."""

    def __init__(self, target: logging.Logger) -> None:
        super().__init__()
        self.target = target

    def emit(self, record: logging.LogRecord) -> None:
        level = (logging.WARNING if record.levelno >= logging.ERROR
                 else logging.INFO if record.levelno >= logging.WARNING else logging.DEBUG)
        if not self.target.isEnabledFor(level):
            return
        routed = logging.makeLogRecord(record.__dict__)
        routed.name, routed.levelno = self.target.name, level
        routed.levelname = logging.getLevelName(level)
        self.target.handle(routed)


_routing = threading.Lock()


def route(source: str, child: str) -> None:
    """Send the records of the library logger ``source`` through ``postroom.<child>`` instead.

    A library's own warning (a connection pool retrying, say) is one level lower under
    postroom (WARNING becomes INFO, ERROR becomes WARNING, the rest DEBUG), since postroom
    reports the failures that matter itself; ``source`` stops propagating, so nothing reaches
    the root logger (or Python's last-resort stderr handler) twice. Idempotent.
    """
    logger_ = logging.getLogger(source)
    with _routing:
        if not any(isinstance(handler, _Route) for handler in logger_.handlers):
            logger_.addHandler(_Route(get(child)))
            logger_.propagate = False
