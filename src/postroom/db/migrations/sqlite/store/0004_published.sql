-- postroom store, version 4: what the store publishes to everyone who uses it. Senders rely on
-- the retention period (SPEC §2: an identity sent again within it is a duplicate), so it is
-- the store's, not one process's: the first Store.open publishes its Settings' retention (or
-- the default), every process prunes by the published value, and `postroom init URL
-- --retention SECONDS` changes it.
-- A shorter period does not break the promise made to what was received under a longer one:
-- until floor_until, pruning keeps at least floor_value (both NULL when no such promise runs).
CREATE TABLE postroom_published (
    name         TEXT PRIMARY KEY CHECK (name IN ('retention')),
    value        REAL NOT NULL CHECK (value >= 0),
    floor_value  REAL CHECK (floor_value >= 0),
    floor_until  REAL,
    CHECK ((floor_value IS NULL) = (floor_until IS NULL))
);
