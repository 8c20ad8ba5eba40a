"""The authentication step: a bearer token becomes a principal, and only then an ``AuthContext``.

``authenticate(store, authorization)`` takes the ``Authorization`` header's value and returns
the ``Caller``: the stored ``Principal`` the token belongs to and the ``AuthContext`` the
store is called with. Anything else (no header, another scheme, an unknown, rotated-out or
revoked token) is one 401 problem, the same whatever failed. It reads the database: call it
in a worker thread (``anyio.to_thread``), as the route dispatcher does. The dashboard's login
(a token kept in a cookie) authenticates through the same function.
"""

from __future__ import annotations

from dataclasses import dataclass

from postroom import AuthContext, Principal, Store, Unauthorized
from postroom.http.problems import Problem

__all__ = ["UNAUTHENTICATED", "Caller", "authenticate"]

#: The one answer to a request whose token is missing or not valid.
UNAUTHENTICATED = Problem(401, "unauthenticated", "Unauthenticated",
                          "send a valid token: Authorization: Bearer <token>",
                          headers={"www-authenticate": 'Bearer realm="postroom"'})


@dataclass(frozen=True, slots=True)
class Caller:
    """An authenticated principal and the ``AuthContext`` built for it."""

    principal: Principal
    auth: AuthContext


def authenticate(store: Store, authorization: str | None) -> Caller:
    """The caller whose bearer token ``authorization`` (the header's value) carries;
    ``UNAUTHENTICATED`` otherwise."""
    if authorization is None:
        raise UNAUTHENTICATED
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise UNAUTHENTICATED
    try:
        principal = store.authenticate(token.strip())
    except Unauthorized:
        raise UNAUTHENTICATED from None
    return Caller(principal=principal, auth=AuthContext(principal=principal.name))
