-- postroom store, version 1: the inbox, tasks, the outbox of replies, stream cursors and the
-- time high-water mark. Times are seconds since the Unix epoch (REAL); JSON is canonical text.

CREATE TABLE postroom_clock (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    high_water  REAL NOT NULL
);
INSERT INTO postroom_clock (id, high_water) VALUES (1, 0);

-- Accepted messages and follow-ups, exactly as received; the identity is the primary key.
CREATE TABLE inbox (
    task_id      TEXT PRIMARY KEY,
    principal    TEXT NOT NULL,
    message_id   TEXT NOT NULL,
    fingerprint  TEXT NOT NULL,
    envelope     TEXT NOT NULL,
    received_at  REAL NOT NULL
);
CREATE INDEX inbox_by_received_at ON inbox (received_at);

CREATE TABLE tasks (
    task_id         TEXT PRIMARY KEY,
    principal       TEXT NOT NULL,
    message_id      TEXT NOT NULL,
    queue           TEXT NOT NULL,
    state           TEXT NOT NULL CHECK (state IN ('pending', 'running', 'done', 'failed',
                                                   'cancelled', 'expired', 'hop_limit')),
    payload         TEXT NOT NULL,
    deadline        REAL NOT NULL,
    max_attempts    INTEGER NOT NULL,
    hops            INTEGER NOT NULL,
    parent_task_id  TEXT,
    correlation_id  TEXT,
    attempts        INTEGER NOT NULL DEFAULT 0,
    fence           INTEGER NOT NULL DEFAULT 0,
    owner           TEXT,
    lease_until     REAL,
    available_at    REAL NOT NULL,
    result          TEXT,
    last_error      TEXT,
    created_at      REAL NOT NULL,
    updated_at      REAL NOT NULL
);
-- Claiming reads the head of one queue; sweeps read the head of the leases and deadlines.
CREATE INDEX tasks_claimable ON tasks (queue, available_at) WHERE state = 'pending';
CREATE INDEX tasks_running_leases ON tasks (lease_until) WHERE state = 'running';
CREATE INDEX tasks_live_deadlines ON tasks (deadline) WHERE state IN ('pending', 'running');

-- The outbox: one reply per terminal task, content fixed at creation.
CREATE TABLE replies (
    reply_id      TEXT PRIMARY KEY,
    task_id       TEXT NOT NULL UNIQUE,
    status        TEXT NOT NULL,
    body          TEXT NOT NULL,
    fingerprint   TEXT NOT NULL,
    state         TEXT NOT NULL CHECK (state IN ('pending', 'sending', 'sent', 'dead')),
    attempts      INTEGER NOT NULL DEFAULT 0,
    budget        INTEGER NOT NULL,
    fence         INTEGER NOT NULL DEFAULT 0,
    owner         TEXT,
    lease_until   REAL,
    available_at  REAL NOT NULL,
    last_error    TEXT,
    created_at    REAL NOT NULL,
    updated_at    REAL NOT NULL,
    sent_at       REAL
);
CREATE INDEX replies_ready ON replies (available_at) WHERE state = 'pending';
CREATE INDEX replies_sending_leases ON replies (lease_until) WHERE state = 'sending';

-- Operator decisions to send a dead reply again: who, when, why, and what it replaced.
CREATE TABLE reply_requeues (
    requeue_id         INTEGER PRIMARY KEY,
    reply_id           TEXT NOT NULL,
    operator           TEXT NOT NULL,
    reason             TEXT NOT NULL,
    requeued_at        REAL NOT NULL,
    previous_attempts  INTEGER NOT NULL,
    previous_error     TEXT
);
CREATE INDEX reply_requeues_by_reply ON reply_requeues (reply_id);

-- Upstream cursors: which positions of a numbered source are durably stored.
CREATE TABLE streams (
    principal  TEXT NOT NULL,
    stream     TEXT NOT NULL,
    watermark  INTEGER NOT NULL,
    PRIMARY KEY (principal, stream)
);
CREATE TABLE stream_positions (
    principal  TEXT NOT NULL,
    stream     TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    task_id    TEXT NOT NULL,
    PRIMARY KEY (principal, stream, seq)
);
CREATE INDEX stream_positions_by_task ON stream_positions (task_id);
