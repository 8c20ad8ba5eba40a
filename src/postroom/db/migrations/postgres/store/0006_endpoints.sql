-- postroom store, version 6 (PostgreSQL): where each principal's replies are delivered
-- (SPEC §4, §10), as in the SQLite schema.

-- One endpoint per principal (the requester a reply goes to). A disabled endpoint keeps its
-- row, with when and why (e.g. "410 Gone at ..."), and gets nothing until it is enabled.
-- delays is the JSON array of its retry schedule's seconds (empty: the store's backoff),
-- schedule its preset's name or 'custom'.
CREATE TABLE endpoints (
    principal        TEXT PRIMARY KEY,
    url              TEXT NOT NULL,
    allow_private    INTEGER NOT NULL CHECK (allow_private IN (0, 1)),
    schedule         TEXT NOT NULL,
    delays           TEXT NOT NULL,
    budget           INTEGER NOT NULL CHECK (budget BETWEEN 1 AND 100),
    concurrency      INTEGER NOT NULL CHECK (concurrency BETWEEN 1 AND 256),
    disabled_at      REAL,
    disabled_reason  TEXT,
    created_at       REAL NOT NULL,
    updated_at       REAL NOT NULL,
    CHECK ((disabled_at IS NULL) = (disabled_reason IS NULL))
);

-- Its signing secrets, numbered in the order they were made; several are active during a
-- rotation. Stored as they are: the sender computes an HMAC with each.
-- allow_private is 0 or 1 on both backends, so that one SQL serves both.
CREATE TABLE endpoint_secrets (
    principal   TEXT NOT NULL REFERENCES endpoints (principal) ON DELETE CASCADE,
    secret_id   INTEGER NOT NULL CHECK (secret_id >= 1),
    secret      TEXT NOT NULL,
    created_at  REAL NOT NULL,
    expires_at  REAL,
    PRIMARY KEY (principal, secret_id)
);

-- A pending reply whose requester had no enabled endpoint when it came due is parked: it
-- leaves the head of the claimable replies (so a backlog of them costs a claim nothing) and
-- keeps its delivery budget, until an endpoint for its requester is added or enabled.
ALTER TABLE replies ADD COLUMN parked_at REAL;
DROP INDEX replies_ready;
CREATE INDEX replies_ready ON replies (available_at) WHERE state = 'pending' AND parked_at IS NULL;
CREATE INDEX replies_parked ON replies (requester) WHERE parked_at IS NOT NULL;
