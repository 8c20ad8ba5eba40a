-- postroom store, version 3: fence floors. Pruning forgets a task and its reply, and an
-- identity sent again afterwards is a new task with the same task_id and reply_id. A worker
-- or publisher may still hold a claim on the forgotten one, so the new one's fences must not
-- repeat any of its fences: a new task (reply) starts at the greatest fence pruned so far,
-- and its first claim takes the next. A fresh store's floors are 0 (first claim: fence 1).
CREATE TABLE postroom_fence_floors (
    kind   TEXT PRIMARY KEY CHECK (kind IN ('task', 'reply')),
    floor  INTEGER NOT NULL CHECK (floor >= 0)
);
INSERT INTO postroom_fence_floors (kind, floor) VALUES ('task', 0), ('reply', 0);
