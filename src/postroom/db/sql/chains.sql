-- Chains (SPEC §7): a root and everything spawned from it, with the budgets it runs within.
-- The spawning transaction locks its chain's row, so concurrent spawns into one chain are
-- counted one after another; other chains are never waited for. A root that ran alone within
-- the store's budgets needs no row: it is written when the chain first needs one (see
-- postroom.chains).

-- name: chain_insert
-- Open the chain a root starts, with its budgets and whether the root itself runs.
INSERT INTO chains (root_task_id, principal, max_hops, max_tasks, max_cost, tasks, cost,
                    created_at)
VALUES (:root_task_id, :principal, :max_hops, :max_tasks, :max_cost, :tasks, 0, :now)
ON CONFLICT (root_task_id) DO NOTHING

-- name: chain_get
-- One chain as stored.
SELECT * FROM chains WHERE root_task_id = :root_task_id

-- name: chain_get_locked
-- One chain, locked until the transaction ends: the transaction adding work to it decides on
-- what it has spent, and no other can spend it meanwhile.
SELECT * FROM chains WHERE root_task_id = :root_task_id {for_update}

-- name: chain_admit
-- Count a task admitted to run in its chain.
UPDATE chains SET tasks = tasks + 1 WHERE root_task_id = :root_task_id

-- name: chain_charge
-- Charge cost units to a chain (a handler's ctx.charge, with its finish).
UPDATE chains SET cost = cost + :units WHERE root_task_id = :root_task_id

-- name: task_parent
-- What a new task takes from the parent it names: its principal, hops and chain (its root;
-- NULL when it is one); kept from a concurrent prune until the transaction ends.
SELECT task_id, principal, hops, root_task_id FROM tasks WHERE task_id = :task_id {for_share}

-- name: task_chain_of
-- A task's root (NULL: the task is a root) and principal, for its chain's row.
SELECT task_id, root_task_id, principal, created_at FROM tasks WHERE task_id = :task_id

-- name: chain_cancel
-- Mark a chain cancelled (its root was): its new work is born cancelled.
UPDATE chains SET cancelled_at = :now, cancel_reason = :reason
WHERE root_task_id = :root_task_id AND cancelled_at IS NULL

-- name: chain_live_tasks
-- The live tasks of a chain, to cancel with its root: the root, then its members.
SELECT task_id, created_at, id FROM tasks
WHERE task_id = :root_task_id AND state IN ({live_task_states})
UNION ALL
SELECT task_id, created_at, id FROM tasks
WHERE root_task_id = :root_task_id AND state IN ({live_task_states})
ORDER BY created_at, id

-- name: fan_in_insert
-- A task waits for all of its children with this wait generation.
INSERT INTO fan_ins (task_id, flow, step, generation)
VALUES (:task_id, :flow, :step, :generation)

-- name: fan_in_get_locked
-- The fan-in of a task, if it has one, locked: children ending at once count one after the
-- other, so the last one to commit sees every other one ended.
SELECT * FROM fan_ins WHERE task_id = :task_id {for_update}

-- name: fan_in_children
-- A task's children and how each ended (NULL while live), oldest first.
SELECT task_id, message_id, state, result, last_error FROM tasks
WHERE parent_task_id = :task_id
ORDER BY created_at, id
