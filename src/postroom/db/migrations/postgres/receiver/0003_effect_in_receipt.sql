-- postroom receiver, version 3 (PostgreSQL): a receipt and the effect recorded with it are one
-- row (see the SQLite schema): one heap tuple and one entry in each index per reply, where
-- there were two tuples, an entry in the effects' key too, and a second statement.

ALTER TABLE receiver_receipts
    ALTER COLUMN fingerprint DROP NOT NULL,
    ALTER COLUMN body DROP NOT NULL,
    ALTER COLUMN received_at DROP NOT NULL,
    ADD COLUMN task_id TEXT,
    ADD COLUMN status TEXT,
    ADD COLUMN result TEXT,
    ADD COLUMN applied_at DOUBLE PRECISION;
UPDATE receiver_receipts
SET task_id = receiver_effects.task_id, status = receiver_effects.status,
    result = receiver_effects.result, applied_at = receiver_effects.applied_at
FROM receiver_effects
WHERE receiver_effects.id = receiver_receipts.id
  AND receiver_effects.reply_id = receiver_receipts.reply_id;
-- (Past every id already taken, whoever took it.)
SELECT setval(pg_get_serial_sequence('receiver_receipts', 'id'), coalesce(max(id), 0) + 1,
              false)
FROM receiver_receipts;
INSERT INTO receiver_receipts (reply_id, task_id, status, result, applied_at)
SELECT reply_id, task_id, status, result, applied_at FROM receiver_effects
ORDER BY id
ON CONFLICT (reply_id) DO NOTHING;
ALTER TABLE receiver_receipts
    ADD CONSTRAINT receiver_receipts_receipt_whole
        CHECK ((fingerprint IS NULL) = (body IS NULL) AND (body IS NULL) = (received_at IS NULL)),
    ADD CONSTRAINT receiver_receipts_effect_whole
        CHECK ((task_id IS NULL) = (status IS NULL) AND (status IS NULL) = (applied_at IS NULL)),
    ADD CONSTRAINT receiver_receipts_not_empty
        CHECK (body IS NOT NULL OR applied_at IS NOT NULL);
DROP TABLE receiver_effects;
