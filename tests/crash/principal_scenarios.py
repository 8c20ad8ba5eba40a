"""The crash table of the principals of the HTTP service (SPEC §9), run by
``test_crash_points``.

An operator adds a worker principal (or rotates its token) and the process dies. A token is
shown only once, so after a crash past the commit the operator cannot know it: the retry
rotates, which makes a new one and stops the lost one. Then the worker works task ``m-1``
under its principal (as the service records it) and the reply is delivered. Converged: the
token the operator holds authenticates the worker, the task is done, its reply sent once.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

import postroom
from tests.crash.scenarios import Call, CommitCrash, call, commits
from tests.crash.world import World


def serve_the_worker(world: World, token: str) -> None:
    """What the service does for the worker holding ``token``."""
    worker = world.store.authenticate(token)
    world.work(owner=f"http:{worker.name}")
    world.dispatch()


class AddPrincipal(CommitCrash):
    """An operator adds a worker, and the process dies."""

    def steps(self, world: World) -> Sequence[Call]:
        return [call("add_principal", principal="remote", role="worker", queues=["default"])]

    def left_nothing(self, world: World) -> None:
        assert world.store.list_principals() == []

    def left_everything(self, world: World) -> None:
        (added,) = world.store.list_principals()
        assert (added.name, added.role, added.queues) == ("remote", "worker", ("default",))

    def retry(self, world: World) -> None:
        if self.committed:  # the token was lost with the process: make another
            with pytest.raises(postroom.Conflict):
                world.store.add_principal("remote", "worker", queues=["default"])
            token = world.store.rotate_token("remote").token
        else:
            token = world.store.add_principal("remote", "worker", queues=["default"]).token
        serve_the_worker(world, token)


class RotateToken(CommitCrash):
    """An operator rotates a worker's token, and the process dies."""

    def setup(self, world: World) -> None:
        world.receive()
        self.first = world.store.add_principal("remote", "worker", queues=["default"]).token

    def steps(self, world: World) -> Sequence[Call]:
        return [call("rotate_token", principal="remote")]

    def left_nothing(self, world: World) -> None:
        assert world.store.authenticate(self.first).name == "remote"

    def left_everything(self, world: World) -> None:
        with pytest.raises(postroom.Unauthorized):
            world.store.authenticate(self.first)

    def retry(self, world: World) -> None:
        serve_the_worker(world, world.store.rotate_token("remote").token)


PRINCIPAL_CRASHES = {
    **commits("principal.add", AddPrincipal),
    **commits("principal.change", RotateToken),
}
