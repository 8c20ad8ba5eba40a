-- postroom store, version 2 (PostgreSQL): durable waits, signal receipts, continuations and
-- their effects (SPEC §5), mirroring the SQLite schema with DOUBLE PRECISION times. A wait is
-- addressed by (flow, step, generation); the slot (flow, step) holds the current generation.
-- The unique keys below make "one outcome per generation" and "one effect per consumed
-- continuation" properties of the schema, not only of careful code.

-- The current generation of each (flow, step); 0 is never stored (no row means 0).
CREATE TABLE wait_slots (
    flow        TEXT NOT NULL,
    step        TEXT NOT NULL,
    generation  INTEGER NOT NULL CHECK (generation >= 1),
    PRIMARY KEY (flow, step)
);

-- Every generation keeps its own row. event_principal/event_id name the adopted signal.
CREATE TABLE waits (
    flow             TEXT NOT NULL,
    step             TEXT NOT NULL,
    generation       INTEGER NOT NULL CHECK (generation >= 1),
    state            TEXT NOT NULL CHECK (state IN ('waiting', 'signaled', 'timed_out')),
    deadline         DOUBLE PRECISION NOT NULL,
    task_id          TEXT,
    request_id       TEXT,
    opened_at        DOUBLE PRECISION NOT NULL,
    ended_at         DOUBLE PRECISION,
    event_principal  TEXT,
    event_id         TEXT,
    PRIMARY KEY (flow, step, generation),
    FOREIGN KEY (flow, step) REFERENCES wait_slots (flow, step)
);
-- At most one generation of a slot is waiting.
CREATE UNIQUE INDEX waits_one_waiting ON waits (flow, step) WHERE state = 'waiting';
-- The sweep of due waits reads the head of this index, in one total order (so concurrent
-- sweepers lock slots in the same order).
CREATE INDEX waits_due ON waits (deadline, flow, step, generation) WHERE state = 'waiting';
-- Pruning keeps a task while a wait still needs it as the parent of its follow-up.
CREATE INDEX waits_by_task ON waits (task_id) WHERE task_id IS NOT NULL;
-- A registration's request id answers for one generation of its slot.
CREATE UNIQUE INDEX waits_by_request ON waits (flow, step, request_id)
    WHERE request_id IS NOT NULL;

-- Signal receipts, keyed by the authenticated principal and its event id; never updated.
-- The body (flow, step, generation, value) binds the event id: same id, other body = conflict.
CREATE TABLE wait_receipts (
    principal    TEXT NOT NULL,
    event_id     TEXT NOT NULL,
    flow         TEXT NOT NULL,
    step         TEXT NOT NULL,
    generation   INTEGER NOT NULL,
    value        TEXT NOT NULL,
    result       TEXT NOT NULL CHECK (result IN ('accepted', 'too_late', 'stale_generation',
                                                 'closed', 'unknown_wait')),
    received_at  DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (principal, event_id)
);
-- One accepted signal per wait generation.
CREATE UNIQUE INDEX wait_receipts_one_accepted ON wait_receipts (flow, step, generation)
    WHERE result = 'accepted';

-- One continuation per ended wait generation, written with its terminal state.
CREATE TABLE wait_continuations (
    flow         TEXT NOT NULL,
    step         TEXT NOT NULL,
    generation   INTEGER NOT NULL,
    kind         TEXT NOT NULL CHECK (kind IN ('signal', 'timeout')),
    value        TEXT,
    created_at   DOUBLE PRECISION NOT NULL,
    consumed_at  DOUBLE PRECISION,
    PRIMARY KEY (flow, step, generation),
    FOREIGN KEY (flow, step, generation) REFERENCES waits (flow, step, generation)
);
-- A restarted process lists what is left to resume from the head of this index.
CREATE INDEX wait_continuations_unconsumed
    ON wait_continuations (created_at, flow, step, generation) WHERE consumed_at IS NULL;

-- The local effect of a consumed continuation: at most one, by its key.
CREATE TABLE wait_effects (
    flow        TEXT NOT NULL,
    step        TEXT NOT NULL,
    generation  INTEGER NOT NULL,
    kind        TEXT NOT NULL CHECK (kind IN ('task', 'none')),
    task_id     TEXT,
    applied_at  DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (flow, step, generation),
    FOREIGN KEY (flow, step, generation) REFERENCES wait_continuations (flow, step, generation)
);
