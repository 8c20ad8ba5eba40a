-- Endpoints: where each principal's replies are delivered, with their signing secrets; and
-- the replies parked while their requester has no enabled endpoint.

-- name: endpoint_insert
-- Register a principal's endpoint (one per principal: a second is a unique violation).
INSERT INTO endpoints (principal, url, allow_private, schedule, delays, budget, concurrency,
                       created_at, updated_at)
VALUES (:principal, :url, :allow_private, :schedule, :delays, :budget, :concurrency, :now,
        :now)
ON CONFLICT (principal) DO NOTHING
RETURNING principal

-- name: endpoint_get
-- One endpoint by its principal.
SELECT * FROM endpoints WHERE principal = :principal

-- name: endpoints_all
-- Every endpoint, by principal.
SELECT * FROM endpoints ORDER BY principal

-- name: endpoint_delete
-- Forget a principal's endpoint (its secrets go with it).
DELETE FROM endpoints WHERE principal = :principal

-- name: endpoint_secrets_of
-- An endpoint's secrets, newest first.
SELECT * FROM endpoint_secrets WHERE principal = :principal ORDER BY secret_id DESC

-- name: endpoint_secret_insert
-- Add a signing secret, numbered after the endpoint's newest.
INSERT INTO endpoint_secrets (principal, secret_id, secret, created_at, expires_at)
VALUES (:principal,
        (SELECT coalesce(max(secret_id), 0) + 1 FROM endpoint_secrets
         WHERE principal = :principal),
        :secret, :now, NULL)

-- name: endpoint_secrets_expire
-- A rotation ends the older secrets at :expires_at (those without an earlier expiry).
UPDATE endpoint_secrets SET expires_at = :expires_at
WHERE principal = :principal AND secret_id < :keep
  AND (expires_at IS NULL OR expires_at > :expires_at)

-- name: endpoint_secrets_forget
-- Drop secrets that have expired: nothing signs with them any more.
DELETE FROM endpoint_secrets WHERE principal = :principal AND expires_at <= :now

-- name: endpoint_disable
-- Stop delivering to an endpoint, saying when and why; one already disabled keeps its reason.
UPDATE endpoints SET disabled_at = :now, disabled_reason = :reason, updated_at = :now
WHERE principal = :principal AND disabled_at IS NULL
RETURNING principal

-- name: endpoint_enable
-- Deliver to a disabled endpoint again.
UPDATE endpoints SET disabled_at = NULL, disabled_reason = NULL, updated_at = :now
WHERE principal = :principal AND disabled_at IS NOT NULL
RETURNING principal

-- name: endpoint_touch
-- Note that an endpoint changed (a secret added, say).
UPDATE endpoints SET updated_at = :now WHERE principal = :principal

-- name: replies_park
-- Of the head of the claimable replies (the rows claim_replies would pick), park those whose
-- requester has no enabled endpoint: they leave the head without spending an attempt.
WITH picked AS ({reply_head})
UPDATE replies SET parked_at = :now, updated_at = :now
FROM picked
WHERE replies.id = picked.id AND replies.state = 'pending'
  AND replies.parked_at IS NULL
  AND NOT EXISTS (SELECT 1 FROM endpoints
                  WHERE endpoints.principal = replies.requester
                    AND endpoints.disabled_at IS NULL)
RETURNING replies.reply_id, replies.requester

-- name: replies_unpark
-- A principal's endpoint was added or enabled: its parked replies are due now.
UPDATE replies SET parked_at = NULL, available_at = :now, updated_at = :now
WHERE requester = :principal AND parked_at IS NOT NULL AND state = 'pending'

-- name: replies_parked_counts
-- How many replies wait for an endpoint, by requester.
SELECT requester, count(*) AS n FROM replies WHERE parked_at IS NOT NULL GROUP BY requester
