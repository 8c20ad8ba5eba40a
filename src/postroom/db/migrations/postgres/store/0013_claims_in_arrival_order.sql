-- postroom store, version 13: tasks with the same claim_at are claimed in order of arrival
-- (SPEC: priority, then availability, then arrival). The claim's index held (queue, claim_at)
-- only, and equal entries of a PostgreSQL b-tree follow the rows' places in the heap, which
-- a row written into the free space of an earlier page puts before older ones. The index
-- now ends with id, so the claims' ORDER BY claim_at, id is still one walk of it.
CREATE INDEX tasks_claimable_v13 ON tasks (queue, claim_at, id) WHERE state = 'pending';
DROP INDEX tasks_claimable;
ALTER INDEX tasks_claimable_v13 RENAME TO tasks_claimable;
