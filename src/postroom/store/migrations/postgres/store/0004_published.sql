-- postroom store, version 4 (PostgreSQL): what the store publishes to everyone who uses it, as
-- in the SQLite schema. The retention period is the store's, not one process's: the first
-- Store.open publishes it, every process prunes by it, `postroom init --retention` changes it.
CREATE TABLE postroom_published (
    name   TEXT PRIMARY KEY CHECK (name IN ('retention')),
    value  DOUBLE PRECISION NOT NULL CHECK (value >= 0)
);
