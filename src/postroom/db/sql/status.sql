-- Reads for the store's status and its listings. Nothing here writes.
--
-- Every statement walks an index that holds only the rows it wants: the counts walk the
-- partial indexes of live rows (one SELECT per state, each predicate exactly an index's, so
-- neither backend is tempted into a scan of the table), and the cumulative counts are read
-- from postroom_counts, whose size follows queues and states, never the history. The
-- listings follow a keyset: each page starts strictly after the last key of the page before
-- (the bound is computed by the caller, which also stands in for "no bound" with +/-infinity).

-- name: status_live_counts
-- Live tasks and replies per queue and state: pending and running tasks; pending (ready, or
-- parked until their requester has an endpoint), sending and dead replies. Each part walks
-- its state's partial index.
SELECT 'task' AS kind, queue, 'pending' AS state, count(*) AS n
FROM tasks WHERE state = 'pending' GROUP BY queue
UNION ALL
SELECT 'task' AS kind, queue, 'running' AS state, count(*) AS n
FROM tasks WHERE state = 'running' GROUP BY queue
UNION ALL
SELECT 'reply' AS kind, queue, 'pending' AS state, count(*) AS n
FROM replies WHERE {live_reply} AND state = 'pending' GROUP BY queue
UNION ALL
SELECT 'reply' AS kind, queue, 'parked' AS state, count(*) AS n
FROM replies WHERE parked_at IS NOT NULL GROUP BY queue
UNION ALL
SELECT 'reply' AS kind, queue, 'sending' AS state, count(*) AS n
FROM replies WHERE {live_reply} AND state = 'sending' GROUP BY queue
UNION ALL
SELECT 'reply' AS kind, queue, 'dead' AS state, count(*) AS n
FROM replies WHERE state = 'dead' GROUP BY queue

-- name: status_cumulative_counts
-- Tasks that reached each terminal state and replies sent, per queue, since the store began:
-- the shards of postroom_counts summed (its clock rows left out).
SELECT kind, queue, state, sum(n) AS n FROM postroom_counts WHERE kind <> 'clock'
GROUP BY kind, queue, state

-- name: status_wait_counts
-- Open waits (each walks the partial index of waiting generations) and continuations still
-- to resume (the partial index of unconsumed ones).
SELECT 'open_waits' AS name, count(*) AS n FROM waits WHERE state = 'waiting'
UNION ALL
SELECT 'continuations_unconsumed' AS name, count(*) AS n
FROM wait_continuations WHERE consumed_at IS NULL

-- fragment: task_page_bounds
-- A page of tasks below the key (:upper_created, :upper_id), created after
-- :lower_created, of :queue and :principal when given.
(created_at, id) < (:upper_created, :upper_id) AND created_at > :lower_created
  AND (CAST(:queue AS TEXT) IS NULL OR queue = :queue)
  AND (CAST(:principal AS TEXT) IS NULL OR principal = :principal)

-- name: tasks_page
-- A page of tasks, newest first, of :state when given (a terminal state: these are the
-- history, and this walks the order of creation from the page's bound down: the table by
-- id, between :walk_above and :walk_below, where ids follow creation, else tasks_by_created).
SELECT * FROM tasks
WHERE {tasks_walk} {task_page_bounds} AND (CAST(:state AS TEXT) IS NULL OR state = :state)
ORDER BY {tasks_newest_first}
LIMIT :limit

-- name: tasks_page_pending
-- A page of pending tasks, newest first: walks the partial index of the pending backlog.
SELECT * FROM tasks
WHERE state = 'pending' AND {task_page_bounds}
ORDER BY created_at DESC, id DESC
LIMIT :limit

-- name: tasks_page_running
-- A page of running tasks, newest first. The running tasks (one per claim held) are
-- collected from their partial index first and ordered among themselves: the walk of
-- tasks_by_created a planner may otherwise prefer passes through the whole history.
WITH running AS MATERIALIZED (
    SELECT * FROM tasks WHERE state = 'running'
)
SELECT * FROM running
WHERE {task_page_bounds}
ORDER BY created_at DESC, id DESC
LIMIT :limit

-- name: waits_page
-- A page of waiting generations due before :due_before, earliest deadline first, after the
-- key (:after_deadline, :after_flow, :after_step, :after_generation): walks waits_due.
SELECT * FROM waits
WHERE state = 'waiting' AND deadline < :due_before
  AND (deadline, flow, step, generation)
      > (:after_deadline, :after_flow, :after_step, :after_generation)
ORDER BY deadline, flow, step, generation
LIMIT :limit

-- name: replies_dead_page
-- A page of dead replies, the longest dead first, after the key (:after_updated,
-- :after_id): walks replies_dead.
SELECT * FROM replies
WHERE state = 'dead' AND (updated_at, id) > (:after_updated, :after_id)
ORDER BY updated_at, id
LIMIT :limit

-- name: observe_recent_tasks
-- The tasks created since :since, newest first, with their replies' delivery history (NULL
-- while a task has no reply): walks the order of creation from its newest end (the table
-- by id down to :walk_above where ids follow creation, else tasks_by_created), then one
-- reply per task by its task's id.
SELECT tasks.*, replies.history AS delivery_history
FROM tasks LEFT JOIN replies ON replies.id = tasks.id
WHERE {tasks_walk} tasks.created_at >= :since
ORDER BY {tasks_newest_first}
LIMIT :limit

-- name: observe_pending_before
-- Tasks created before :since that are still pending: walks the pending backlog's index.
SELECT count(*) AS n FROM tasks WHERE state = 'pending' AND created_at < :since

-- name: observe_oldest_undelivered
-- Per queue and part, when its oldest undelivered reply was written (the caller takes the
-- oldest of the parts): pending and sending replies, then parked ones, each part through its
-- partial index, so only live rows are read.
SELECT queue, min(created_at) AS oldest FROM replies
WHERE {live_reply} AND queue IS NOT NULL GROUP BY queue
UNION ALL
SELECT queue, min(created_at) AS oldest FROM replies
WHERE parked_at IS NOT NULL AND queue IS NOT NULL GROUP BY queue
