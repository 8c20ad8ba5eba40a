"""The runtime: the processes that run postroom's work, built only on the store's public
face (nothing here is needed to use a store from a program of one's own).

- ``handlers``: the registry a user fills (a handler per queue, a resumer per wait step),
  the ``Context`` a handler is given, and the outcomes it can end with;
- ``worker``: ``postroom worker``'s process - claims as many tasks as it has free slots,
  runs their handlers (plain functions in threads, coroutines on an event loop), renews
  their leases together and group-commits their outcomes;
- ``dispatcher``: ``postroom dispatch``'s process - claims replies in batches and delivers
  each to its requester's endpoint (``transports.webhook``: signed Standard Webhooks POSTs,
  an SSRF guard on the address connected to), each endpoint within its own concurrency;
- ``duty``: the one start/stop protocol of the background duties, and the runner that keeps
  a duty's crash from killing the process; the duties themselves are ``rescuer`` (expired
  leases), ``deadlines`` (passed deadlines), ``wait_timer`` (due waits), ``continuations``
  (resuming ended waits), ``pruner`` (retention) and ``scheduler`` (periodic schedules).

    from postroom.runtime import App, Context

    app = App()

    @app.handler("emails")
    def send(payload: dict, ctx: Context) -> dict:
        return {"sent": payload["to"]}
"""

from postroom.runtime.handlers import App, Context, PermanentFailure

__all__ = ["App", "Context", "PermanentFailure"]
