-- Human approvals of side effects (SPEC §6). A use is one guarded UPDATE of the approval's
-- row: it matches only while the approval is unrevoked, unexpired and has uses left, and the
-- row lock orders uses and a revocation racing them.

-- name: approval_insert
-- Record a human's grant unless its id is already stored.
INSERT INTO approvals (approval_id, action, resource, data, data_digest, max_uses, uses,
                       expires_at, granted_by, requested_by, granted_at, fingerprint)
VALUES (:approval_id, :action, :resource, :data, :data_digest, :max_uses, 0, :expires_at,
        :granted_by, :requested_by, :now, :fingerprint)
ON CONFLICT (approval_id) DO NOTHING
RETURNING approval_id

-- name: approval_get
-- One approval as stored.
SELECT * FROM approvals WHERE approval_id = :approval_id

-- name: approval_usable
-- The usable approval of an action, resource and data that expires first, if any.
SELECT approval_id FROM approvals
WHERE action = :action AND resource = :resource AND data_digest = :data_digest
  AND revoked_at IS NULL AND uses < max_uses AND expires_at > :now
ORDER BY expires_at, approval_id
LIMIT 1

-- name: approval_use
-- Consume one use of an approval, only if it allows exactly this action, resource and data
-- and is unrevoked, unexpired and not used up; returns the use's number.
UPDATE approvals SET uses = uses + 1
WHERE approval_id = :approval_id AND action = :action AND resource = :resource
  AND data_digest = :data_digest AND revoked_at IS NULL AND uses < max_uses
  AND expires_at > :now
RETURNING uses

-- name: approval_revoke
-- Revoke an approval that is not revoked yet; its unused uses are gone.
UPDATE approvals SET revoked_at = :now, revoked_by = :principal, revoke_reason = :reason
WHERE approval_id = :approval_id AND revoked_at IS NULL
RETURNING approval_id

-- name: approval_event_insert
-- A durable event of an approval: granted (number 0), its n-th use, revoked (number 0).
INSERT INTO approval_events (approval_id, kind, number, principal, task_id, at)
VALUES (:approval_id, :kind, :number, :principal, :task_id, :now)

-- name: side_effect_insert
-- A side effect committed with its task's finish, and the approval use it consumed.
INSERT INTO side_effects (task_id, number, action, resource, data, data_digest, approval_id,
                          use_number, created_at)
VALUES (:task_id, :number, :action, :resource, :data, :data_digest, :approval_id,
        :use_number, :now)

-- name: side_effects_of
-- The side effects a task committed, in order, with who granted the approval each used (an
-- outer join: an effect whose approval is missing still shows, for the audit to report).
-- Those of an earlier task of the same identity, pruned since, are not this task's.
SELECT side_effects.*, approvals.granted_by, approvals.granted_at FROM side_effects
LEFT JOIN approvals ON approvals.approval_id = side_effects.approval_id
WHERE side_effects.task_id = :task_id
  AND side_effects.created_at >= (SELECT created_at FROM tasks WHERE task_id = :task_id)
ORDER BY side_effects.number

-- name: side_effects_numbered
-- How many side effects were ever recorded under a task id: an identity pruned and received
-- again numbers its effects after those of the task it had before (kept for the audit).
SELECT coalesce(max(number), 0) AS n FROM side_effects WHERE task_id = :task_id

-- name: side_effects_by_approval
-- The side effects that used an approval, in order of use (as ``side_effects_of``).
SELECT side_effects.*, approvals.granted_by, approvals.granted_at FROM side_effects
LEFT JOIN approvals ON approvals.approval_id = side_effects.approval_id
WHERE side_effects.approval_id = :approval_id ORDER BY side_effects.use_number

-- name: approval_request_insert
-- A task's request for an approval, with the wait generation it opened.
INSERT INTO approval_requests (flow, step, generation, approval_id, action, resource, data,
                               data_digest, max_uses, expires_at, requested_by, responder)
VALUES (:flow, :step, :generation, :approval_id, :action, :resource, :data, :data_digest,
        :max_uses, :expires_at, :requested_by, :responder)
ON CONFLICT (flow, step, generation) DO NOTHING

-- name: approval_request_get
-- The approval request a wait generation asks.
SELECT * FROM approval_requests WHERE flow = :flow AND step = :step AND generation = :generation

-- name: approval_request_answer
-- Record the human's answer to a request not answered yet.
UPDATE approval_requests SET answer = :answer, answered_at = :now
WHERE flow = :flow AND step = :step AND generation = :generation AND answer IS NULL

-- name: approvals_listed
-- The newest approvals first, at most :limit.
SELECT * FROM approvals ORDER BY granted_at DESC, approval_id LIMIT :limit

-- name: approvals_listed_by
-- The newest approvals :granted_by granted first, at most :limit.
SELECT * FROM approvals WHERE granted_by = :granted_by
ORDER BY granted_at DESC, approval_id LIMIT :limit

-- name: approval_requests_open
-- The unanswered approval requests whose wait still waits, earliest deadline first.
SELECT approval_requests.* FROM approval_requests
JOIN waits ON waits.flow = approval_requests.flow AND waits.step = approval_requests.step
          AND waits.generation = approval_requests.generation
WHERE approval_requests.answer IS NULL AND waits.state = 'waiting'
ORDER BY waits.deadline, approval_requests.flow, approval_requests.step LIMIT :limit

-- name: approval_requests_open_for
-- The unanswered approval requests addressed to :responder whose wait still waits: walks
-- waits_by_responder (a request's wait is addressed to the request's responder).
SELECT approval_requests.* FROM waits
JOIN approval_requests ON approval_requests.flow = waits.flow
     AND approval_requests.step = waits.step AND approval_requests.generation = waits.generation
WHERE waits.responder = :responder AND waits.state = 'waiting'
  AND approval_requests.answer IS NULL
ORDER BY waits.deadline, waits.flow, waits.step LIMIT :limit
