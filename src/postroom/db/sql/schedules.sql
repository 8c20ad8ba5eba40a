-- Periodic schedules (see postroom.schedules): their definitions, and the rounds that enqueue
-- one task per period.

-- name: schedule_get
-- One schedule by name.
SELECT * FROM schedules WHERE name = :schedule

-- name: schedule_get_locked
-- One schedule by name, locked for a change of its definition or state.
SELECT * FROM schedules WHERE name = :schedule {for_update}

-- name: schedules_all
-- Every schedule, by name.
SELECT * FROM schedules ORDER BY name

-- name: schedule_insert
-- A new schedule; its first period is the first fire time after its creation.
INSERT INTO schedules (name, cron, zone, queue, payload, priority, max_attempts, ttl, missed,
                       paused, last_period, last_key, last_task_id, next_at, created_by,
                       created_at, updated_by, updated_at)
VALUES (:schedule, :cron, :zone, :queue, :payload, :priority, :max_attempts, :ttl, :missed, 0,
        NULL, NULL, NULL, :next_at, :operator, :now, :operator, :now)
ON CONFLICT (name) DO NOTHING

-- name: schedule_replace
-- A new definition for a schedule: what it has handled stays handled, and its next period
-- is the new expression's first fire time after that (or after now, if it handled none).
UPDATE schedules
SET cron = :cron, zone = :zone, queue = :queue, payload = :payload, priority = :priority,
    max_attempts = :max_attempts, ttl = :ttl, missed = :missed, next_at = :next_at,
    updated_by = :operator, updated_at = :now
WHERE name = :schedule

-- name: schedule_set_paused
-- Pause (:paused = 1) or resume (0) a schedule; no row if it already was.
UPDATE schedules SET paused = :paused, updated_by = :operator, updated_at = :now
WHERE name = :schedule AND paused <> :paused

-- name: schedule_remove
-- Forget a schedule (the tasks it enqueued stay as they are).
DELETE FROM schedules WHERE name = :schedule

-- name: schedules_due_any
-- Whether any schedule that is not paused has a period begun (the idle round's one look).
SELECT 1 AS due FROM schedules WHERE paused = 0 AND next_at <= :now LIMIT 1

-- name: schedules_due
-- Up to :limit schedules whose next period has begun, the longest due first, locked for this
-- round (those another host's round holds are left to it, where rows lock).
SELECT name FROM schedules
WHERE paused = 0 AND next_at <= :now
ORDER BY next_at
LIMIT :limit
{skip_locked}

-- name: schedule_advance
-- A round handled every period of a schedule up to :last_period: the next one begins at
-- :next_at. Guarded by the next_at the round read, so a round that lost a race writes nothing.
UPDATE schedules
SET last_period = :last_period, last_key = coalesce(:last_key, last_key),
    last_task_id = coalesce(:last_task_id, last_task_id), next_at = :next_at
WHERE name = :schedule AND next_at = :expected AND paused = 0

-- Invariants of schedules, for postroom audit (see postroom.audit.CHECKS).

-- name: audit_store_schedule_next_not_after_last
-- A schedule's next period begins after the last one it handled.
SELECT name AS identity, 'next_at ' || next_at || ' <= last_period ' || last_period AS detail
FROM schedules
WHERE next_at <= last_period

-- name: audit_store_schedule_task_ahead
-- A schedule's tasks are for periods it has handled: a task stored since the schedule was
-- made (its first period begins after that, so strictly after), for a later period than the
-- last one it enqueued, was not enqueued with its period.
SELECT tasks.task_id AS identity,
       'period ' || tasks.message_id || ' after the last enqueued, '
       || coalesce(schedules.last_key, 'none') AS detail
FROM schedules
JOIN tasks ON tasks.principal = 'schedule:' || schedules.name
WHERE tasks.created_at > schedules.created_at
  AND (schedules.last_key IS NULL OR tasks.message_id > schedules.last_key)

-- name: audit_store_schedule_last_task_mismatch
-- The task a schedule names as its last is the one of its last period enqueued.
SELECT schedules.name AS identity,
       'last task ' || tasks.task_id || ' is for ' || tasks.message_id || ', not '
       || coalesce(schedules.last_key, 'none') AS detail
FROM schedules
JOIN tasks ON tasks.task_id = schedules.last_task_id
WHERE tasks.principal <> 'schedule:' || schedules.name
   OR schedules.last_key IS NULL OR tasks.message_id <> schedules.last_key

-- name: audit_store_schedule_task_identity
-- A schedule's task is identified by its period's start in one fixed form (ISO 8601 UTC to
-- the second), so no period can be stored under two identities: two tasks for one period.
SELECT task_id AS identity, 'message_id ' || message_id AS detail
FROM tasks
WHERE substr(principal, 1, 9) = 'schedule:'
  AND (length(message_id) <> 20 OR message_id NOT LIKE '____-__-__T__:__:__Z')
