-- The receiving side of replies, on its own database: receipts keyed by reply_id with the
-- content fingerprint the receiver computed itself, and at most one business effect each
-- (keyed by its receipt's id).

-- name: receipt_insert
-- Receiver: record a reply's receipt unless its id was already received.
INSERT INTO receiver_receipts (reply_id, fingerprint, body, received_at)
VALUES (:reply_id, :fingerprint, :body, :now)
ON CONFLICT (reply_id) DO NOTHING
RETURNING id

-- name: receipt_get
-- Receiver: the stored receipt of a reply id.
SELECT * FROM receiver_receipts WHERE reply_id = :reply_id

-- name: effect_insert
-- Receiver: the business effect of a newly received reply, keyed by its receipt's id (at most
-- one per reply id).
INSERT INTO receiver_effects (id, reply_id, task_id, status, result, applied_at)
VALUES (:receipt, :reply_id, :task_id, :status, :result, :now)

-- name: effect_count
-- Receiver: how many effects a reply id has (0 or 1 when the invariants hold).
SELECT count(*) AS n FROM receiver_effects
JOIN receiver_receipts ON receiver_receipts.id = receiver_effects.id
WHERE receiver_receipts.reply_id = :reply_id AND receiver_effects.reply_id = :reply_id

-- name: effects_total
-- Receiver: how many effects there are in all.
SELECT count(*) AS n FROM receiver_effects
