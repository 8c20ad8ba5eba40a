"""Transports the dispatcher delivers replies with: the in-process ``Receiver`` (in
``postroom.transports``) and HTTP webhooks (``webhook``)."""
