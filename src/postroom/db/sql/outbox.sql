-- The outbox of replies. Reply transitions are guarded by state and fence exactly like task
-- transitions. (The receiver's receipts are in receiver.sql.) A reply is keyed by its task's
-- id; its reply_id and task_id are found through the task's identity.

-- fragment: reply_of_task
-- The reply of the task :task_id.
replies.id = (SELECT tasks.id FROM tasks WHERE tasks.task_id = :task_id)

-- fragment: reply_named
-- The reply :reply_id ("reply:" and its task's id).
replies.id = (SELECT tasks.id FROM tasks WHERE tasks.task_id = substr(:reply_id, 7))
  AND replies.reply_id = :reply_id

-- name: reply_insert
-- Write a terminal task's reply; its id and content never change afterwards. Its fence
-- starts at the floor of replies (see fence_floor_raise in tasks.sql).
INSERT INTO replies (id, reply_id, task_id, status, body, fingerprint, requester, queue,
                     state, attempts, budget, fence, available_at, created_at, updated_at)
VALUES ((SELECT id FROM tasks WHERE task_id = :task_id), :reply_id, :task_id, :status, :body,
        :fingerprint, :requester, :queue, 'pending', 0, :budget,
        (SELECT floor FROM postroom_fence_floors WHERE kind = 'reply'), :now, :now, :now)

-- name: reply_get
-- One reply, whole, by its task.
SELECT * FROM replies WHERE {reply_of_task}

-- name: reply_get_by_id
-- One reply, whole, by its id.
SELECT * FROM replies WHERE {reply_named}

-- fragment: live_reply
-- The predicate of replies_live, the index of pending (not parked) and sending replies, said
-- in full by every query that walks it: SQLite takes a partial index only for a WHERE that
-- names each of its terms. (A sending reply is never parked.)
state IN ('pending', 'sending') AND parked_at IS NULL

-- name: replies_lease_expired
-- Replies whose publisher's lease ran out while sending, oldest first (bounded sweep,
-- locked rows skipped). A sending reply is due again (available_at) when its lease ends.
SELECT reply_id, owner, fence, attempts, budget FROM replies
WHERE {live_reply} AND state = 'sending' AND available_at <= :now
ORDER BY available_at
LIMIT :limit
{skip_locked}

-- fragment: reply_head
-- The head of the claimable replies: up to :limit due ones, oldest first (locked rows
-- skipped), from the replies_live index; a claim takes them, a routed claim first parks
-- the ones whose requester has no enabled endpoint (replies_park in endpoints.sql).
SELECT id FROM replies
WHERE {live_reply} AND state = 'pending' AND available_at <= :now
ORDER BY available_at
LIMIT :limit
{skip_locked}

-- name: claim_replies
-- Pick up to :limit replies due for delivery, oldest first, and mark them sending: due again
-- when the lease runs out, should the publisher never say how the delivery went. With
-- :routed = 1 only those whose requester has an enabled endpoint are taken (replies_park has
-- just parked the others of the head), and a reply's first attempt fixes its budget to its
-- endpoint's: later attempts keep it, so attempts never exceed the budget they were counted
-- against. ({or_fail}: see the SQLite dialect; the transaction rolls back on any error.)
WITH picked AS ({reply_head})
UPDATE {or_fail} replies
SET state = 'sending', owner = :owner, lease_until = :lease_until,
    available_at = :lease_until, fence = fence + 1, attempts = attempts + 1,
    history = {history_open}, updated_at = :now,
    budget = CASE WHEN :routed = 1 AND attempts = 0
                  THEN coalesce((SELECT endpoints.budget FROM endpoints
                                 WHERE endpoints.principal = replies.requester), budget)
                  ELSE budget END
FROM picked
WHERE replies.id = picked.id AND replies.state = 'pending'
  AND (:routed = 0 OR EXISTS (SELECT 1 FROM endpoints
                              WHERE endpoints.principal = replies.requester
                                AND endpoints.disabled_at IS NULL))
RETURNING replies.reply_id, replies.task_id, replies.body, replies.fingerprint,
          replies.fence, replies.attempts, replies.budget, replies.lease_until,
          replies.requester

-- name: reply_apply
-- Apply a decision to a reply still in the state and fence it was decided on (closing its
-- delivery attempt, if one was under way).
UPDATE replies
SET state = :to_state, owner = NULL, lease_until = NULL, available_at = :available_at,
    last_error = :last_error, sent_at = :sent_at,
    history = CASE WHEN state = 'sending' THEN {history_close} ELSE history END,
    updated_at = :now
WHERE {reply_named} AND state = :from_state AND fence = :fence
RETURNING reply_id, queue

-- fragment: reply_claim_is_current
-- The reply is sending under this very claim. The outcome was decided from the claim's
-- attempt and budget, and what was delivered is its body: a claim whose copy of them differs
-- from the reply's own is not this reply's claim.
{reply_of_task} AND reply_id = :reply_id AND state = 'sending' AND owner = :claim_owner
  AND fence = :fence AND task_id = :task_id AND attempts = :attempt AND budget = :budget AND body = :body
  AND fingerprint = :fingerprint AND requester {same_as} :requester

-- name: reply_apply_owned
-- Record a publisher's delivery outcome: only while its claim is the current one.
UPDATE replies
SET state = :to_state, owner = NULL, lease_until = NULL, available_at = :available_at,
    last_error = :last_error, sent_at = :sent_at, history = {history_close},
    updated_at = :now
WHERE {reply_claim_is_current}
RETURNING reply_id, queue

-- name: reply_release_owned
-- A publisher hands a reply back unsent (it is stopping, or the endpoint is busy or gone):
-- claimable again at :available_at with its attempt given back (the fence never goes back).
-- The last error stays: it is still the last thing a delivery learned.
UPDATE replies
SET state = 'pending', owner = NULL, lease_until = NULL, available_at = :available_at,
    attempts = attempts - 1, history = {history_close}, updated_at = :now
WHERE {reply_claim_is_current}
RETURNING reply_id

-- name: reply_requeue
-- An operator sends a dead reply again: a fresh delivery budget, same id and content.
UPDATE replies
SET state = 'pending', attempts = 0, available_at = :now, updated_at = :now
WHERE {reply_named} AND state = 'dead'
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

-- name: counts_add
-- Add to a cumulative outcome count (in this connection's shard).
INSERT INTO postroom_counts (kind, queue, state, shard, n)
VALUES (:kind, :queue, :state, :shard, :n)
ON CONFLICT (kind, queue, state, shard) DO UPDATE SET n = postroom_counts.n + excluded.n
