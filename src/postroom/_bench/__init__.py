"""postroom's benchmarks, run as ``postroom bench``.

Every figure is a ratio to a raw SQLite commit loop measured in the same run, because
absolute rates say more about the disk than about postroom: a durable commit waits for an
fsync, and that wait differs tenfold between machines.

Layout:

- ``context``: what a scenario is given (sizes, where databases live, the baseline) and
  what it returns (``Measurement`` rows);
- ``scenarios/``: one small module per scenario (raw loop, claim+finish under a backlog,
  end-to-end one at a time and batched, accepted signals, and PostgreSQL's worker processes
  and wake-up latency);
- ``runner``: runs the scenarios, interleaving baseline rounds, and judges the bars;
- ``report``: the JSON document and ``RESULTS.md``;
- ``machine``: what the figures were measured on.

Adding a backend or a scenario: a scenario is ``run(ctx) -> list[Measurement]`` registered in
``runner.SCENARIOS`` with the backend it runs on; it opens its databases with
``ctx.target.url(name)``, so the same code runs on any ``Target`` (``SQLiteTarget`` is a
folder of files; ``PostgresTarget`` hands out fresh schemas and drops them at the end), and
it times its rounds with ``ctx.timed_rounds`` so that each round is divided by the baseline
measured around it. A row's ``backend``, ``unit`` and
``details`` (workers, percentiles, ...) say what it is; ``report`` renders every row.
"""
