-- postroom store, version 15 (PostgreSQL): one index of the replies a dispatcher looks for,
-- ready and sending, keyed by (state, available_at), a sending reply being due again when its
-- lease runs out; as in the SQLite schema, where a claim then writes one page of it where it
-- wrote one of each index (see its comments). Here a claim costs the same either way: an
-- update that changes an indexed column adds one entry to each index whose predicate the new
-- row meets, the sending replies' index before, this one now. The schemas stay alike.

-- (Before the index of sending replies goes: it finds them.)
UPDATE replies SET available_at = lease_until WHERE state = 'sending';
DROP INDEX replies_ready;
DROP INDEX replies_sending_leases;
CREATE INDEX replies_live ON replies (state, available_at)
    WHERE state IN ('pending', 'sending') AND parked_at IS NULL;
