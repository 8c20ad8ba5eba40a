-- name: principal_insert
-- Add a principal unless its name is taken (by a live or a revoked one).
INSERT INTO principals (name, role, queues, created_at)
VALUES (:principal, :role, :queues, :now)
ON CONFLICT (name) DO NOTHING

-- name: principal_get
-- One principal by name.
SELECT * FROM principals WHERE name = :principal

-- name: principals_all
-- Every principal, by name.
SELECT * FROM principals ORDER BY name

-- name: principal_revoke
-- Revoke a principal (a second revoke keeps the first time).
UPDATE principals SET revoked_at = :now WHERE name = :principal AND revoked_at IS NULL

-- name: principal_token_insert
-- A new token of a principal: only its digest is kept.
INSERT INTO principal_tokens (token_id, principal, digest, created_at)
VALUES (:token_id, :principal, :digest, :now)

-- name: principal_token_get
-- A token by its public id, with its principal: one read by primary key.
SELECT principal_tokens.digest, principal_tokens.expires_at, principals.*
FROM principal_tokens JOIN principals ON principals.name = principal_tokens.principal
WHERE principal_tokens.token_id = :token_id

-- name: principal_tokens_expire
-- A rotation: the principal's tokens end at :until at the latest.
UPDATE principal_tokens SET expires_at = :until
WHERE principal = :principal AND (expires_at IS NULL OR expires_at > :until)

-- name: principal_tokens_delete
-- A revocation: the principal's tokens are forgotten.
DELETE FROM principal_tokens WHERE principal = :principal

-- name: waits_page_for
-- A page of waiting generations addressed to :responder, due before :due_before, earliest
-- deadline first, after the key (:after_deadline, :after_flow, :after_step,
-- :after_generation): walks waits_by_responder.
SELECT * FROM waits
WHERE state = 'waiting' AND responder = :responder AND deadline < :due_before
  AND (deadline, flow, step, generation)
      > (:after_deadline, :after_flow, :after_step, :after_generation)
ORDER BY deadline, flow, step, generation
LIMIT :limit
