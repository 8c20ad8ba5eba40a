"""The authentication step: a bearer token becomes a principal, and only then an ``AuthContext``.

``authenticate(store, authorization)`` takes the ``Authorization`` header's value and returns
the ``Caller``: the stored ``Principal`` the token belongs to and the ``AuthContext`` the
store is called with. Anything else (no header, another scheme, an unknown, rotated-out or
revoked token) is one 401 problem, the same whatever failed. It reads the database: call it
in a worker thread, as the route dispatcher does. The dashboard's login
(a token kept in a cookie) authenticates through the same function.

``Principals`` keeps the principals of the tokens a process has authenticated, so that the
API's routes need not spend a transaction of their own on each request: a route runs
under ``Store.confirming``, and every transaction it makes confirms the token first (a
revoked, rotated-out or expired token writes nothing, and is the same 401).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass

from postroom import AuthContext, Principal, Store, Unauthorized
from postroom.http.problems import Problem

__all__ = ["UNAUTHENTICATED", "Caller", "Principals", "authenticate", "bearer"]

#: The one answer to a request whose token is missing or not valid.
UNAUTHENTICATED = Problem(401, "unauthenticated", "Unauthenticated",
                          "send a valid token: Authorization: Bearer <token>",
                          headers={"www-authenticate": 'Bearer realm="postroom"'})


@dataclass(frozen=True, slots=True)
class Caller:
    """An authenticated principal and the ``AuthContext`` built for it."""

    principal: Principal
    auth: AuthContext


def bearer(authorization: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header's value;
    ``UNAUTHENTICATED`` if there is none."""
    if authorization is None:
        raise UNAUTHENTICATED
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise UNAUTHENTICATED
    return token.strip()


def authenticate(store: Store, authorization: str | None) -> Caller:
    """The caller whose bearer token ``authorization`` (the header's value) carries;
    ``UNAUTHENTICATED`` otherwise."""
    try:
        principal = store.authenticate(bearer(authorization))
    except Unauthorized:
        raise UNAUTHENTICATED from None
    return _caller(principal)


def _caller(principal: Principal) -> Caller:
    return Caller(principal=principal,
                  auth=AuthContext(principal=principal.name, role=principal.role.value))


class Principals:
    """The principals of the last ``size`` tokens this process authenticated, by the token's
    SHA-256 (the tokens themselves are not kept). An entry is only a hint: whoever uses one
    runs under ``Store.confirming``, and ``forget``s it once a transaction refuses it."""

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._known: OrderedDict[bytes, Caller] = OrderedDict()
        self._lock = threading.Lock()

    def caller(self, store: Store, token: str) -> Caller:
        """The caller ``token`` belongs to: from memory, or authenticated (and remembered)."""
        key = hashlib.sha256(token.encode("utf-8")).digest()
        with self._lock:
            known = self._known.get(key)
            if known is not None:
                self._known.move_to_end(key)
                return known
        try:
            caller = _caller(store.authenticate(token))
        except Unauthorized:
            raise UNAUTHENTICATED from None
        with self._lock:
            self._known[key] = caller
            while len(self._known) > self._size:
                self._known.popitem(last=False)
        return caller

    def forget(self, token: str) -> None:
        """Drop what is known of ``token``."""
        with self._lock:
            self._known.pop(hashlib.sha256(token.encode("utf-8")).digest(), None)
