-- postroom store, version 4 (PostgreSQL): what the store publishes to everyone who uses it, as
-- in the SQLite schema. The retention period is the store's, not one process's: the first
-- Store.open publishes it, every process prunes by it, `postroom init --retention` changes it.
-- A shorter period does not break the promise made to what was received under a longer one:
-- until floor_until, pruning keeps at least floor_value (both NULL when no such promise runs).
CREATE TABLE postroom_published (
    name         TEXT PRIMARY KEY CHECK (name IN ('retention')),
    value        DOUBLE PRECISION NOT NULL CHECK (value >= 0),
    floor_value  DOUBLE PRECISION CHECK (floor_value >= 0),
    floor_until  DOUBLE PRECISION,
    CHECK ((floor_value IS NULL) = (floor_until IS NULL))
);
