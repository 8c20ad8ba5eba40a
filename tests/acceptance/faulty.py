"""The requesters' side for the acceptance tests: one receiver database behind a raw HTTP
server on 127.0.0.1 that misbehaves as the path of each endpoint says.

Each principal's endpoint is ``<url>/<mode>``, and its deliveries are verified with its own
secret (``ReceiverApp.take``, the receiving app's own checks) before the mode acts:

- ``ok``: takes the reply and answers;
- ``drop``: takes it and, the first time a reply comes, closes the connection unanswered;
- ``timeout``: takes it and, the first time, answers nothing for longer than the sender waits;
- ``error``: the first time, answers 503 without taking it;
- ``conflict``: answers 409 (it holds that id with other content), ``gone`` 410, and
  ``redirect`` 302 elsewhere, every time, taking nothing.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import postroom
from postroom.http.receiving import ReceiverApp
from tests.http.servers import RawServer, answer

MODES = ("ok", "drop", "timeout", "error", "conflict", "gone", "redirect")
#: The modes whose replies end sent, each with one effect; the others' end dead, with none.
DELIVERED = ("ok", "drop", "timeout", "error")


class Faulty(RawServer):
    """The server; ``arrived`` counts the deliveries of each reply_id that reached it."""

    def __init__(self, receiver: postroom.Receiver, *, hang: float) -> None:
        super().__init__(self._answer)
        self.receiver = receiver
        self.hang = hang
        self.apps: dict[str, ReceiverApp] = {}
        self.arrived: Counter[str] = Counter()

    def endpoint(self, store: postroom.Store, mode: str, *, schedule: list[float],
                 budget: int) -> None:
        """Register ``mode``'s endpoint (its principal is ``mode``) and verify with its secret."""
        added = store.add_endpoint(mode, f"{self.url}/{mode}", allow_private=True,
                                   schedule=schedule, budget=budget)
        self.apps[mode] = ReceiverApp(self.receiver, [added.secrets[0].secret])

    async def _answer(self, line: bytes, headers: dict[str, str], body: bytes) -> bytes | None:
        mode = line.split()[1].decode("ascii").strip("/")
        reply_id = headers.get("webhook-id", "")
        self.arrived[reply_id] += 1
        first = self.arrived[reply_id] == 1
        if mode == "conflict":
            return answer(409)
        if mode == "gone":
            return answer(410)
        if mode == "redirect":
            return answer(302, {"location": f"{self.url}/elsewhere"})
        if mode == "error" and first:
            return answer(503)
        status, document = await asyncio.to_thread(self.apps[mode].take, headers, body)
        if first and mode == "drop":
            return None
        if first and mode == "timeout":
            await asyncio.sleep(self.hang)
            return None
        return answer(status, {"content-type": "application/json"},
                      json.dumps(document).encode("utf-8"))
