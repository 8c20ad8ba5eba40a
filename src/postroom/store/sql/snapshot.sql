-- Whole-table reads for the randomized audit (postroom.simulation), which compares what the
-- databases hold before and after every step. The store itself never runs these.

-- name: snapshot_tasks
-- Every task, with the fingerprint and arrival time of its inbox identity.
SELECT tasks.task_id, tasks.state, tasks.queue, tasks.owner, tasks.fence, tasks.attempts,
       tasks.max_attempts, tasks.lease_until, tasks.available_at, tasks.deadline, tasks.hops,
       tasks.parent_task_id, tasks.result, inbox.fingerprint, inbox.received_at
FROM tasks
LEFT JOIN inbox ON inbox.task_id = tasks.task_id

-- name: snapshot_replies
-- Every reply (its content by fingerprint) with how many times an operator requeued it.
SELECT replies.reply_id, replies.task_id, replies.status, replies.fingerprint, replies.state,
       replies.attempts, replies.budget, replies.fence, replies.owner, replies.lease_until,
       replies.available_at,
       (SELECT count(*) FROM reply_requeues
        WHERE reply_requeues.reply_id = replies.reply_id) AS requeues
FROM replies

-- name: snapshot_receipts
-- Receiver: every receipt with how many business effects its reply id has.
SELECT receiver_receipts.reply_id, receiver_receipts.fingerprint,
       receiver_receipts.received_at,
       (SELECT count(*) FROM receiver_effects
        WHERE receiver_effects.reply_id = receiver_receipts.reply_id) AS effects
FROM receiver_receipts
