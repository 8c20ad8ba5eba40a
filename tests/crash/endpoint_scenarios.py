"""The crash table of the endpoint operations and of handing a delivery back (SPEC §4, §9),
run by ``test_crash_points``.

Each entry finishes task ``m-1`` (its reply to ``planner`` pending), has a child die inside
one endpoint operation, and checks that the crash left nothing or everything; then it
retries as an operator or a dispatcher would and delivers the reply through a routed claim.
Converged: the task done, its reply sent, one receiver effect.
"""

from __future__ import annotations

from collections.abc import Sequence

import postroom
from postroom import ReplyState, transports
from tests.crash.scenarios import REPLY, Call, CommitCrash, call, commits
from tests.crash.world import World

URL = "https://hooks.example.com/planner"


def finished(world: World) -> None:
    world.receive()
    world.work(owner="w-1")


def deliver_routed(world: World) -> None:
    """What a dispatcher does once the endpoint is there: claim for it, deliver, record."""
    claims = world.store.claim_replies("d-restarted", limit=10, routed=True)
    assert [claim.reply_id for claim in claims] == [REPLY]
    outcomes = transports.deliver(postroom.InProcessTransport(world.receiver), claims)
    assert world.store.record_deliveries(zip(claims, outcomes, strict=True)).sent == 1


class AddEndpoint(CommitCrash):
    """An operator adds the endpoint a parked reply waits for, and the process dies."""

    def setup(self, world: World) -> None:
        finished(world)
        assert world.store.claim_replies("d", routed=True) == []  # parks it

    def steps(self, world: World) -> Sequence[Call]:
        return [call("add_endpoint", principal="planner", url=URL)]

    def left_nothing(self, world: World) -> None:
        assert world.store.endpoints() == {}
        assert world.store.awaiting_endpoints() == {"planner": 1}

    def left_everything(self, world: World) -> None:
        assert list(world.store.endpoints()) == ["planner"]
        assert world.store.awaiting_endpoints() == {}  # unparked with the endpoint

    def retry(self, world: World) -> None:
        if not self.committed:
            world.store.add_endpoint("planner", URL)
        deliver_routed(world)


class RotateEndpoint(CommitCrash):
    """An operator rotates the endpoint's secret, and the process dies."""

    def setup(self, world: World) -> None:
        finished(world)
        world.store.add_endpoint("planner", URL)

    def steps(self, world: World) -> Sequence[Call]:
        return [call("rotate_endpoint", principal="planner")]

    def left_nothing(self, world: World) -> None:
        assert len(world.store.endpoint("planner").secrets) == 1

    def left_everything(self, world: World) -> None:
        assert len(world.store.endpoint("planner").secrets) == 2

    def retry(self, world: World) -> None:
        if not self.committed:
            world.store.rotate_endpoint_secret("planner")
        deliver_routed(world)


class RemoveEndpoint(CommitCrash):
    """An operator removes the endpoint, and the process dies; a new one is added later."""

    def setup(self, world: World) -> None:
        finished(world)
        world.store.add_endpoint("planner", URL)

    def steps(self, world: World) -> Sequence[Call]:
        return [call("remove_endpoint", principal="planner")]

    def left_nothing(self, world: World) -> None:
        assert list(world.store.endpoints()) == ["planner"]

    def left_everything(self, world: World) -> None:
        assert world.store.endpoints() == {}

    def retry(self, world: World) -> None:
        assert world.store.remove_endpoint("planner") is not self.committed
        assert world.store.claim_replies("d", routed=True) == []  # waits, budget kept
        world.store.add_endpoint("planner", URL + "/new")
        deliver_routed(world)


class HandBack(CommitCrash):
    """A stopping dispatcher dies handing back a claimed reply it had not sent."""

    def setup(self, world: World) -> None:
        finished(world)
        world.store.add_endpoint("planner", URL)

    def steps(self, world: World) -> Sequence[Call]:
        return [call("claim_and_release", owner="d-dead")]

    def left_nothing(self, world: World) -> None:
        reply = world.reply()
        assert reply is not None
        assert (reply.state, reply.owner, reply.attempts) == (ReplyState.SENDING, "d-dead", 1)

    def left_everything(self, world: World) -> None:
        reply = world.reply()
        assert reply is not None
        assert (reply.state, reply.owner, reply.attempts, reply.fence) == (
            ReplyState.PENDING, None, 0, 1)

    def retry(self, world: World) -> None:
        if not self.committed:  # the dead dispatcher's claim holds until its lease ends
            reply = world.reply()
            assert reply is not None and reply.lease_until is not None
            world.clock.set(reply.lease_until)
        deliver_routed(world)


ENDPOINT_CRASHES = {
    **commits("endpoint.add", AddEndpoint),
    **commits("endpoint.change", RotateEndpoint),
    **commits("endpoint.remove", RemoveEndpoint),
    **commits("dispatch.release", HandBack),
}
