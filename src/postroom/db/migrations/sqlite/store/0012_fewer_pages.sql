-- postroom store, version 12: fewer pages per task. Every b-tree a commit touches costs it at
-- least one page of WAL, and a random 64-character key costs more (its leaf pages split
-- often), so the layout keeps one b-tree per question a rule asks:
--
-- * a task is one row, keyed inside the store by an integer in arrival order (``id``); its
--   outside identity (``task_id``) has the one unique index. The inbox row it used to have
--   beside it is folded in: the identity's content fingerprint and the envelope as received
--   are columns of the task, and the task's created_at is when it was received;
-- * a reply is keyed by its task's ``id``: its own identity (``reply:`` + task_id) and its
--   task's are found through the task's, with no index of their own;
-- * the listings order by (created_at, id) rather than by a 64-character key;
-- * a root's chain is NULL in ``root_task_id`` (only members name their root), so the index
--   of a chain's members holds no roots;
-- * ``ended_at`` says when a task became terminal (NULL while it is live). The index of live
--   deadlines is kept on it, so a claim -- which changes the state but not that -- leaves it
--   alone.

CREATE TABLE tasks_v12 (
    -- Arrival order, inside the store only (replies share their task's).
    id              INTEGER PRIMARY KEY,
    task_id         TEXT NOT NULL UNIQUE,
    principal       TEXT NOT NULL,
    message_id      TEXT NOT NULL,
    -- The identity's content fingerprint and the envelope as received (the former inbox).
    fingerprint     TEXT NOT NULL,
    envelope        TEXT NOT NULL,
    queue           TEXT NOT NULL,
    state           TEXT NOT NULL CHECK (state IN ('pending', 'running', 'done', 'failed',
                                                   'cancelled', 'expired', 'hop_limit',
                                                   'budget_exhausted')),
    payload         TEXT NOT NULL,
    deadline        REAL NOT NULL,
    max_attempts    INTEGER NOT NULL,
    hops            INTEGER NOT NULL,
    parent_task_id  TEXT,
    correlation_id  TEXT,
    attempts        INTEGER NOT NULL DEFAULT 0,
    fence           INTEGER NOT NULL DEFAULT 0,
    owner           TEXT,
    lease_until     REAL,
    available_at    REAL NOT NULL,
    result          TEXT,
    last_error      TEXT,
    created_at      REAL NOT NULL,
    updated_at      REAL NOT NULL,
    requester       TEXT,
    history         TEXT,
    not_before      REAL,
    priority        INTEGER NOT NULL DEFAULT 0 CHECK (priority BETWEEN -10 AND 10),
    claim_at        REAL,
    retry_of        TEXT,
    -- The chain's root, for a member of a chain; NULL for a root.
    root_task_id    TEXT,
    -- When it became terminal; NULL while pending or running.
    ended_at        REAL
);
INSERT INTO tasks_v12 (task_id, principal, message_id, fingerprint, envelope, queue, state,
                       payload, deadline, max_attempts, hops, parent_task_id, correlation_id,
                       attempts, fence, owner, lease_until, available_at, result, last_error,
                       created_at, updated_at, requester, history, not_before, priority,
                       claim_at, retry_of, root_task_id, ended_at)
SELECT tasks.task_id, tasks.principal, tasks.message_id, inbox.fingerprint, inbox.envelope,
       tasks.queue, tasks.state, tasks.payload, tasks.deadline, tasks.max_attempts, tasks.hops,
       tasks.parent_task_id, tasks.correlation_id, tasks.attempts, tasks.fence, tasks.owner,
       tasks.lease_until, tasks.available_at, tasks.result, tasks.last_error, tasks.created_at,
       tasks.updated_at, tasks.requester, tasks.history, tasks.not_before, tasks.priority,
       tasks.claim_at, tasks.retry_of,
       CASE WHEN tasks.root_task_id <> tasks.task_id THEN tasks.root_task_id END,
       -- Nothing changes a terminal task, so its last update is when it ended.
       CASE WHEN tasks.state NOT IN ('pending', 'running') THEN tasks.updated_at END
FROM tasks
LEFT JOIN inbox ON inbox.task_id = tasks.task_id  -- a task without one fails NOT NULL, loudly
ORDER BY tasks.created_at, tasks.task_id;

CREATE TABLE replies_v12 (
    -- Its task's id.
    id            INTEGER PRIMARY KEY,
    reply_id      TEXT NOT NULL,
    task_id       TEXT NOT NULL,
    status        TEXT NOT NULL,
    body          TEXT NOT NULL,
    fingerprint   TEXT NOT NULL,
    state         TEXT NOT NULL CHECK (state IN ('pending', 'sending', 'sent', 'dead')),
    attempts      INTEGER NOT NULL DEFAULT 0,
    budget        INTEGER NOT NULL,
    fence         INTEGER NOT NULL DEFAULT 0,
    owner         TEXT,
    lease_until   REAL,
    available_at  REAL NOT NULL,
    last_error    TEXT,
    created_at    REAL NOT NULL,
    updated_at    REAL NOT NULL,
    sent_at       REAL,
    requester     TEXT,
    queue         TEXT,
    history       TEXT,
    parked_at     REAL
);
INSERT INTO replies_v12 (id, reply_id, task_id, status, body, fingerprint, state, attempts,
                         budget, fence, owner, lease_until, available_at, last_error,
                         created_at, updated_at, sent_at, requester, queue, history, parked_at)
SELECT tasks_v12.id, replies.reply_id, replies.task_id, replies.status, replies.body,
       replies.fingerprint, replies.state, replies.attempts, replies.budget, replies.fence,
       replies.owner, replies.lease_until, replies.available_at, replies.last_error,
       replies.created_at, replies.updated_at, replies.sent_at, replies.requester,
       replies.queue, replies.history, replies.parked_at
FROM replies
LEFT JOIN tasks_v12 ON tasks_v12.task_id = replies.task_id;  -- none without its task

DROP TABLE replies;
DROP TABLE tasks;
DROP TABLE inbox;
ALTER TABLE tasks_v12 RENAME TO tasks;
ALTER TABLE replies_v12 RENAME TO replies;

-- Claiming reads the head of one queue; sweeps read the head of the leases and deadlines.
CREATE INDEX tasks_claimable ON tasks (queue, claim_at) WHERE state = 'pending';
CREATE INDEX tasks_running_leases ON tasks (lease_until) WHERE state = 'running';
CREATE INDEX tasks_live_deadlines ON tasks (deadline) WHERE ended_at IS NULL;
-- Listings, newest first (and pruning, oldest first); the pending backlog apart.
CREATE INDEX tasks_by_created ON tasks (created_at, id);
CREATE INDEX tasks_pending_by_created ON tasks (created_at, id) WHERE state = 'pending';
-- A chain's members (cancelling a root, pruning it last, the audit), and a task's children.
CREATE INDEX tasks_by_root ON tasks (root_task_id) WHERE root_task_id IS NOT NULL;
CREATE INDEX tasks_by_parent ON tasks (parent_task_id) WHERE parent_task_id IS NOT NULL;

CREATE INDEX replies_ready ON replies (available_at) WHERE state = 'pending' AND parked_at IS NULL;
CREATE INDEX replies_sending_leases ON replies (lease_until) WHERE state = 'sending';
CREATE INDEX replies_dead ON replies (updated_at, id) WHERE state = 'dead';
CREATE INDEX replies_parked ON replies (requester) WHERE parked_at IS NOT NULL;
