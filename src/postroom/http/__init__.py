"""postroom over HTTP. ``receiving`` is the receiving side of webhooks: a plain ASGI app
that needs no web framework."""
