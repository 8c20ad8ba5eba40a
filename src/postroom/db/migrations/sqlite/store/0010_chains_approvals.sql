-- postroom store, version 10: chains and their budgets (SPEC §7), and human approvals of
-- side effects (SPEC §6, at the end). Every task records the
-- root of its chain; a chain's row holds its budgets (the store's settings, lowered by the
-- root's envelope) and what it has spent, and is locked by every transaction that adds work
-- to it. A chain's new work past a budget is stored as budget_exhausted.

-- SQLite cannot widen a CHECK in place: the tasks table is rebuilt with the new state (and
-- the root column), keeping every column and index it had at version 7.
CREATE TABLE tasks_v10 (
    task_id         TEXT PRIMARY KEY,
    principal       TEXT NOT NULL,
    message_id      TEXT NOT NULL,
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
    -- The chain's root (the task itself for a root).
    root_task_id    TEXT
);
INSERT INTO tasks_v10 (task_id, principal, message_id, queue, state, payload, deadline,
                       max_attempts, hops, parent_task_id, correlation_id, attempts, fence,
                       owner, lease_until, available_at, result, last_error, created_at,
                       updated_at, requester, history, not_before, priority, claim_at,
                       retry_of)
SELECT task_id, principal, message_id, queue, state, payload, deadline, max_attempts, hops,
       parent_task_id, correlation_id, attempts, fence, owner, lease_until, available_at,
       result, last_error, created_at, updated_at, requester, history, not_before, priority,
       claim_at, retry_of
FROM tasks;
DROP TABLE tasks;
ALTER TABLE tasks_v10 RENAME TO tasks;
CREATE INDEX tasks_running_leases ON tasks (lease_until) WHERE state = 'running';
CREATE INDEX tasks_live_deadlines ON tasks (deadline) WHERE state IN ('pending', 'running');
CREATE INDEX tasks_by_created ON tasks (created_at, task_id);
CREATE INDEX tasks_pending_by_created ON tasks (created_at, task_id) WHERE state = 'pending';
CREATE INDEX tasks_claimable ON tasks (queue, claim_at) WHERE state = 'pending';

-- Roots of tasks stored before this version, from their chain; one whose parent is already
-- pruned is the root of what is left of its chain.
WITH RECURSIVE chain (task_id, root_task_id) AS (
    SELECT task_id, task_id FROM tasks
    WHERE parent_task_id IS NULL
       OR parent_task_id NOT IN (SELECT task_id FROM tasks)
    UNION ALL
    SELECT tasks.task_id, chain.root_task_id FROM tasks
    JOIN chain ON tasks.parent_task_id = chain.task_id
)
UPDATE tasks SET root_task_id = (SELECT root_task_id FROM chain
                                 WHERE chain.task_id = tasks.task_id);
UPDATE tasks SET root_task_id = task_id WHERE root_task_id IS NULL;
-- Cancelling a root, fan-in and the audit read a chain's tasks.
CREATE INDEX tasks_by_root ON tasks (root_task_id);

-- One row per chain: its budgets and what it spent. `tasks` counts the tasks admitted to run
-- (the root included); work refused by a budget is stored terminal and not counted.
CREATE TABLE chains (
    root_task_id  TEXT PRIMARY KEY,
    principal     TEXT NOT NULL,
    max_hops      INTEGER NOT NULL CHECK (max_hops >= 1),
    max_tasks     INTEGER NOT NULL CHECK (max_tasks >= 1),
    max_cost      INTEGER CHECK (max_cost >= 0),
    tasks         INTEGER NOT NULL CHECK (tasks >= 0),
    cost          INTEGER NOT NULL DEFAULT 0 CHECK (cost >= 0),
    -- Set when its root is cancelled: every live task was cancelled with it, and new work
    -- of the chain is stored cancelled.
    cancelled_at  REAL,
    cancel_reason TEXT,
    created_at    REAL NOT NULL
);
-- Chains of the tasks already stored: the store's default budgets (4 hops, 1000 tasks, no
-- cost budget), none of them refusing what is already there.
INSERT INTO chains (root_task_id, principal, max_hops, max_tasks, max_cost, tasks, created_at)
SELECT roots.task_id, roots.principal, 4,
       max(1000, (SELECT count(*) FROM tasks member WHERE member.root_task_id = roots.task_id)),
       NULL,
       (SELECT count(*) FROM tasks member WHERE member.root_task_id = roots.task_id),
       roots.created_at
FROM tasks roots WHERE roots.root_task_id = roots.task_id;

-- Human approvals (SPEC §6): a record granted by an authenticated human principal, naming the
-- action, the resource (or recipient) and the data it allows (the SHA-256 of its canonical
-- JSON), how many uses, until when, and who asked. A side effect consumes one use in the
-- transaction that commits it; words in a payload or a signal never count.
CREATE TABLE approvals (
    approval_id    TEXT PRIMARY KEY,
    action         TEXT NOT NULL,
    resource       TEXT NOT NULL,
    data           TEXT NOT NULL,
    data_digest    TEXT NOT NULL,
    max_uses       INTEGER NOT NULL CHECK (max_uses >= 1),
    uses           INTEGER NOT NULL DEFAULT 0 CHECK (uses >= 0),
    expires_at     REAL NOT NULL,
    granted_by     TEXT NOT NULL,
    requested_by   TEXT NOT NULL,
    granted_at     REAL NOT NULL,
    fingerprint    TEXT NOT NULL,
    revoked_at     REAL,
    revoked_by     TEXT,
    revoke_reason  TEXT
);
-- A side effect looks for a usable approval of its action, resource and data.
CREATE INDEX approvals_matching ON approvals (action, resource, data_digest);

-- Granting, each use and revoking, as durable events (the audit holds them to the records).
CREATE TABLE approval_events (
    approval_id  TEXT NOT NULL,
    kind         TEXT NOT NULL CHECK (kind IN ('granted', 'used', 'revoked')),
    number       INTEGER NOT NULL CHECK (number >= 0),
    principal    TEXT NOT NULL,
    task_id      TEXT,
    at           REAL NOT NULL,
    PRIMARY KEY (approval_id, kind, number)
);

-- The side effects a task declared and committed with its finish, each with the approval it
-- consumed: the committed record the external effect is performed from, after the commit.
CREATE TABLE side_effects (
    task_id      TEXT NOT NULL,
    number       INTEGER NOT NULL CHECK (number >= 1),
    action       TEXT NOT NULL,
    resource     TEXT NOT NULL,
    data         TEXT NOT NULL,
    data_digest  TEXT NOT NULL,
    approval_id  TEXT NOT NULL,
    use_number   INTEGER NOT NULL,
    created_at   REAL NOT NULL,
    PRIMARY KEY (task_id, number),
    UNIQUE (approval_id, use_number)
);

-- A task's request for a human's approval, asked as the wait it opened (addressed to the
-- responder): the human's answer grants (approval_id) or denies it and signals the wait, in
-- one transaction.
CREATE TABLE approval_requests (
    flow          TEXT NOT NULL,
    step          TEXT NOT NULL,
    generation    INTEGER NOT NULL,
    approval_id   TEXT NOT NULL UNIQUE,
    action        TEXT NOT NULL,
    resource      TEXT NOT NULL,
    data          TEXT NOT NULL,
    data_digest   TEXT NOT NULL,
    max_uses      INTEGER NOT NULL CHECK (max_uses >= 1),
    expires_at    REAL NOT NULL,
    requested_by  TEXT NOT NULL,
    responder     TEXT NOT NULL,
    answer        TEXT CHECK (answer IN ('granted', 'denied')),
    answered_at   REAL,
    PRIMARY KEY (flow, step, generation)
);

-- Fan-in: a task that finished spawning children waits (flow, step, generation) for all of
-- them; when the last one ends, postroom answers the wait with their outcomes.
CREATE TABLE fan_ins (
    task_id     TEXT PRIMARY KEY,
    flow        TEXT NOT NULL,
    step        TEXT NOT NULL,
    generation  INTEGER NOT NULL
);
-- A fan-in counts its task's children.
CREATE INDEX tasks_by_parent ON tasks (parent_task_id) WHERE parent_task_id IS NOT NULL;
