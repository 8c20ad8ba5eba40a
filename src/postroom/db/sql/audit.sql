-- Invariant checks of SPEC §8. Each query returns the rows that break one invariant, as
-- (identity, detail); an empty result means the invariant holds. Queries named
-- audit_store_* run on a store database, audit_receiver_* on a receiver database.

-- name: audit_store_terminal_task_without_reply
-- Every terminal task has exactly one reply.
SELECT tasks.task_id AS identity, tasks.state AS detail FROM tasks
LEFT JOIN replies ON replies.id = tasks.id
WHERE tasks.state IN ({terminal_task_states}) AND replies.id IS NULL

-- name: audit_store_reply_for_live_task
-- No reply exists for a task that is not terminal (or for no task at all).
SELECT replies.reply_id AS identity, coalesce(tasks.state, 'no task') AS detail FROM replies
LEFT JOIN tasks ON tasks.id = replies.id
WHERE tasks.id IS NULL OR tasks.state IN ({live_task_states})

-- name: audit_store_reply_status_mismatch
-- A reply reports its task's terminal state and is named after its task.
SELECT replies.reply_id AS identity,
       'reply says ' || replies.status || ' of ' || replies.task_id || ', task '
       || tasks.task_id || ' is ' || tasks.state AS detail
FROM replies JOIN tasks ON tasks.id = replies.id
WHERE replies.status <> tasks.state OR replies.task_id <> tasks.task_id
   OR replies.reply_id <> 'reply:' || tasks.task_id

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

-- name: audit_store_budget_out_of_range
-- A delivery budget is one of the allowed settings (Settings.delivery_budget's range), and a
-- sent reply was attempted.
SELECT reply_id AS identity, 'budget ' || budget || ', ' || state || ' after ' || attempts
       || ' attempts' AS detail
FROM replies
WHERE budget < :min_budget OR budget > :max_budget OR (state = 'sent' AND attempts < 1)

-- name: audit_store_parked_not_pending
-- Only a pending reply waits for an endpoint (parked): claiming, sending and ending it
-- leave the head of the outbox, where parking applies.
SELECT reply_id AS identity, state || ' yet parked since ' || parked_at AS detail
FROM replies
WHERE parked_at IS NOT NULL AND state <> 'pending'

-- name: audit_store_sending_without_owner_or_lease
-- A sending reply has an owner and a lease, and is due again when the lease ends (so that a
-- sweep finds it then); any other reply has neither.
SELECT reply_id AS identity,
       state || ' with owner ' || coalesce(owner, 'NULL') || ', lease until '
       || coalesce(CAST(lease_until AS TEXT), 'NULL') || ', due at '
       || CAST(available_at AS TEXT) AS detail
FROM replies
WHERE (state = 'sending' AND (owner IS NULL OR lease_until IS NULL
                             OR available_at <> lease_until))
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

-- name: audit_store_task_end_mismatch
-- A task has an end time exactly when it is terminal (the index of live deadlines holds the
-- tasks without one), and it did not end before it was created.
SELECT task_id AS identity,
       state || ' with ended_at ' || coalesce(CAST(ended_at AS TEXT), 'NULL') AS detail
FROM tasks
WHERE (ended_at IS NULL) <> (state IN ({live_task_states})) OR ended_at < created_at

-- name: audit_store_decided_after_high_water
-- No decision used a time later than the persisted high-water mark.
SELECT tasks.task_id AS identity,
       'updated_at ' || tasks.updated_at || ' > high water ' || clock.high_water AS detail
FROM tasks, (SELECT {persisted_high_water} AS high_water) AS clock
WHERE tasks.updated_at > clock.high_water

-- name: audit_store_requeue_without_reply
-- Every requeue decision belongs to a reply.
SELECT reply_requeues.reply_id AS identity, 'requeue of a missing reply' AS detail
FROM reply_requeues
LEFT JOIN tasks ON tasks.task_id = substr(reply_requeues.reply_id, 7)
LEFT JOIN replies ON replies.id = tasks.id AND replies.reply_id = reply_requeues.reply_id
WHERE replies.id IS NULL

-- name: audit_store_contents
-- Rows whose content the audit re-derives in Python (identities and fingerprints).
SELECT tasks.task_id, tasks.principal, tasks.message_id, tasks.fingerprint, tasks.envelope,
       replies.reply_id, replies.body, replies.fingerprint AS reply_fingerprint,
       replies.status, replies.requester AS reply_requester, tasks.result, tasks.last_error,
       tasks.requester, tasks.correlation_id, tasks.parent_task_id
FROM tasks
LEFT JOIN replies ON replies.id = tasks.id

-- Waits, receipts, continuations and effects (SPEC §5, §8). Foreign keys already keep
-- every wait in a slot, every continuation with its wait and every effect with its
-- continuation; these checks cover what keys cannot express.

-- name: audit_store_slot_generation_mismatch
-- A slot's generation equals its newest wait's, and every generation up to it has its row.
SELECT wait_slots.flow || '/' || wait_slots.step AS identity,
       'slot at ' || wait_slots.generation || ', ' || count(waits.generation)
       || ' generations, newest ' || coalesce(max(waits.generation), 0) AS detail
FROM wait_slots
LEFT JOIN waits ON waits.flow = wait_slots.flow AND waits.step = wait_slots.step
GROUP BY wait_slots.flow, wait_slots.step, wait_slots.generation
HAVING coalesce(max(waits.generation), 0) <> wait_slots.generation
    OR count(waits.generation) <> wait_slots.generation

-- name: audit_store_waiting_not_current
-- At most one wait per slot is waiting, and only the slot's current generation.
SELECT waits.flow || '/' || waits.step || '#' || waits.generation AS identity,
       'waiting, but the slot is at ' || wait_slots.generation AS detail
FROM waits
JOIN wait_slots ON wait_slots.flow = waits.flow AND wait_slots.step = waits.step
WHERE waits.state = 'waiting' AND waits.generation <> wait_slots.generation

-- name: audit_store_wait_end_fields
-- A waiting wait has no end time and no adopted event; a signaled one has both; a timed-out
-- one has an end time and no adopted event.
SELECT flow || '/' || step || '#' || generation AS identity,
       state || ' with ended_at ' || coalesce(CAST(ended_at AS TEXT), 'NULL') || ', event '
       || coalesce(event_principal, 'NULL') || '/' || coalesce(event_id, 'NULL') AS detail
FROM waits
WHERE (state = 'waiting' AND (ended_at IS NOT NULL OR event_id IS NOT NULL
                              OR event_principal IS NOT NULL))
   OR (state = 'signaled' AND (ended_at IS NULL OR event_id IS NULL
                               OR event_principal IS NULL))
   OR (state = 'timed_out' AND (ended_at IS NULL OR event_id IS NOT NULL
                                OR event_principal IS NOT NULL))

-- name: audit_store_signaled_without_its_receipt
-- A signaled wait's adopted event has an accepted receipt for exactly this generation.
SELECT waits.flow || '/' || waits.step || '#' || waits.generation AS identity,
       'adopted ' || waits.event_principal || '/' || waits.event_id || ', receipt '
       || coalesce(wait_receipts.result, 'missing') AS detail
FROM waits
LEFT JOIN wait_receipts
       ON wait_receipts.principal = waits.event_principal
      AND wait_receipts.event_id = waits.event_id
WHERE waits.state = 'signaled'
  AND (wait_receipts.event_id IS NULL OR wait_receipts.result <> 'accepted'
       OR wait_receipts.flow <> waits.flow OR wait_receipts.step <> waits.step
       OR wait_receipts.generation <> waits.generation)

-- name: audit_store_accepted_receipt_not_adopted
-- Every accepted receipt is the adopted event of a signaled wait (so a signaled wait has
-- exactly one, and a timed-out wait none).
SELECT wait_receipts.principal || '/' || wait_receipts.event_id AS identity,
       'accepted for ' || wait_receipts.flow || '/' || wait_receipts.step || '#'
       || wait_receipts.generation || ', wait ' || coalesce(waits.state, 'missing') AS detail
FROM wait_receipts
LEFT JOIN waits
       ON waits.flow = wait_receipts.flow AND waits.step = wait_receipts.step
      AND waits.generation = wait_receipts.generation
WHERE wait_receipts.result = 'accepted'
  AND (waits.flow IS NULL OR waits.state <> 'signaled'
       OR waits.event_principal <> wait_receipts.principal
       OR waits.event_id <> wait_receipts.event_id)

-- name: audit_store_receipt_inconsistent_with_wait
-- What a receipt recorded still matches its wait: too_late means the wait timed out at or
-- after its deadline; closed means the generation had ended; stale_generation means an older
-- generation than the slot's; accepted means before the deadline.
SELECT wait_receipts.principal || '/' || wait_receipts.event_id AS identity,
       wait_receipts.result || ' at ' || wait_receipts.received_at || ' for '
       || wait_receipts.flow || '/' || wait_receipts.step || '#' || wait_receipts.generation
       || ': wait ' || coalesce(waits.state, 'missing') || ', deadline '
       || coalesce(CAST(waits.deadline AS TEXT), 'NULL') || ', slot at '
       || coalesce(wait_slots.generation, 0) AS detail
FROM wait_receipts
LEFT JOIN waits
       ON waits.flow = wait_receipts.flow AND waits.step = wait_receipts.step
      AND waits.generation = wait_receipts.generation
LEFT JOIN wait_slots
       ON wait_slots.flow = wait_receipts.flow AND wait_slots.step = wait_receipts.step
WHERE (wait_receipts.result = 'accepted'
       AND (waits.flow IS NULL OR wait_receipts.received_at >= waits.deadline))
   OR (wait_receipts.result = 'too_late'
       AND (waits.flow IS NULL OR waits.state <> 'timed_out'
            OR wait_receipts.received_at < waits.deadline))
   OR (wait_receipts.result = 'closed' AND (waits.flow IS NULL OR waits.state = 'waiting'))
   OR (wait_receipts.result = 'stale_generation'
       AND wait_receipts.generation >= coalesce(wait_slots.generation, 0))

-- name: audit_store_timed_out_before_deadline
-- A wait times out only once its deadline has come, and is signaled only before it.
SELECT flow || '/' || step || '#' || generation AS identity,
       state || ' at ' || ended_at || ', deadline ' || deadline AS detail
FROM waits
WHERE (state = 'timed_out' AND ended_at < deadline)
   OR (state = 'signaled' AND ended_at >= deadline)

-- name: audit_store_ended_wait_without_continuation
-- Every ended wait has exactly one continuation of the matching kind; a waiting one none.
SELECT waits.flow || '/' || waits.step || '#' || waits.generation AS identity,
       waits.state || ' with continuation ' || coalesce(wait_continuations.kind, 'none')
       AS detail
FROM waits
LEFT JOIN wait_continuations
       ON wait_continuations.flow = waits.flow AND wait_continuations.step = waits.step
      AND wait_continuations.generation = waits.generation
WHERE (waits.state = 'waiting' AND wait_continuations.kind IS NOT NULL)
   OR (waits.state = 'signaled' AND coalesce(wait_continuations.kind, '') <> 'signal')
   OR (waits.state = 'timed_out' AND coalesce(wait_continuations.kind, '') <> 'timeout')

-- name: audit_store_continuation_value_mismatch
-- A signal continuation carries the accepted signal's value; a timeout one carries none.
SELECT wait_continuations.flow || '/' || wait_continuations.step || '#'
       || wait_continuations.generation AS identity,
       wait_continuations.kind || ' continuation does not carry the adopted value' AS detail
FROM wait_continuations
JOIN waits
  ON waits.flow = wait_continuations.flow AND waits.step = wait_continuations.step
 AND waits.generation = wait_continuations.generation
LEFT JOIN wait_receipts
       ON wait_receipts.principal = waits.event_principal
      AND wait_receipts.event_id = waits.event_id
WHERE (wait_continuations.kind = 'timeout' AND wait_continuations.value IS NOT NULL)
   OR (wait_continuations.kind = 'signal'
       AND (wait_receipts.value IS NULL OR wait_continuations.value IS NULL
            OR wait_continuations.value <> wait_receipts.value))

-- name: audit_store_continuation_effect_mismatch
-- Every consumed continuation has exactly one effect (the key allows no second), and no
-- unconsumed one has an effect.
SELECT wait_continuations.flow || '/' || wait_continuations.step || '#'
       || wait_continuations.generation AS identity,
       CASE WHEN wait_continuations.consumed_at IS NULL THEN 'unconsumed with an effect'
            ELSE 'consumed without an effect' END AS detail
FROM wait_continuations
LEFT JOIN wait_effects
       ON wait_effects.flow = wait_continuations.flow
      AND wait_effects.step = wait_continuations.step
      AND wait_effects.generation = wait_continuations.generation
WHERE (wait_continuations.consumed_at IS NULL AND wait_effects.flow IS NOT NULL)
   OR (wait_continuations.consumed_at IS NOT NULL AND wait_effects.flow IS NULL)

-- name: audit_store_effect_task_mismatch
-- A 'task' effect names a follow-up whose parent is the wait's task, one hop further; a
-- 'none' effect names no task. A follow-up (or parent) that pruning has since forgotten --
-- terminal, its reply sent, past retention -- can no longer be compared.
SELECT wait_effects.flow || '/' || wait_effects.step || '#' || wait_effects.generation
       AS identity,
       wait_effects.kind || ' effect, task ' || coalesce(wait_effects.task_id, 'NULL')
       || ' (' || coalesce(child.parent_task_id, 'no parent') || ', hops '
       || coalesce(CAST(child.hops AS TEXT), 'NULL') || ')' AS detail
FROM wait_effects
JOIN waits
  ON waits.flow = wait_effects.flow AND waits.step = wait_effects.step
 AND waits.generation = wait_effects.generation
LEFT JOIN tasks AS child ON child.task_id = wait_effects.task_id
LEFT JOIN tasks AS parent ON parent.task_id = waits.task_id
WHERE (wait_effects.kind = 'none' AND wait_effects.task_id IS NOT NULL)
   OR (wait_effects.kind = 'task'
       AND (wait_effects.task_id IS NULL OR waits.task_id IS NULL
            OR (child.task_id IS NOT NULL
                AND (coalesce(child.parent_task_id, '') <> waits.task_id
                     OR (parent.task_id IS NOT NULL AND child.hops <> parent.hops + 1)))))

-- name: audit_store_wait_decided_after_high_water
-- No wait decision used a time later than the persisted high-water mark (its greatest row).
SELECT decided.identity, decided.what || ' ' || decided.at || ' > high water '
       || clock.high_water AS detail
FROM (
    SELECT flow || '/' || step || '#' || generation AS identity, 'opened_at' AS what,
           opened_at AS at FROM waits
    UNION ALL
    SELECT flow || '/' || step || '#' || generation, 'ended_at', ended_at FROM waits
    UNION ALL
    SELECT principal || '/' || event_id, 'received_at', received_at FROM wait_receipts
    UNION ALL
    SELECT flow || '/' || step || '#' || generation, 'created_at', created_at
    FROM wait_continuations
    UNION ALL
    SELECT flow || '/' || step || '#' || generation, 'consumed_at', consumed_at
    FROM wait_continuations
    UNION ALL
    SELECT flow || '/' || step || '#' || generation, 'applied_at', applied_at
    FROM wait_effects
) AS decided, (SELECT {persisted_high_water} AS high_water) AS clock
WHERE decided.at > clock.high_water

-- name: audit_store_limit_slots_mismatch
-- A queue limited to K runs has exactly the slots 1..K.
SELECT queue_limits.queue AS identity,
       'limit ' || queue_limits.running || ' with ' || count(queue_slots.slot) || ' slots'
       AS detail
FROM queue_limits
LEFT JOIN queue_slots ON queue_slots.queue = queue_limits.queue
GROUP BY queue_limits.queue, queue_limits.running
HAVING count(queue_slots.slot) <> queue_limits.running
    OR coalesce(max(queue_slots.slot), 0) <> queue_limits.running

-- name: audit_store_slot_held_twice
-- A running task holds at most one slot: each claim of a limited queue takes one.
SELECT tasks.task_id AS identity, count(*) || ' slots of ' || tasks.queue AS detail
FROM queue_slots
JOIN tasks ON tasks.task_id = queue_slots.task_id AND tasks.state = 'running'
          AND tasks.fence = queue_slots.fence
GROUP BY tasks.task_id, tasks.queue
HAVING count(*) > 1

-- name: audit_store_slot_of_another_queue
-- A slot is held only by a task of its own queue.
SELECT queue_slots.queue || '#' || queue_slots.slot AS identity,
       'held by ' || tasks.task_id || ' of ' || tasks.queue AS detail
FROM queue_slots
JOIN tasks ON tasks.task_id = queue_slots.task_id AND tasks.state = 'running'
          AND tasks.fence = queue_slots.fence
WHERE tasks.queue <> queue_slots.queue

-- name: audit_store_available_before_not_before
-- A task held until later is not claimable before then (its first attempt included).
SELECT task_id AS identity,
       'available at ' || available_at || ' before not_before ' || not_before AS detail
FROM tasks
WHERE state = 'pending' AND attempts = 0 AND not_before IS NOT NULL
  AND available_at < not_before

-- name: audit_receiver_effect_without_receipt
-- Each effect has its receipt (a row holding an effect alone came from an earlier version's
-- effect whose receipt was gone).
SELECT reply_id AS identity, 'effect without receipt' AS detail
FROM receiver_receipts WHERE body IS NULL

-- name: audit_receiver_contents
-- Receipts whose fingerprint, identity and effect the audit re-derives in Python.
SELECT reply_id, fingerprint, body, task_id AS effect_task_id, status AS effect_status,
       result AS effect_result
FROM receiver_receipts WHERE body IS NOT NULL

-- name: audit_receiver_receipt_without_effect
-- A receipt and its effect commit together: no receipt stands alone.
SELECT reply_id AS identity, 'receipt without effect' AS detail
FROM receiver_receipts WHERE applied_at IS NULL

-- name: audit_store_chain_over_budget
-- No chain admitted more tasks than its task budget, and every task of a chain that was
-- pending or ran was admitted (counted in its chain's row): its root and its members. (Cost
-- is charged by work that already happened, so a chain's cost may pass its budget; its later
-- work is refused.)
SELECT chains.root_task_id AS identity,
       'admitted ' || chains.tasks || ' of ' || chains.max_tasks || ' tasks, '
       || (SELECT count(*) FROM tasks
           WHERE (tasks.root_task_id = chains.root_task_id
                  OR tasks.task_id = chains.root_task_id)
             AND (tasks.attempts > 0 OR tasks.state IN ('pending', 'running')))
       || ' pending or run' AS detail
FROM chains
WHERE chains.tasks > chains.max_tasks
   OR chains.tasks < (SELECT count(*) FROM tasks
                      WHERE (tasks.root_task_id = chains.root_task_id
                             OR tasks.task_id = chains.root_task_id)
                        AND (tasks.attempts > 0 OR tasks.state IN ('pending', 'running')))

-- name: audit_store_task_without_chain
-- Every member of a chain (a task with a root) is in a chain whose row exists -- a root alone
-- may have none yet (postroom.chains) --, and a linked task is one hop below its parent in
-- its parent's chain.
SELECT tasks.task_id AS identity,
       'root ' || coalesce(tasks.root_task_id, 'itself') || ', parent '
       || coalesce(tasks.parent_task_id, 'none') AS detail
FROM tasks
LEFT JOIN chains ON chains.root_task_id = tasks.root_task_id
LEFT JOIN tasks parent ON parent.task_id = tasks.parent_task_id
WHERE (tasks.root_task_id IS NOT NULL AND chains.root_task_id IS NULL)
   OR (parent.task_id IS NOT NULL
       AND (coalesce(parent.root_task_id, parent.task_id)
                <> coalesce(tasks.root_task_id, tasks.task_id)
            OR tasks.hops <> parent.hops + 1))

-- name: audit_store_approval_uses_mismatch
-- Every use of an approval has exactly one side effect and one 'used' event, none beyond its
-- count; it was granted once (its 'granted' event), and revoked iff it has a 'revoked' event.
SELECT approvals.approval_id AS identity,
       'uses ' || approvals.uses || ' of ' || approvals.max_uses || ', '
       || (SELECT count(*) FROM side_effects
           WHERE side_effects.approval_id = approvals.approval_id) || ' side effects, '
       || (SELECT count(*) FROM approval_events e
           WHERE e.approval_id = approvals.approval_id AND e.kind = 'used') || ' used events'
       AS detail
FROM approvals
WHERE approvals.uses > approvals.max_uses
   OR approvals.uses <> (SELECT count(*) FROM side_effects
                         WHERE side_effects.approval_id = approvals.approval_id
                           AND side_effects.use_number BETWEEN 1 AND approvals.uses)
   OR approvals.uses <> (SELECT count(*) FROM side_effects
                         WHERE side_effects.approval_id = approvals.approval_id)
   OR approvals.uses <> (SELECT count(*) FROM approval_events e
                         WHERE e.approval_id = approvals.approval_id AND e.kind = 'used')
   OR NOT EXISTS (SELECT 1 FROM approval_events e
                  WHERE e.approval_id = approvals.approval_id AND e.kind = 'granted')
   OR (approvals.revoked_at IS NULL) = EXISTS (SELECT 1 FROM approval_events e
                                              WHERE e.approval_id = approvals.approval_id
                                                AND e.kind = 'revoked')

-- name: audit_store_side_effect_unapproved
-- A side effect used an approval of its own action, resource and data, before the
-- approval expired and no later than its revocation, by a task that finished.
SELECT side_effects.task_id || '#' || side_effects.number AS identity,
       coalesce('approval ' || approvals.approval_id, 'no approval') || ', task '
       || coalesce(tasks.state, 'pruned') AS detail
FROM side_effects
LEFT JOIN approvals ON approvals.approval_id = side_effects.approval_id
LEFT JOIN tasks ON tasks.task_id = side_effects.task_id
WHERE approvals.approval_id IS NULL
   OR approvals.action <> side_effects.action
   OR approvals.resource <> side_effects.resource
   OR approvals.data_digest <> side_effects.data_digest
   OR side_effects.created_at >= approvals.expires_at
   OR side_effects.created_at > coalesce(approvals.revoked_at, side_effects.created_at)
   OR (tasks.task_id IS NOT NULL AND tasks.state <> 'done')
