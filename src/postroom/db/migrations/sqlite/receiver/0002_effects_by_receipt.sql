-- postroom receiver, version 2: a receipt is keyed inside the receiver by an integer in
-- arrival order, with its reply_id as the one unique index, and its effect is keyed by its
-- receipt's integer. The effect's row then goes at the end of its table instead of into a
-- second index of random 70-character keys (whose leaves split often): on SQLite a receipt
-- and its effect write about four pages of WAL where they wrote six. At most one effect per
-- reply id is still the key's to enforce: one receipt per reply id, one effect per receipt.

CREATE TABLE receiver_receipts_v2 (
    id           INTEGER PRIMARY KEY,
    reply_id     TEXT NOT NULL UNIQUE,
    fingerprint  TEXT NOT NULL,
    body         TEXT NOT NULL,
    received_at  REAL NOT NULL
);
INSERT INTO receiver_receipts_v2 (reply_id, fingerprint, body, received_at)
SELECT reply_id, fingerprint, body, received_at FROM receiver_receipts
ORDER BY received_at, reply_id;

CREATE TABLE receiver_effects_v2 (
    -- Its receipt's id.
    id          INTEGER PRIMARY KEY,
    reply_id    TEXT NOT NULL,
    task_id     TEXT NOT NULL,
    status      TEXT NOT NULL,
    result      TEXT,
    applied_at  REAL NOT NULL
);
-- (An effect without its receipt, which the audit reports, gets a key no receipt has.)
INSERT INTO receiver_effects_v2 (id, reply_id, task_id, status, result, applied_at)
SELECT coalesce(receiver_receipts_v2.id,
                -row_number() OVER (ORDER BY receiver_effects.reply_id)),
       receiver_effects.reply_id, receiver_effects.task_id,
       receiver_effects.status, receiver_effects.result, receiver_effects.applied_at
FROM receiver_effects
LEFT JOIN receiver_receipts_v2 ON receiver_receipts_v2.reply_id = receiver_effects.reply_id;

DROP TABLE receiver_effects;
DROP TABLE receiver_receipts;
ALTER TABLE receiver_receipts_v2 RENAME TO receiver_receipts;
ALTER TABLE receiver_effects_v2 RENAME TO receiver_effects;
