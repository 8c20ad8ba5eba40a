-- Waits, signal receipts, continuations and effects (SPEC §5). Every decision on a slot
-- first reads the slot with {for_update}, so on a database that locks rows the decisions on
-- one (flow, step) are serialized; SQLite's BEGIN IMMEDIATE already serializes every writer.
-- Terminal updates are guarded by the state they expect; inserts are guarded by unique keys.

-- name: wait_slot_lock
-- The current generation of a slot (no row: 0), locked for the rest of the transaction.
SELECT generation FROM wait_slots WHERE flow = :flow AND step = :step {for_update}

-- name: wait_slot_create
-- Open a slot's first generation, unless someone else just did.
INSERT INTO wait_slots (flow, step, generation) VALUES (:flow, :step, :generation)
ON CONFLICT (flow, step) DO NOTHING
RETURNING generation

-- name: wait_slot_advance
-- Compare-and-set a slot's generation from :expected to :generation.
UPDATE wait_slots SET generation = :generation
WHERE flow = :flow AND step = :step AND generation = :expected
RETURNING generation

-- name: wait_insert
-- A new generation, waiting.
INSERT INTO waits (flow, step, generation, state, deadline, task_id, request_id, responder,
                   opened_at)
VALUES (:flow, :step, :generation, 'waiting', :deadline, :task_id, :request_id, :responder,
        :now)

-- name: wait_get
-- One generation of a wait, with its continuation's kind and consumption (if any).
SELECT waits.*, wait_continuations.kind AS continuation_kind,
       wait_continuations.consumed_at AS continuation_consumed_at
FROM waits
LEFT JOIN wait_continuations
       ON wait_continuations.flow = waits.flow AND wait_continuations.step = waits.step
      AND wait_continuations.generation = waits.generation
WHERE waits.flow = :flow AND waits.step = :step AND waits.generation = :generation

-- name: waits_of_task
-- The waits a task opened (the parent of their follow-ups), oldest first.
SELECT * FROM waits WHERE task_id = :task_id ORDER BY opened_at, flow, step, generation

-- name: wait_by_request
-- The generation a registration request id opened in a slot, with what it was asked.
SELECT generation, deadline, task_id, responder FROM waits
WHERE flow = :flow AND step = :step AND request_id = :request_id

-- name: wait_end
-- End a generation that is still waiting: signaled (with the adopted event) or timed out.
UPDATE waits
SET state = :to_state, ended_at = :now, event_principal = :event_principal,
    event_id = :event_id
WHERE flow = :flow AND step = :step AND generation = :generation AND state = 'waiting'
RETURNING generation

-- name: waits_due
-- Waiting generations whose deadline has come, earliest first (bounded sweep).
SELECT flow, step, generation FROM waits
WHERE state = 'waiting' AND deadline <= :now
ORDER BY deadline, flow, step, generation
LIMIT :limit

-- name: wait_receipt_get
-- The receipt of one principal's event id.
SELECT * FROM wait_receipts WHERE principal = :principal AND event_id = :event_id

-- name: wait_receipt_insert
-- Record a signal's outcome, unless the event id was recorded meanwhile.
INSERT INTO wait_receipts (principal, event_id, flow, step, generation, value, result,
                           received_at)
VALUES (:principal, :event_id, :flow, :step, :generation, :value, :result, :now)
ON CONFLICT (principal, event_id) DO NOTHING
RETURNING event_id

-- name: continuation_insert
-- The continuation of a generation that just ended (one per generation, by its key).
INSERT INTO wait_continuations (flow, step, generation, kind, value, created_at)
VALUES (:flow, :step, :generation, :kind, :value, :now)

-- name: continuation_consume
-- Consume a continuation that nobody consumed yet.
UPDATE wait_continuations SET consumed_at = :now
WHERE flow = :flow AND step = :step AND generation = :generation AND consumed_at IS NULL
RETURNING kind, value

-- name: continuation_get
-- One continuation with its wait's parent task and the effect its consumption applied.
SELECT wait_continuations.*, waits.task_id AS wait_task_id,
       wait_effects.task_id AS effect_task_id
FROM wait_continuations
JOIN waits
  ON waits.flow = wait_continuations.flow AND waits.step = wait_continuations.step
 AND waits.generation = wait_continuations.generation
LEFT JOIN wait_effects
       ON wait_effects.flow = wait_continuations.flow
      AND wait_effects.step = wait_continuations.step
      AND wait_effects.generation = wait_continuations.generation
WHERE wait_continuations.flow = :flow AND wait_continuations.step = :step
  AND wait_continuations.generation = :generation

-- name: continuations_unconsumed
-- Continuations still to resume, oldest first, with their wait's parent task.
SELECT wait_continuations.*, waits.task_id
FROM wait_continuations
JOIN waits
  ON waits.flow = wait_continuations.flow AND waits.step = wait_continuations.step
 AND waits.generation = wait_continuations.generation
WHERE wait_continuations.consumed_at IS NULL
  AND (CAST(:step AS TEXT) IS NULL OR wait_continuations.step = :step)
ORDER BY wait_continuations.created_at, wait_continuations.flow, wait_continuations.step,
         wait_continuations.generation
LIMIT :limit

-- name: wait_effect_insert
-- The local effect of a continuation consumed in this transaction (one, by its key).
INSERT INTO wait_effects (flow, step, generation, kind, task_id, applied_at)
VALUES (:flow, :step, :generation, :kind, :task_id, :now)

-- name: wait_current
-- The current generation of a slot, for reading.
SELECT generation FROM wait_slots WHERE flow = :flow AND step = :step

-- name: wait_counts
-- How many wait generations are in each state.
SELECT state, count(*) AS n FROM waits GROUP BY state

-- name: continuations_unconsumed_count
-- How many continuations are waiting to be resumed.
SELECT count(*) AS n FROM wait_continuations WHERE consumed_at IS NULL
