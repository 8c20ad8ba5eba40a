-- Reads for the store's status. Nothing here writes.
--
-- Every statement walks an index that holds only the rows it wants: the counts walk the
-- partial indexes of live rows (one SELECT per state, each predicate exactly an index's, so
-- neither backend is tempted into a scan of the table), and the cumulative counts are read
-- from postroom_counts, whose size follows queues and states, never the history.

-- name: status_live_counts
-- Live tasks and replies per queue and state: pending and running tasks; pending, sending
-- and dead replies. Each part walks its state's partial index.
SELECT 'task' AS kind, queue, 'pending' AS state, count(*) AS n
FROM tasks WHERE state = 'pending' GROUP BY queue
UNION ALL
SELECT 'task' AS kind, queue, 'running' AS state, count(*) AS n
FROM tasks WHERE state = 'running' GROUP BY queue
UNION ALL
SELECT 'reply' AS kind, queue, 'pending' AS state, count(*) AS n
FROM replies WHERE state = 'pending' GROUP BY queue
UNION ALL
SELECT 'reply' AS kind, queue, 'sending' AS state, count(*) AS n
FROM replies WHERE state = 'sending' GROUP BY queue
UNION ALL
SELECT 'reply' AS kind, queue, 'dead' AS state, count(*) AS n
FROM replies WHERE state = 'dead' GROUP BY queue

-- name: status_cumulative_counts
-- Tasks that reached each terminal state and replies sent, per queue, since the store began:
-- the shards of postroom_counts summed.
SELECT kind, queue, state, sum(n) AS n FROM postroom_counts GROUP BY kind, queue, state

-- name: status_wait_counts
-- Open waits (each walks the partial index of waiting generations) and continuations still
-- to resume (the partial index of unconsumed ones).
SELECT 'open_waits' AS name, count(*) AS n FROM waits WHERE state = 'waiting'
UNION ALL
SELECT 'continuations_unconsumed' AS name, count(*) AS n
FROM wait_continuations WHERE consumed_at IS NULL
