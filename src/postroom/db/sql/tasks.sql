-- The inbox, tasks and stream cursors. Every statement that changes a task is guarded by the
-- state (and, for an owner's call, owner/fence/lease/deadline) it expects: a lost race shows
-- up as zero rows, never as an overwrite.

-- fragment: persisted_high_water
-- The time high-water mark: the greatest time a committed decision persisted, in a clock row
-- of postroom_counts or as the creation of the newest task (a transaction that creates a task
-- decides at the time it stores as its created_at, so it writes no clock row; the task of the
-- greatest id answers where ids follow creation, else the head of tasks_by_created).
(SELECT CASE WHEN clock.high_water >= coalesce(newest.created_at, 0) THEN clock.high_water
             ELSE newest.created_at END
 FROM (SELECT max(high_water) AS high_water FROM postroom_counts
       WHERE kind = 'clock') AS clock,
      {newest_task_created} AS newest)

-- name: tasks_id_span
-- The least and the greatest task id (NULLs: no task).
SELECT min(id) AS low, max(id) AS high FROM tasks

-- name: task_created_from
-- The first task at or after id :id, and when it was created.
SELECT id, created_at FROM tasks WHERE id >= :id ORDER BY id LIMIT 1

-- name: clock_read
-- The persisted time high-water mark, and the database server's own clock for a dialect
-- whose server is the time authority.
SELECT {persisted_high_water} AS high_water, {server_time} AS server_now

-- name: clock_advance
-- Move one row of the high-water mark forward (never back).
UPDATE postroom_counts SET high_water = :now
WHERE kind = 'clock' AND queue = '' AND state = '' AND shard = :shard AND high_water < :now

-- name: task_insert
-- Store an accepted message as its task unless its identity is already stored: the identity,
-- its content fingerprint and the envelope as received are the task's own columns. The fence
-- starts at the floor (see fence_floor_raise).
INSERT INTO tasks (task_id, principal, message_id, fingerprint, envelope, queue, state,
                   payload, deadline, max_attempts, hops, parent_task_id, correlation_id,
                   requester, attempts, fence, available_at, claim_at, not_before, priority,
                   retry_of, result, last_error, created_at, updated_at, root_task_id,
                   ended_at)
VALUES (:task_id, :principal, :message_id, :fingerprint, :envelope, :queue, :state,
        :payload, :deadline, :max_attempts, :hops, :parent_task_id, :correlation_id,
        :requester, 0, (SELECT floor FROM postroom_fence_floors WHERE kind = 'task'),
        :available_at, :available_at - :priority * :priority_weight, :not_before, :priority,
        :retry_of, :result, :last_error, :now, :now, :root_task_id, :ended_at)
ON CONFLICT (task_id) DO NOTHING
RETURNING id

-- name: task_fingerprint
-- The content fingerprint stored for an identity, kept from a concurrent prune until the
-- transaction ends (a prune holding it first is waited for: the row is then gone).
SELECT fingerprint FROM tasks WHERE task_id = :task_id {for_share}

-- name: stream_position_insert
-- Record that a numbered position of a source's stream is stored.
INSERT INTO stream_positions (principal, stream, seq, task_id)
VALUES (:principal, :stream, :seq, :task_id)
ON CONFLICT (principal, stream, seq) DO NOTHING
RETURNING seq

-- name: stream_position_task
-- Which task a stored position belongs to.
SELECT task_id FROM stream_positions
WHERE principal = :principal AND stream = :stream AND seq = :seq

-- name: stream_watermark
-- The contiguous durable watermark of a source's stream.
SELECT watermark FROM streams WHERE principal = :principal AND stream = :stream

-- name: stream_watermark_locked
-- The same, holding the stream's row until commit where rows are locked: two positions
-- received at once then advance it one after the other, each seeing the other's position.
SELECT watermark FROM streams WHERE principal = :principal AND stream = :stream {for_update}

-- name: stream_create
-- Start a stream's watermark at zero.
INSERT INTO streams (principal, stream, watermark) VALUES (:principal, :stream, 0)
ON CONFLICT (principal, stream) DO NOTHING

-- name: stream_next_missing
-- The first position above the watermark that is not stored yet (the watermark's new value
-- is one below it). Bounded by the number of out-of-order positions already stored.
WITH RECURSIVE run(seq) AS (
    SELECT CAST(:watermark AS BIGINT) + 1
    UNION ALL
    SELECT run.seq + 1 FROM run
    WHERE EXISTS (SELECT 1 FROM stream_positions p
                  WHERE p.principal = :principal AND p.stream = :stream AND p.seq = run.seq)
)
SELECT max(seq) AS missing FROM run

-- name: stream_advance
-- Move a stream's watermark forward.
UPDATE streams SET watermark = :watermark
WHERE principal = :principal AND stream = :stream AND watermark < :watermark

-- fragment: claimable
-- A task that a claim of queue :queue may pick at :now: pending, available (not held back
-- by a retry's backoff or its not_before), its deadline still ahead. Claims take them in
-- order of claim_at, its availability moved earlier by its priority, and among equals in
-- order of arrival, id (the partial index tasks_claimable serves that order, head first).
-- A task available by :now has its claim_at at most {claim_reach} seconds later (the lowest
-- priority at the largest weight), so the walk of the index ends there, however many tasks
-- are held until later.
state = 'pending' AND queue = :queue AND claim_at <= :now + {claim_reach}
  AND available_at <= :now AND deadline > :now

-- fragment: claim_is_current
-- The claim (:claim_owner, :fence) is still the task's: running under that owner and fence,
-- its lease unexpired and the deadline not reached. Decisions are made from the claim's
-- attempt count and limits, and follow-ups from its principal, queue, hops and deadline, so
-- a claim whose copy of them differs from the task's own is not this task's claim either; nor
-- is one naming another message (whose copy renew would hand back as the task's).
state = 'running' AND owner = :claim_owner AND fence = :fence
  AND lease_until > :now AND deadline > :now
  AND attempts = :attempt AND max_attempts = :max_attempts AND hops = :hops
  AND principal = :principal AND queue = :queue AND message_id = :message_id
  AND correlation_id {same_as} :correlation_id AND requester {same_as} :requester
  -- As a difference, not deadline = :deadline, which a planner without statistics may
  -- answer from the deadline index: slow when many tasks share one deadline.
  AND deadline - :deadline = 0

-- name: claim_order
-- The next :limit claimable tasks of one queue in claim order: when each has its turn, its
-- place in arrival order and when it became available. The head alone (:limit 1) says
-- whether a queue has work and how long it has waited; a claim of several queues merges
-- their next tasks to learn how many to take from each.
SELECT claim_at, id, available_at FROM tasks
WHERE {claimable}
ORDER BY claim_at, id
LIMIT :limit

-- name: claim_tasks
-- Pick up to :limit claimable tasks of one queue, oldest first, and make them running.
-- ({or_fail}: see the SQLite dialect; the transaction rolls back on any error anyway.)
WITH picked AS (
    SELECT id FROM tasks
    WHERE {claimable}
    ORDER BY claim_at, id
    LIMIT :limit
    {skip_locked}
)
UPDATE {or_fail} tasks
SET state = 'running', owner = :owner, lease_until = :lease_until, fence = fence + 1,
    attempts = attempts + 1, history = {history_open}, updated_at = :now
FROM picked
WHERE tasks.id = picked.id AND tasks.state = 'pending'
RETURNING tasks.task_id, tasks.principal, tasks.message_id, tasks.queue, tasks.payload,
          tasks.deadline, tasks.max_attempts, tasks.hops, tasks.attempts, tasks.fence,
          tasks.lease_until, tasks.correlation_id, tasks.requester, tasks.claim_at,
          tasks.id

-- fragment: lease_ran_out
-- The lease at the head of the running leases' index, if it ran out by :now (else NULL).
(SELECT lease_until FROM tasks WHERE state = 'running' AND lease_until <= :now
 ORDER BY lease_until LIMIT 1)

-- fragment: deadline_passed
-- The deadline at the head of the live deadlines' index, if it passed by :now (else NULL).
(SELECT deadline FROM tasks WHERE ended_at IS NULL AND deadline <= :now
 ORDER BY deadline LIMIT 1)

-- name: tasks_lease_expired
-- Running tasks whose lease ran out, oldest first (bounded sweep). Where rows can be locked,
-- they are, and rows another sweeper or owner holds are left to it.
SELECT task_id, owner, fence, attempts, max_attempts FROM tasks
WHERE state = 'running' AND lease_until <= :now
ORDER BY lease_until
LIMIT :limit
{skip_locked}

-- name: tasks_deadline_passed
-- Live tasks whose deadline passed, oldest first (bounded sweep, locked rows skipped). A task
-- is live while it has not ended (ended_at IS NULL: the index of live deadlines).
SELECT task_id, state, fence, deadline FROM tasks
WHERE ended_at IS NULL AND state IN ({live_task_states}) AND deadline <= :now
ORDER BY deadline
LIMIT :limit
{skip_locked}

-- name: task_get
-- One task, whole.
SELECT * FROM tasks WHERE task_id = :task_id

-- name: task_kept
-- Whether a task exists, kept from a concurrent prune until the transaction ends.
SELECT task_id FROM tasks WHERE task_id = :task_id {for_share}

-- name: task_apply
-- Apply a decision to a task still in the state and fence it was decided on (closing its
-- running attempt, if it was running); returns the task's route, for its reply.
UPDATE tasks
SET state = :to_state, owner = NULL, lease_until = NULL,
    available_at = :available_at, claim_at = :available_at - priority * :priority_weight,
    result = :result, last_error = :last_error, ended_at = :ended_at,
    history = CASE WHEN state = 'running' THEN {history_close} ELSE history END,
    updated_at = :now
WHERE task_id = :task_id AND state = :from_state AND fence = :fence
RETURNING task_id, queue, requester, correlation_id, parent_task_id

-- name: task_apply_owned
-- Apply an owner's decision, only while the owner's claim is current, closing its attempt
-- (given back, for a release); returns the task's route, for its reply.
UPDATE tasks
SET state = :to_state, owner = NULL, lease_until = NULL,
    available_at = :available_at, claim_at = :available_at - priority * :priority_weight,
    result = :result, last_error = :last_error, ended_at = :ended_at,
    attempts = attempts - :give_back, history = {history_close}, updated_at = :now
WHERE task_id = :task_id AND {claim_is_current}
RETURNING task_id, queue, requester, correlation_id, parent_task_id

-- name: task_renew
-- Extend a current claim's lease.
UPDATE tasks SET lease_until = :lease_until, updated_at = :now
WHERE task_id = :task_id AND {claim_is_current}
RETURNING lease_until

-- name: tasks_prunable
-- Stored messages past retention whose task is terminal and whose reply was sent, that no
-- wait still needs as the parent of its follow-up (waiting, or continuation unconsumed), and
-- that no stream still counts on (a position above the watermark); all of them, or the one
-- of :task_id. Their rows are locked for the pruner, and rows another transaction holds are
-- left to a later prune.
SELECT tasks.id, tasks.task_id, tasks.fence AS task_fence, replies.fence AS reply_fence
FROM tasks
JOIN replies ON replies.id = tasks.id
WHERE {tasks_walk} tasks.created_at < :cutoff
  AND (CAST(:task_id AS TEXT) IS NULL OR tasks.task_id = :task_id)
  AND tasks.state IN ({terminal_task_states})
  AND replies.state = 'sent'
  AND NOT EXISTS (
      SELECT 1 FROM waits
      LEFT JOIN wait_continuations
             ON wait_continuations.flow = waits.flow AND wait_continuations.step = waits.step
            AND wait_continuations.generation = waits.generation
      WHERE waits.task_id = tasks.task_id AND wait_continuations.consumed_at IS NULL)
  -- A position above its stream's watermark will be sent again from the watermark: its
  -- identity must stay to make that resend a duplicate.
  AND NOT EXISTS (
      SELECT 1 FROM stream_positions
      JOIN streams ON streams.principal = stream_positions.principal
                  AND streams.stream = stream_positions.stream
      WHERE stream_positions.task_id = tasks.task_id
        AND stream_positions.seq > streams.watermark)
  -- A chain's root goes last, with its chain's row: an identity received again after that
  -- is a new request, and starts a chain of its own.
  AND NOT EXISTS (SELECT 1 FROM tasks member WHERE member.root_task_id = tasks.task_id)
ORDER BY tasks.created_at, tasks.id
LIMIT :limit
{skip_locked}

-- name: published_read
-- A setting the store publishes (the retention period), with the longer period it still
-- honours until a time, after a shortening.
SELECT value, floor_value, floor_until FROM postroom_published WHERE name = :setting

-- name: published_read_locked
-- The same, locked until the transaction ends: an operator's change reads what it replaces.
SELECT value, floor_value, floor_until FROM postroom_published WHERE name = :setting
{for_update}

-- name: published_first
-- Publish a setting unless the store already does: the first opener's value stands.
INSERT INTO postroom_published (name, value) VALUES (:setting, :value)
ON CONFLICT (name) DO NOTHING

-- name: published_set
-- An operator's change of a published setting (or its first publication).
INSERT INTO postroom_published (name, value, floor_value, floor_until)
VALUES (:setting, :value, :floor_value, :floor_until)
ON CONFLICT (name) DO UPDATE SET value = excluded.value, floor_value = excluded.floor_value,
                                 floor_until = excluded.floor_until

-- name: fence_floor_raise
-- Before pruning tasks (replies): no new one may start at or below a fence they reached.
UPDATE postroom_fence_floors SET floor = :floor WHERE kind = :kind AND floor < :floor

-- name: prune_stream_positions
-- Forget the stream positions of a pruned message.
DELETE FROM stream_positions WHERE task_id = :task_id

-- name: prune_requeues
-- Forget the requeue records of a pruned reply.
DELETE FROM reply_requeues WHERE reply_id = :reply_id

-- name: prune_reply
-- Forget a pruned message's reply.
DELETE FROM replies WHERE id = :id

-- name: prune_task
-- Forget a pruned message's task, and with it its identity: a reuse is now a new request.
DELETE FROM tasks WHERE id = :id

-- name: task_counts
-- How many tasks are in each state.
SELECT state, count(*) AS n FROM tasks GROUP BY state

-- name: claim_look
-- What a claim reads before it takes anything, in one statement: whether :queue is paused and
-- how many of its tasks may run at once (NULL: any number), and whether the claim's sweep has
-- anything to do (a lease that ran out, a live deadline that passed: the heads of the
-- sweep's indexes). The sweep's own reads, which lock rows where rows lock, run only then.
SELECT (SELECT 1 FROM paused_queues WHERE queue = :queue) AS paused,
       (SELECT running FROM queue_limits WHERE queue = :queue) AS running_limit,
       {lease_ran_out} IS NOT NULL AS leases,
       {deadline_passed} IS NOT NULL AS deadlines

-- name: queue_free_slots
-- Up to :limit of a limited queue's slots that no running task holds at the fence it was
-- claimed with, locked for this claim (where rows lock; others' locked slots are left to
-- them). A slot is given back by its task leaving running, so nothing has to release it.
SELECT queue_slots.slot FROM queue_slots
LEFT JOIN tasks ON tasks.task_id = queue_slots.task_id AND tasks.state = 'running'
               AND tasks.fence = queue_slots.fence
WHERE queue_slots.queue = :queue AND tasks.task_id IS NULL
ORDER BY queue_slots.slot
LIMIT :limit
{skip_locked_slots}

-- name: queue_slots_held
-- The slots of a queue that a running task holds at the fence it was claimed with, read
-- afresh once a claim has locked its free slots: a slot that another claim took and committed
-- while this one waited for its lock passes queue_free_slots anyway, since READ COMMITTED
-- re-checks the locked slot row but not the task row it joins (still pending in that
-- statement's snapshot).
SELECT queue_slots.slot FROM queue_slots
JOIN tasks ON tasks.task_id = queue_slots.task_id AND tasks.state = 'running'
          AND tasks.fence = queue_slots.fence
WHERE queue_slots.queue = :queue

-- name: queue_slot_take
-- A claimed task holds a slot of its limited queue while it runs under this fence.
UPDATE queue_slots SET task_id = :task_id, fence = :fence
WHERE queue = :queue AND slot = :slot

-- name: queue_running_count
-- How many tasks of a queue are running now.
SELECT count(*) AS n FROM tasks WHERE state = 'running' AND queue = :queue

-- name: queue_pause
-- An operator pauses a queue (a second pause keeps the first one's record).
INSERT INTO paused_queues (queue, operator, reason, paused_at)
VALUES (:queue, :operator, :reason, :now)
ON CONFLICT (queue) DO NOTHING

-- name: queue_resume
-- An operator resumes a paused queue.
DELETE FROM paused_queues WHERE queue = :queue

-- name: queues_paused
-- Every paused queue, by name.
SELECT * FROM paused_queues ORDER BY queue

-- name: queue_limit_set
-- Set (or change) how many tasks of a queue may run at once.
INSERT INTO queue_limits (queue, running) VALUES (:queue, :running)
ON CONFLICT (queue) DO UPDATE SET running = excluded.running

-- name: queue_slot_add
-- One slot of a limited queue.
INSERT INTO queue_slots (queue, slot) VALUES (:queue, :slot)
ON CONFLICT (queue, slot) DO NOTHING

-- name: queue_running_unseated
-- Up to :limit running tasks of a queue that hold none of its slots at their fence (they ran
-- before the queue was limited, or held a slot a lower limit dropped), oldest claim first.
SELECT tasks.task_id, tasks.fence FROM tasks
WHERE tasks.state = 'running' AND tasks.queue = :queue
  AND NOT EXISTS (SELECT 1 FROM queue_slots
                  WHERE queue_slots.queue = :queue AND queue_slots.task_id = tasks.task_id
                    AND queue_slots.fence = tasks.fence)
ORDER BY tasks.claim_at, tasks.task_id
LIMIT :limit

-- name: queue_slots_trim
-- Drop the slots above a lowered limit (a task holding one runs on; no new claim takes it).
DELETE FROM queue_slots WHERE queue = :queue AND slot > :running

-- name: queue_limit_clear
-- Lift a queue's limit.
DELETE FROM queue_limits WHERE queue = :queue

-- name: queue_limits_all
-- Every limited queue and its limit.
SELECT queue, running FROM queue_limits ORDER BY queue

-- name: task_get_locked
-- One task, whole, locked until the transaction ends (an operator's decision about it).
SELECT * FROM tasks WHERE task_id = :task_id {for_update}

-- name: task_retry_count
-- How many times an operator ran a task again.
SELECT count(*) AS n FROM task_retries WHERE task_id = :task_id

-- name: task_retry_insert
-- Record an operator's decision to run a task again, and the task it made.
INSERT INTO task_retries (task_id, number, new_task_id, operator, reason, retried_at,
                          request_id)
VALUES (:task_id, :number, :new_task_id, :operator, :reason, :now, :request_id)

-- name: task_retry_requested
-- The re-run of a task that a request with this id made, if it made one.
SELECT * FROM task_retries WHERE task_id = :task_id AND request_id = :request_id

-- name: task_retries_of
-- The recorded re-runs of a task, oldest first.
SELECT * FROM task_retries WHERE task_id = :task_id ORDER BY number

-- name: prune_chain
-- Forget the chain a pruned root started (the pruner takes a root only after every other
-- task of its chain).
DELETE FROM chains WHERE root_task_id = :task_id

-- name: prune_task_retries
-- Forget the re-run records of a pruned task (the new tasks stay, each its own).
DELETE FROM task_retries WHERE task_id = :task_id

-- Invariants of re-runs and limited queues, for postroom audit (see postroom.audit.CHECKS).

-- name: audit_store_retry_of_unrerunnable_task
-- An operator ran a task again only from failed, expired or cancelled, and a re-run never
-- rewrites it, so the task a re-run record names is still in one of those states (pruning a
-- task forgets its records with it).
SELECT task_retries.task_id || '#' || task_retries.number AS identity,
       'the task is ' || coalesce(tasks.state, 'missing') AS detail
FROM task_retries
LEFT JOIN tasks ON tasks.task_id = task_retries.task_id
WHERE tasks.state IS NULL OR tasks.state NOT IN ('failed', 'expired', 'cancelled')

-- name: audit_store_retry_link_mismatch
-- A re-run record and its new task name each other: the new task (while it is kept) runs the
-- recorded task again, and a task that runs a kept task again has its record. (A task created
-- after its re-run is another one of that identity, received again after a prune forgot the
-- first with its records.)
SELECT task_retries.task_id || '#' || task_retries.number AS identity,
       'new task ' || task_retries.new_task_id || ' runs '
       || coalesce(tasks.retry_of, 'nothing') || ' again' AS detail
FROM task_retries
JOIN tasks ON tasks.task_id = task_retries.new_task_id
WHERE tasks.retry_of IS NULL OR tasks.retry_of <> task_retries.task_id
UNION ALL
SELECT tasks.task_id AS identity, 'runs ' || tasks.retry_of || ' again, unrecorded' AS detail
FROM tasks
JOIN tasks AS old ON old.task_id = tasks.retry_of AND old.created_at <= tasks.created_at
LEFT JOIN task_retries ON task_retries.new_task_id = tasks.task_id
WHERE task_retries.new_task_id IS NULL

-- name: audit_store_retry_numbers_gap
-- A task's re-runs are numbered 1..n, one each: a gap means a decision was lost.
SELECT task_id AS identity, count(*) || ' re-runs numbered up to ' || max(number) AS detail
FROM task_retries
GROUP BY task_id
HAVING count(*) <> max(number)

-- name: audit_store_pending_without_claim_at
-- Every pending task has its turn (claim_at): one without is never claimed.
SELECT task_id AS identity, 'pending without claim_at' AS detail
FROM tasks
WHERE state = 'pending' AND claim_at IS NULL
