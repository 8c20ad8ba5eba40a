-- postroom store, version 8: periodic schedules. Each schedule enqueues one task per
-- period of its cron expression, identified by the schedule and the period's start, so a
-- second host's enqueue of the same period is a duplicate, never a second task.

CREATE TABLE schedules (
    name         TEXT PRIMARY KEY,
    cron         TEXT NOT NULL,
    zone         TEXT,                  -- an IANA zone; NULL: UTC
    queue        TEXT NOT NULL,
    payload      TEXT NOT NULL,         -- canonical JSON object
    priority     INTEGER NOT NULL DEFAULT 0 CHECK (priority BETWEEN -10 AND 10),
    max_attempts INTEGER NOT NULL CHECK (max_attempts >= 1),
    ttl          REAL,      -- a task's deadline after its period's start; NULL: the next period's start
    missed       TEXT NOT NULL CHECK (missed IN ('once', 'skip')),
    paused       INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1)),
    -- The latest period handled (enqueued, or skipped by the missed policy); NULL: none yet.
    last_period  REAL,
    -- The latest period enqueued, as its task's message_id (ISO UTC), and that task.
    last_key     TEXT,
    last_task_id TEXT,
    -- When the next period begins: the rounds look only at schedules whose next_at has come.
    next_at      REAL NOT NULL,
    created_by   TEXT NOT NULL,
    created_at   REAL NOT NULL,
    updated_by   TEXT NOT NULL,
    updated_at   REAL NOT NULL
);
CREATE INDEX schedules_due ON schedules (next_at) WHERE paused = 0;
