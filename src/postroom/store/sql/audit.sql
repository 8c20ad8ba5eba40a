-- Invariant checks of SPEC §8. Each query returns the rows that break one invariant, as
-- (identity, detail); an empty result means the invariant holds. Queries named
-- audit_store_* run on a store database, audit_receiver_* on a receiver database.

-- name: audit_store_terminal_task_without_reply
-- Every terminal task has exactly one reply.
SELECT tasks.task_id AS identity, tasks.state AS detail FROM tasks
LEFT JOIN replies ON replies.task_id = tasks.task_id
WHERE tasks.state NOT IN ('pending', 'running') AND replies.reply_id IS NULL

-- name: audit_store_reply_for_live_task
-- No reply exists for a task that is not terminal (or for no task at all).
SELECT replies.reply_id AS identity, coalesce(tasks.state, 'no task') AS detail FROM replies
LEFT JOIN tasks ON tasks.task_id = replies.task_id
WHERE tasks.task_id IS NULL OR tasks.state IN ('pending', 'running')

-- name: audit_store_reply_status_mismatch
-- A reply reports its task's terminal state and is named after its task.
SELECT replies.reply_id AS identity,
       'reply says ' || replies.status || ', task is ' || tasks.state AS detail
FROM replies JOIN tasks ON tasks.task_id = replies.task_id
WHERE replies.status <> tasks.state OR replies.reply_id <> 'reply:' || tasks.task_id

-- name: audit_store_running_without_owner_or_lease
-- A running task has an owner and a lease.
SELECT task_id AS identity, 'running with owner ' || coalesce(owner, 'NULL') AS detail
FROM tasks
WHERE state = 'running' AND (owner IS NULL OR lease_until IS NULL)

-- name: audit_store_idle_task_with_owner_or_lease
-- A pending or terminal task has neither owner nor lease.
SELECT task_id AS identity, state || ' with owner ' || coalesce(owner, 'NULL') AS detail
FROM tasks
WHERE state <> 'running' AND (owner IS NOT NULL OR lease_until IS NOT NULL)

-- name: audit_store_attempts_out_of_range
-- 0 <= attempts <= max_attempts.
SELECT task_id AS identity,
       'attempts ' || attempts || ' of max ' || max_attempts AS detail
FROM tasks
WHERE attempts < 0 OR attempts > max_attempts

-- name: audit_store_fence_below_attempts
-- The fence is at least the number of attempts (each claim raises both).
SELECT task_id AS identity, 'fence ' || fence || ' < attempts ' || attempts AS detail
FROM tasks
WHERE fence < attempts

-- name: audit_store_reply_attempts_over_budget
-- A reply's delivery attempts never exceed its delivery budget.
SELECT reply_id AS identity, 'attempts ' || attempts || ' > budget ' || budget AS detail
FROM replies
WHERE attempts < 0 OR attempts > budget

-- name: audit_store_sending_without_owner_or_lease
-- A sending reply has an owner and a lease; any other reply has neither.
SELECT reply_id AS identity, state || ' with owner ' || coalesce(owner, 'NULL') AS detail
FROM replies
WHERE (state = 'sending' AND (owner IS NULL OR lease_until IS NULL))
   OR (state <> 'sending' AND (owner IS NOT NULL OR lease_until IS NOT NULL))

-- name: audit_store_reply_fence_below_attempts
-- A reply's fence is at least its attempts since the last requeue.
SELECT reply_id AS identity, 'fence ' || fence || ' < attempts ' || attempts AS detail
FROM replies
WHERE fence < attempts

-- name: audit_store_dead_reply_without_error
-- A dead reply keeps the error that killed it.
SELECT reply_id AS identity, 'dead without last_error' AS detail FROM replies
WHERE state = 'dead' AND last_error IS NULL

-- name: audit_store_sent_reply_without_time
-- A sent reply records when.
SELECT reply_id AS identity, 'sent without sent_at' AS detail FROM replies
WHERE state = 'sent' AND sent_at IS NULL

-- name: audit_store_task_without_inbox
-- Every task was stored from an accepted message (or follow-up) in the inbox.
SELECT tasks.task_id AS identity, 'no inbox row' AS detail FROM tasks
LEFT JOIN inbox ON inbox.task_id = tasks.task_id
WHERE inbox.task_id IS NULL

-- name: audit_store_inbox_without_task
-- Every stored message has its task.
SELECT inbox.task_id AS identity, 'no task row' AS detail FROM inbox
LEFT JOIN tasks ON tasks.task_id = inbox.task_id
WHERE tasks.task_id IS NULL

-- name: audit_store_decided_after_high_water
-- No decision used a time later than the persisted high-water mark (its greatest row).
SELECT tasks.task_id AS identity,
       'updated_at ' || tasks.updated_at || ' > high water ' || clock.high_water AS detail
FROM tasks, (SELECT max(high_water) AS high_water FROM postroom_clock) AS clock
WHERE tasks.updated_at > clock.high_water

-- name: audit_store_requeue_without_reply
-- Every requeue decision belongs to a reply.
SELECT reply_requeues.reply_id AS identity, 'requeue of a missing reply' AS detail
FROM reply_requeues
LEFT JOIN replies ON replies.reply_id = reply_requeues.reply_id
WHERE replies.reply_id IS NULL

-- name: audit_store_contents
-- Rows whose content the audit re-derives in Python (identities and fingerprints).
SELECT inbox.task_id, inbox.principal, inbox.message_id, inbox.fingerprint, inbox.envelope,
       replies.reply_id, replies.body, replies.fingerprint AS reply_fingerprint,
       replies.status, tasks.result
FROM inbox
LEFT JOIN replies ON replies.task_id = inbox.task_id
LEFT JOIN tasks ON tasks.task_id = inbox.task_id

-- name: audit_receiver_effect_without_receipt
-- Each effect has its receipt.
SELECT receiver_effects.reply_id AS identity, 'effect without receipt' AS detail
FROM receiver_effects
LEFT JOIN receiver_receipts ON receiver_receipts.reply_id = receiver_effects.reply_id
WHERE receiver_receipts.reply_id IS NULL

-- name: audit_receiver_duplicate_effects
-- At most one effect per reply_id.
SELECT reply_id AS identity, count(*) || ' effects' AS detail FROM receiver_effects
GROUP BY reply_id HAVING count(*) > 1

-- name: audit_receiver_contents
-- Receipts whose fingerprint the audit re-derives in Python.
SELECT reply_id, fingerprint, body FROM receiver_receipts

-- name: audit_receiver_receipt_without_effect
-- A receipt and its effect commit together: no receipt stands alone.
SELECT receiver_receipts.reply_id AS identity, 'receipt without effect' AS detail
FROM receiver_receipts
LEFT JOIN receiver_effects ON receiver_effects.reply_id = receiver_receipts.reply_id
WHERE receiver_effects.reply_id IS NULL
