"""The peers' own programs for ``postroom bench --only peers`` and ``--only pg-peers``.

Each module is a script run as a child process with the peer's library (the optional
``bench`` extra; oban's needs Python >= 3.12 and runs in a virtual environment of its own):
``python MODULE.py enqueue URL N`` enqueues ``N`` trivial jobs one at a time and prints the
seconds it took as JSON; ``python MODULE.py work URL WORKERS`` runs the peer's own worker
until it is sent SIGTERM. A module imports nothing from postroom, so that an interpreter
without postroom can run it.
"""
