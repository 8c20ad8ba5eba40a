-- postroom store, version 3 (PostgreSQL): fence floors, as in the SQLite schema. Pruning
-- forgets a task and its reply, and an identity sent again afterwards is a new task with the
-- same task_id and reply_id; its fences start above every fence pruned so far, so that no
-- claim on the forgotten one can match it.
CREATE TABLE postroom_fence_floors (
    kind   TEXT PRIMARY KEY CHECK (kind IN ('task', 'reply')),
    floor  BIGINT NOT NULL CHECK (floor >= 0)
);
INSERT INTO postroom_fence_floors (kind, floor) VALUES ('task', 0), ('reply', 0);
