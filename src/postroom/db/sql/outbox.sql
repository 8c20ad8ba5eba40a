-- The outbox of replies and the receiver's receipts. Reply transitions are guarded by state
-- and fence exactly like task transitions.

-- name: reply_insert
-- Write a terminal task's reply; its id and content never change afterwards. Its fence
-- starts at the floor of replies (see fence_floor_raise in tasks.sql).
INSERT INTO replies (reply_id, task_id, status, body, fingerprint, state, attempts, budget,
                     fence, available_at, created_at, updated_at)
VALUES (:reply_id, :task_id, :status, :body, :fingerprint, 'pending', 0, :budget,
        (SELECT floor FROM postroom_fence_floors WHERE kind = 'reply'), :now, :now, :now)

-- name: reply_get
-- One reply, whole, by its task.
SELECT * FROM replies WHERE task_id = :task_id

-- name: reply_get_by_id
-- One reply, whole, by its id.
SELECT * FROM replies WHERE reply_id = :reply_id

-- name: replies_lease_expired
-- Replies whose publisher's lease ran out while sending, oldest first (bounded sweep,
-- locked rows skipped).
SELECT reply_id, owner, fence, attempts, budget FROM replies
WHERE state = 'sending' AND lease_until <= :now
ORDER BY lease_until
LIMIT :limit
{skip_locked}

-- name: claim_replies
-- Pick up to :limit replies due for delivery, oldest first, and mark them sending.
-- ({or_fail}: see the SQLite dialect; the transaction rolls back on any error anyway.)
WITH picked AS (
    SELECT reply_id FROM replies
    WHERE state = 'pending' AND available_at <= :now
    ORDER BY available_at
    LIMIT :limit
    {skip_locked}
)
UPDATE {or_fail} replies
SET state = 'sending', owner = :owner, lease_until = :lease_until, fence = fence + 1,
    attempts = attempts + 1, updated_at = :now
FROM picked
WHERE replies.reply_id = picked.reply_id AND replies.state = 'pending'
RETURNING replies.reply_id, replies.task_id, replies.body, replies.fingerprint,
          replies.fence, replies.attempts, replies.budget, replies.lease_until

-- name: reply_apply
-- Apply a decision to a reply still in the state and fence it was decided on.
UPDATE replies
SET state = :to_state, owner = NULL, lease_until = NULL, available_at = :available_at,
    last_error = :last_error, sent_at = :sent_at, updated_at = :now
WHERE reply_id = :reply_id AND state = :from_state AND fence = :fence
RETURNING reply_id

-- name: reply_apply_owned
-- Record a publisher's delivery outcome: only while its claim is the current one. The
-- outcome was decided from the claim's attempt and budget, and what was delivered is its
-- body: a claim whose copy of them differs from the reply's own is not this reply's claim.
UPDATE replies
SET state = :to_state, owner = NULL, lease_until = NULL, available_at = :available_at,
    last_error = :last_error, sent_at = :sent_at, updated_at = :now
WHERE reply_id = :reply_id AND state = 'sending' AND owner = :claim_owner AND fence = :fence
  AND task_id = :task_id AND attempts = :attempt AND budget = :budget AND body = :body
  AND fingerprint = :fingerprint
RETURNING reply_id

-- name: reply_requeue
-- An operator sends a dead reply again: a fresh delivery budget, same id and content.
UPDATE replies
SET state = 'pending', attempts = 0, available_at = :now, updated_at = :now
WHERE reply_id = :reply_id AND state = 'dead'
RETURNING attempts

-- name: requeue_insert
-- Record who decided to send a dead reply again, when and why.
INSERT INTO reply_requeues (reply_id, operator, reason, requeued_at, previous_attempts,
                            previous_error)
VALUES (:reply_id, :operator, :reason, :now, :previous_attempts, :previous_error)

-- name: requeues_for_reply
-- The recorded requeue decisions of one reply, oldest first.
SELECT * FROM reply_requeues WHERE reply_id = :reply_id ORDER BY requeue_id

-- name: reply_counts
-- How many replies are in each state.
SELECT state, count(*) AS n FROM replies GROUP BY state

-- name: receipt_insert
-- Receiver: record a reply's receipt unless its id was already received.
INSERT INTO receiver_receipts (reply_id, fingerprint, body, received_at)
VALUES (:reply_id, :fingerprint, :body, :now)
ON CONFLICT (reply_id) DO NOTHING
RETURNING reply_id

-- name: receipt_get
-- Receiver: the stored receipt of a reply id.
SELECT * FROM receiver_receipts WHERE reply_id = :reply_id

-- name: effect_insert
-- Receiver: the business effect of a newly received reply (at most one per reply id).
INSERT INTO receiver_effects (reply_id, task_id, status, result, applied_at)
VALUES (:reply_id, :task_id, :status, :result, :now)

-- name: effect_count
-- Receiver: how many effects a reply id has (0 or 1 when the invariants hold).
SELECT count(*) AS n FROM receiver_effects WHERE reply_id = :reply_id

-- name: effects_total
-- Receiver: how many effects there are in all.
SELECT count(*) AS n FROM receiver_effects
