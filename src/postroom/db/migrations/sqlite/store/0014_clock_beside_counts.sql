-- postroom store, version 14: the time high-water moves into postroom_counts, as rows of
-- kind 'clock' (one per shard; SQLite has one). A commit that counts an outcome (a finish,
-- a delivery) also records its time, and every commit of a task but its receive records
-- one: in one small table, both land on the same page, so such a commit writes one WAL
-- frame for the two where it wrote two.

CREATE TABLE postroom_counts_v14 (
    kind        TEXT NOT NULL CHECK (kind IN ('task', 'reply', 'clock')),
    queue       TEXT NOT NULL,
    state       TEXT NOT NULL,
    shard       INTEGER NOT NULL,
    n           INTEGER NOT NULL CHECK (n >= 0),
    -- The greatest time a committed decision used (a clock row's only figure; NULL on a
    -- count).
    high_water  REAL CHECK ((kind = 'clock') = (high_water IS NOT NULL)),
    PRIMARY KEY (kind, queue, state, shard)
) WITHOUT ROWID;
INSERT INTO postroom_counts_v14 (kind, queue, state, shard, n)
SELECT kind, queue, state, shard, n FROM postroom_counts;
INSERT INTO postroom_counts_v14 (kind, queue, state, shard, n, high_water)
SELECT 'clock', '', '', id, 0, high_water FROM postroom_clock;

DROP TABLE postroom_counts;
DROP TABLE postroom_clock;
ALTER TABLE postroom_counts_v14 RENAME TO postroom_counts;
