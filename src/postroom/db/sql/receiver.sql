-- The receiving side of replies, on its own database: one row per reply id, holding its
-- receipt (the body and the content fingerprint the receiver computed itself) and the effect
-- recorded with it.

-- name: receipt_insert
-- Receiver: record a reply's receipt and its effect unless its id was already received.
INSERT INTO receiver_receipts (reply_id, fingerprint, body, received_at, task_id, status,
                               result, applied_at)
VALUES (:reply_id, :fingerprint, :body, :now, :task_id, :status, :result, :now)
ON CONFLICT (reply_id) DO NOTHING
RETURNING id

-- name: receipt_get
-- Receiver: the stored receipt of a reply id.
SELECT * FROM receiver_receipts WHERE reply_id = :reply_id

-- name: effect_count
-- Receiver: how many effects a reply id has (0 or 1).
SELECT count(*) AS n FROM receiver_receipts
WHERE reply_id = :reply_id AND applied_at IS NOT NULL

-- name: effects_total
-- Receiver: how many effects there are in all.
SELECT count(*) AS n FROM receiver_receipts WHERE applied_at IS NOT NULL
