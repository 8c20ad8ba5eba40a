-- postroom receiver, version 3: a receipt and the effect recorded with it are one row. They
-- were two rows in two tables, one for one and always written together, and the effect held
-- nothing the receipt's body does not (its task, status and result): taking a reply now writes
-- one row and its reply_id's index entry, a page fewer of WAL, with one statement where it
-- took two. At most one effect per reply id is now the unique reply_id's to keep.
--
-- The effect's columns are NULL for a receipt without its effect, and the receipt's for an
-- effect without its receipt: neither is ever written, but one carried over from an earlier
-- version is kept (the audit names it) rather than dropped. An effect whose reply id already
-- has its own is the one thing a row cannot carry; an earlier audit named it.

CREATE TABLE receiver_receipts_v3 (
    id           INTEGER PRIMARY KEY,
    reply_id     TEXT NOT NULL UNIQUE,
    fingerprint  TEXT,
    body         TEXT,
    received_at  REAL,
    -- The effect: the task the reply answers, its status and result (canonical JSON).
    task_id      TEXT,
    status       TEXT,
    result       TEXT,
    applied_at   REAL,
    CHECK ((fingerprint IS NULL) = (body IS NULL) AND (body IS NULL) = (received_at IS NULL)),
    CHECK ((task_id IS NULL) = (status IS NULL) AND (status IS NULL) = (applied_at IS NULL)),
    CHECK (body IS NOT NULL OR applied_at IS NOT NULL)
);
INSERT INTO receiver_receipts_v3 (id, reply_id, fingerprint, body, received_at, task_id,
                                  status, result, applied_at)
SELECT receiver_receipts.id, receiver_receipts.reply_id, receiver_receipts.fingerprint,
       receiver_receipts.body, receiver_receipts.received_at, receiver_effects.task_id,
       receiver_effects.status, receiver_effects.result, receiver_effects.applied_at
FROM receiver_receipts
LEFT JOIN receiver_effects ON receiver_effects.id = receiver_receipts.id
                          AND receiver_effects.reply_id = receiver_receipts.reply_id
ORDER BY receiver_receipts.id;
INSERT INTO receiver_receipts_v3 (reply_id, task_id, status, result, applied_at)
SELECT reply_id, task_id, status, result, applied_at FROM receiver_effects
WHERE true
ORDER BY id
ON CONFLICT (reply_id) DO NOTHING;

DROP TABLE receiver_effects;
DROP TABLE receiver_receipts;
ALTER TABLE receiver_receipts_v3 RENAME TO receiver_receipts;
