-- postroom store, version 5 (PostgreSQL): replies that can be routed, the story of every
-- attempt, waits addressed to a responder, and outcome counts that do not grow with history,
-- as in the SQLite schema.

-- Who a task's reply goes to: the principal that sent the chain's root (see SQLite's).
ALTER TABLE tasks ADD COLUMN requester TEXT;
WITH RECURSIVE chain (task_id, requester) AS (
    SELECT task_id, principal FROM tasks WHERE parent_task_id IS NULL
    UNION ALL
    SELECT tasks.task_id, chain.requester FROM tasks JOIN chain ON tasks.parent_task_id = chain.task_id
)
UPDATE tasks SET requester = chain.requester FROM chain WHERE chain.task_id = tasks.task_id;
UPDATE tasks SET requester = principal WHERE requester IS NULL;

-- Each attempt of a task, as a JSON array (text) kept in the task's own row.
ALTER TABLE tasks ADD COLUMN history TEXT;

-- Listing tasks newest first by a keyset cursor.
CREATE INDEX tasks_by_created ON tasks (created_at, task_id);
-- The pending backlog in the same order (see SQLite's).
CREATE INDEX tasks_pending_by_created ON tasks (created_at, task_id) WHERE state = 'pending';

-- A reply's route and each delivery attempt.
ALTER TABLE replies ADD COLUMN requester TEXT;
ALTER TABLE replies ADD COLUMN queue TEXT;
ALTER TABLE replies ADD COLUMN history TEXT;
UPDATE replies SET requester = tasks.requester, queue = tasks.queue
FROM tasks WHERE tasks.task_id = replies.task_id;
-- Dead replies wait for an operator: listed oldest first.
CREATE INDEX replies_dead ON replies (updated_at, reply_id) WHERE state = 'dead';

-- The principal whose answer a wait waits for (NULL: any allowed principal).
ALTER TABLE waits ADD COLUMN responder TEXT;

-- Cumulative outcome counts per queue, spread over the high-water's 64 shards (each
-- connection adds to the row of its server process), summed by a reader.
CREATE TABLE postroom_counts (
    kind   TEXT NOT NULL CHECK (kind IN ('task', 'reply')),
    queue  TEXT NOT NULL,
    state  TEXT NOT NULL,
    shard  INTEGER NOT NULL CHECK (shard >= 0 AND shard < 64),
    n      BIGINT NOT NULL CHECK (n >= 0),
    PRIMARY KEY (kind, queue, state, shard)
);
INSERT INTO postroom_counts (kind, queue, state, shard, n)
SELECT 'task', queue, state, 0, count(*) FROM tasks
WHERE state NOT IN ('pending', 'running') GROUP BY queue, state;
INSERT INTO postroom_counts (kind, queue, state, shard, n)
SELECT 'reply', queue, state, 0, count(*) FROM replies WHERE state = 'sent' GROUP BY queue, state;
