-- postroom store, version 9: principals of the HTTP service, their roles and their tokens.
-- Only a token's SHA-256 is kept, under its public id (see postroom.principals).

CREATE TABLE principals (
    name        TEXT PRIMARY KEY,
    role        TEXT NOT NULL CHECK (role IN ('agent', 'worker', 'human', 'operator')),
    queues      TEXT NOT NULL,  -- a worker's granted queues, a JSON list
    created_at  REAL NOT NULL,
    revoked_at  REAL
);

CREATE TABLE principal_tokens (
    token_id    TEXT PRIMARY KEY,
    principal   TEXT NOT NULL REFERENCES principals (name),
    digest      TEXT NOT NULL,
    created_at  REAL NOT NULL,
    expires_at  REAL  -- NULL: until rotated out or revoked
);
CREATE INDEX principal_tokens_by_principal ON principal_tokens (principal);

-- The open waits addressed to one responder (a human's list of questions).
CREATE INDEX waits_by_responder ON waits (responder, deadline) WHERE state = 'waiting';
