-- postroom store, version 7 (PostgreSQL): scheduling and flow control. Tasks may be held until a time
-- (not_before) and carry a priority; claims take them in order of claim_at, when a task's
-- priority says it should run (see tasks.claim_at_for); queues can be paused, limited to a
-- number of tasks running at once across every host, and a finished task run again by an
-- operator's recorded decision.

-- An envelope's not_before (NULL: at once) and priority (-10..10, higher first).
ALTER TABLE tasks ADD COLUMN not_before DOUBLE PRECISION;
ALTER TABLE tasks ADD COLUMN priority INTEGER NOT NULL DEFAULT 0
    CHECK (priority BETWEEN -10 AND 10);
-- When a pending task's turn comes: its availability moved earlier by its priority (a level
-- is worth Settings.priority_weight seconds of waiting). Claims walk it, head first.
ALTER TABLE tasks ADD COLUMN claim_at DOUBLE PRECISION;
UPDATE tasks SET claim_at = available_at;
DROP INDEX tasks_claimable;
CREATE INDEX tasks_claimable ON tasks (queue, claim_at) WHERE state = 'pending';
-- The task this one runs again (an operator's re-run; NULL for any other task).
ALTER TABLE tasks ADD COLUMN retry_of TEXT;

-- An operator's decision to run a failed, expired or cancelled task again: who, when, why,
-- and the new task it made. Numbered per task: the n-th re-run of one task is one identity.
CREATE TABLE task_retries (
    task_id      TEXT NOT NULL,
    number       INTEGER NOT NULL CHECK (number >= 1),
    new_task_id  TEXT NOT NULL UNIQUE,
    operator     TEXT NOT NULL,
    reason       TEXT NOT NULL,
    retried_at   DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (task_id, number)
);

-- Queues whose tasks are not claimed for now (running ones finish). One row per paused queue.
CREATE TABLE paused_queues (
    queue      TEXT PRIMARY KEY,
    operator   TEXT NOT NULL,
    reason     TEXT NOT NULL,
    paused_at  DOUBLE PRECISION NOT NULL
);

-- At most `running` tasks of a queue run at once across every host. A claim takes one of the
-- queue's slots for each task it claims; a slot is free again once its holder is no longer
-- running at the fence it was claimed with (nothing has to give it back).
CREATE TABLE queue_limits (
    queue    TEXT PRIMARY KEY,
    running  INTEGER NOT NULL CHECK (running BETWEEN 1 AND 10000)
);
CREATE TABLE queue_slots (
    queue    TEXT NOT NULL REFERENCES queue_limits (queue) ON DELETE CASCADE,
    slot     INTEGER NOT NULL CHECK (slot >= 1),
    task_id  TEXT,
    fence    BIGINT,
    PRIMARY KEY (queue, slot)
);
