-- postroom receiver, version 1: receipts (dedupe by reply_id + content fingerprint) and the
-- business effects committed with them.

CREATE TABLE receiver_receipts (
    reply_id     TEXT PRIMARY KEY,
    fingerprint  TEXT NOT NULL,
    body         TEXT NOT NULL,
    received_at  REAL NOT NULL
);

CREATE TABLE receiver_effects (
    reply_id    TEXT PRIMARY KEY,
    task_id     TEXT NOT NULL,
    status      TEXT NOT NULL,
    result      TEXT,
    applied_at  REAL NOT NULL
);
