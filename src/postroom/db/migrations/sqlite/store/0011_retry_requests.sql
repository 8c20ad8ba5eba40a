-- postroom store, version 11: an operator's re-run may carry the id of its request, so that
-- the same request sent again (its answer was lost: OutcomeUnknown, a dropped connection, a
-- form sent twice) is answered with the decision it made, not with a second new task.
ALTER TABLE task_retries ADD COLUMN request_id TEXT;
CREATE UNIQUE INDEX task_retries_request ON task_retries (task_id, request_id)
    WHERE request_id IS NOT NULL;
