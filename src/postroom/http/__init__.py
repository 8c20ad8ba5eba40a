"""postroom over HTTP: ``app`` is the service (``postroom serve``: the API from one route
table, its OpenAPI document, bearer tokens mapped to principals with roles), built from
``routing``, ``auth``, ``problems``, ``schemas`` and ``api``; ``receiving`` is the receiving
side of webhooks, a plain ASGI app that needs no web framework (``asgi`` holds what the
plain apps share)."""
