"""The process the profiles scenarios sample: ``python -m postroom._bench.profiled STORE_URL
RECEIVER_URL CALLS``.

It makes what each kernel call needs first (unsampled: the envelopes, the waits to signal), then
for each step of ``profiles.STEPS`` prints ``ready STEP``, waits for a line on its standard
input (the sampler has attached), makes ``CALLS`` calls one at a time, and prints ``done STEP
SECONDS``. After the last step it checks the run (one receiver effect per task, a clean audit of
both databases) and prints ``checked``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import postroom
from postroom._bench.context import BenchError
from postroom._bench.scenarios.end_to_end import _check, _envelope, one_task
from postroom._bench.scenarios.profiles import STEPS

_AUTH = postroom.AuthContext(principal="bench")
_DAY = 86_400.0
_WARM_UP = 3


def _step(name: str, loop: Callable[[], None]) -> None:
    print(f"ready {name}", flush=True)
    if not sys.stdin.readline():
        raise BenchError("the sampler went away")
    start = time.perf_counter()
    loop()
    print(f"done {name} {time.perf_counter() - start:.6f}", flush=True)


def main(store_url: str, receiver_url: str, calls: int) -> None:
    """Run each kernel call ``calls`` times, one step after another, as announced."""
    with postroom.open_store(store_url) as store, postroom.Receiver.open(receiver_url) as receiver:
        transport = postroom.InProcessTransport(receiver)
        deadline = time.time() + _DAY
        for n in range(_WARM_UP):  # the statements prepared, the files' first pages
            one_task(store, transport, -1 - n)
        envelopes = [_envelope(n, deadline) for n in range(calls)]
        claims: list[postroom.Claim] = []

        def receive() -> None:
            for envelope in envelopes:
                store.receive(_AUTH, envelope)

        def claim_each() -> None:
            for _ in range(calls):
                claim = store.claim("worker")
                if claim is None:
                    raise BenchError("a received task could not be claimed")
                claims.append(claim)

        def finish() -> None:
            for n, claim in enumerate(claims):
                store.finish(claim, {"n": n})

        def dispatch() -> None:
            for _ in range(calls):
                if store.dispatch(transport).sent != 1:
                    raise BenchError("a reply was not delivered")

        flows = [f"profile/{n}" for n in range(calls)]
        for flow in flows:
            if store.open_wait(flow, "step", 0, deadline).result \
                    is not postroom.OpenResult.OPENED:
                raise BenchError(f"the wait {flow} did not open")

        def signal() -> None:
            for n, flow in enumerate(flows):
                answer = store.signal(_AUTH, f"event-{n}", flow, "step", 1, {"n": n})
                if answer.result is not postroom.SignalResult.ACCEPTED:
                    raise BenchError(f"the signal of {flow} returned {answer.result}")

        loops = {"receive": receive, "claim": claim_each, "finish": finish,
                 "dispatch": dispatch, "signal": signal}
        for step in STEPS:
            _step(step, loops[step])
        _check(store, receiver, calls + _WARM_UP)
    print("checked", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
