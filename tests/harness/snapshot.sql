-- Whole-table reads for the verification harness (the randomized audit compares what the
-- databases hold before and after every step; the scenarios and the bench list what a run
-- left). The store itself never runs these: ``tests/harness/queries.py`` loads them.

-- name: snapshot_tasks
-- Every task (the root of its chain: itself for a root), with the fingerprint and arrival
-- time of its identity, and whether it
-- holds a stream position above its stream's watermark (which pruning keeps).
SELECT tasks.task_id, tasks.state, tasks.queue, tasks.owner, tasks.fence, tasks.attempts,
       tasks.max_attempts, tasks.lease_until, tasks.available_at, tasks.deadline, tasks.hops,
       tasks.parent_task_id, tasks.result, tasks.not_before, tasks.priority, tasks.claim_at,
       tasks.retry_of, coalesce(tasks.root_task_id, tasks.task_id) AS root_task_id,
       tasks.principal, tasks.fingerprint, tasks.created_at AS received_at,
       CASE WHEN EXISTS (
           SELECT 1 FROM stream_positions
           JOIN streams ON streams.principal = stream_positions.principal
                       AND streams.stream = stream_positions.stream
           WHERE stream_positions.task_id = tasks.task_id
             AND stream_positions.seq > streams.watermark) THEN 1 ELSE 0 END
           AS above_watermark
FROM tasks

-- name: snapshot_replies
-- Every reply (its content by fingerprint) with how many times an operator requeued it.
SELECT replies.reply_id, replies.task_id, replies.status, replies.fingerprint, replies.state,
       replies.attempts, replies.budget, replies.fence, replies.owner, replies.lease_until,
       replies.available_at,
       (SELECT count(*) FROM reply_requeues
        WHERE reply_requeues.reply_id = replies.reply_id) AS requeues
FROM replies

-- name: snapshot_paused_queues
-- Every paused queue.
SELECT queue, operator, reason, paused_at FROM paused_queues

-- name: snapshot_queue_limits
-- Every limited queue and its limit.
SELECT queue, running FROM queue_limits

-- name: snapshot_queue_slots
-- Every slot of a limited queue, with the task and fence it was last taken for.
SELECT queue, slot, task_id, fence FROM queue_slots

-- name: snapshot_task_retries
-- Every operator's re-run of a task.
SELECT task_id, number, new_task_id, operator, reason, retried_at, request_id
FROM task_retries

-- name: snapshot_receipts
-- Receiver: every receipt with how many business effects its reply id has.
SELECT receiver_receipts.reply_id, receiver_receipts.fingerprint,
       receiver_receipts.received_at,
       CASE WHEN receiver_receipts.applied_at IS NULL THEN 0 ELSE 1 END AS effects
FROM receiver_receipts

-- name: snapshot_wait_slots
-- Every wait slot and its current generation.
SELECT flow, step, generation FROM wait_slots

-- name: snapshot_waits
-- Every wait generation, as stored.
SELECT flow, step, generation, state, deadline, task_id, request_id, opened_at, ended_at,
       event_principal, event_id
FROM waits

-- name: snapshot_wait_receipts
-- Every signal receipt, as stored.
SELECT principal, event_id, flow, step, generation, value, result, received_at
FROM wait_receipts

-- name: snapshot_wait_continuations
-- Every continuation with its effect (if consumed) and how many effects its key has.
SELECT wait_continuations.flow, wait_continuations.step, wait_continuations.generation,
       wait_continuations.kind, wait_continuations.value, wait_continuations.created_at,
       wait_continuations.consumed_at,
       (SELECT count(*) FROM wait_effects AS counted
        WHERE counted.flow = wait_continuations.flow AND counted.step = wait_continuations.step
          AND counted.generation = wait_continuations.generation) AS effects,
       wait_effects.kind AS effect_kind, wait_effects.task_id AS effect_task_id,
       wait_effects.applied_at
FROM wait_continuations
LEFT JOIN wait_effects
       ON wait_effects.flow = wait_continuations.flow
      AND wait_effects.step = wait_continuations.step
      AND wait_effects.generation = wait_continuations.generation

-- name: waits_listing
-- Every wait generation and its state, in address order .
SELECT flow, step, generation, state FROM waits ORDER BY flow, step, generation

-- name: wait_receipts_listing
-- Every signal receipt and its outcome, in key order .
SELECT principal, event_id, result FROM wait_receipts ORDER BY principal, event_id

-- name: wait_continuations_listing
-- Every continuation, consumed or not, in address order .
SELECT flow, step, generation, kind, consumed_at FROM wait_continuations
ORDER BY flow, step, generation

-- name: wait_effects_listing
-- Every effect with its follow-up's parent and hops, in address order.
SELECT wait_effects.flow, wait_effects.step, wait_effects.generation, wait_effects.task_id,
       tasks.parent_task_id, tasks.hops
FROM wait_effects
LEFT JOIN tasks ON tasks.task_id = wait_effects.task_id
ORDER BY wait_effects.flow, wait_effects.step, wait_effects.generation

-- name: snapshot_schedules
-- Every periodic schedule, by name.
SELECT name, cron, zone, queue, payload, priority, max_attempts, ttl, missed, paused,
       last_period, last_key, last_task_id, next_at, created_at
FROM schedules ORDER BY name

-- name: snapshot_chains
-- Every chain: its budgets and what it has spent.
SELECT root_task_id, principal, max_hops, max_tasks, max_cost, tasks, cost, cancelled_at,
       created_at
FROM chains

-- name: snapshot_approvals
-- Every human approval, its terms (data by its canonical JSON and digest) and uses.
SELECT approval_id, action, resource, data, data_digest, max_uses, uses, expires_at,
       granted_by, requested_by, granted_at, fingerprint, revoked_at, revoked_by,
       revoke_reason
FROM approvals

-- name: snapshot_approval_events
-- Every durable event of an approval: granted, each use, revoked.
SELECT approval_id, kind, number, principal, task_id, at FROM approval_events

-- name: snapshot_side_effects
-- Every side effect committed with a finish, with the approval use it consumed.
SELECT task_id, number, action, resource, data_digest, approval_id, use_number, created_at
FROM side_effects
