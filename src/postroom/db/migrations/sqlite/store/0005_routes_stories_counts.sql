-- postroom store, version 5: replies that can be routed, the story of every attempt, waits
-- addressed to a responder, and outcome counts that do not grow with history.

-- Who a task's reply goes to: the principal that sent the chain's root (for a task it sent
-- itself, its own principal; for a follow-up, its parent's requester). Tasks stored before
-- this version get it from their chain; one whose parent is already pruned, from its own
-- principal.
ALTER TABLE tasks ADD COLUMN requester TEXT;
WITH RECURSIVE chain (task_id, requester) AS (
    SELECT task_id, principal FROM tasks WHERE parent_task_id IS NULL
    UNION ALL
    SELECT tasks.task_id, chain.requester FROM tasks JOIN chain ON tasks.parent_task_id = chain.task_id
)
UPDATE tasks SET requester = (SELECT requester FROM chain WHERE chain.task_id = tasks.task_id);
UPDATE tasks SET requester = principal WHERE requester IS NULL;

-- Each attempt of a task, in order, as a JSON array kept in the task's own row (so it is
-- pruned with it and costs no index): {"attempt", "fence", "owner", "started_at",
-- "ended_at", "outcome", "error"}. NULL for a task never claimed.
ALTER TABLE tasks ADD COLUMN history TEXT;

-- Listing tasks newest first by a keyset cursor; written once per task (created_at never
-- changes), at the index's right edge.
CREATE INDEX tasks_by_created ON tasks (created_at, task_id);
-- The pending backlog in the same order, so listing it walks only pending tasks, never
-- the history (tasks_claimable's order, queue and availability, has no unique key to
-- resume a page from). Written when a task becomes pending, dropped when it is claimed.
CREATE INDEX tasks_pending_by_created ON tasks (created_at, task_id) WHERE state = 'pending';

-- A reply's route (copied from its task when the reply is written, so the dispatcher reads
-- one row) and each delivery attempt, as for tasks.
ALTER TABLE replies ADD COLUMN requester TEXT;
ALTER TABLE replies ADD COLUMN queue TEXT;
ALTER TABLE replies ADD COLUMN history TEXT;
UPDATE replies SET requester = (SELECT requester FROM tasks WHERE tasks.task_id = replies.task_id),
                   queue = (SELECT queue FROM tasks WHERE tasks.task_id = replies.task_id);
-- Dead replies wait for an operator: listed oldest first.
CREATE INDEX replies_dead ON replies (updated_at, reply_id) WHERE state = 'dead';

-- The principal whose answer a wait waits for (NULL: any allowed principal).
ALTER TABLE waits ADD COLUMN responder TEXT;

-- How many tasks reached each terminal state, and how many replies were sent, per queue:
-- cumulative since the store began (pruning does not take them back), so counting them costs
-- the same whatever the history. Spread over shards like the time high-water, so concurrent
-- writers do not queue on one row; a reader sums the shards.
CREATE TABLE postroom_counts (
    kind   TEXT NOT NULL CHECK (kind IN ('task', 'reply')),
    queue  TEXT NOT NULL,
    state  TEXT NOT NULL,
    shard  INTEGER NOT NULL,
    n      INTEGER NOT NULL CHECK (n >= 0),
    PRIMARY KEY (kind, queue, state, shard)
) WITHOUT ROWID;
INSERT INTO postroom_counts (kind, queue, state, shard, n)
SELECT 'task', queue, state, 1, count(*) FROM tasks
WHERE state NOT IN ('pending', 'running') GROUP BY queue, state;
INSERT INTO postroom_counts (kind, queue, state, shard, n)
SELECT 'reply', queue, state, 1, count(*) FROM replies WHERE state = 'sent' GROUP BY queue, state;
