-- postroom store, version 14 (PostgreSQL): the time high-water moves into postroom_counts,
-- as rows of kind 'clock' (one per shard), as in the SQLite schema, where a commit that
-- counts an outcome then writes one page for both (see its comments). Here the rows stay
-- apart as before: each connection advances its own shard's row.

ALTER TABLE postroom_counts DROP CONSTRAINT postroom_counts_kind_check;
ALTER TABLE postroom_counts ADD CONSTRAINT postroom_counts_kind_check
    CHECK (kind IN ('task', 'reply', 'clock'));
-- The greatest time a committed decision used (a clock row's only figure; NULL on a count).
ALTER TABLE postroom_counts ADD COLUMN high_water DOUBLE PRECISION;
ALTER TABLE postroom_counts ADD CONSTRAINT postroom_counts_high_water_check
    CHECK ((kind = 'clock') = (high_water IS NOT NULL));
INSERT INTO postroom_counts (kind, queue, state, shard, n, high_water)
SELECT 'clock', '', '', id, 0, high_water FROM postroom_clock;
DROP TABLE postroom_clock;
