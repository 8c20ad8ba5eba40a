-- postroom store, version 15: one index for the replies a dispatcher looks for, where there
-- were two. A claim moves a reply from pending to sending; with the ready replies and the
-- sending ones in two indexes, it wrote a page of each. Now a sending reply is due again when
-- its lease runs out (``available_at`` = ``lease_until``, which the claim sets together), and
-- replies_live holds both, keyed by (state, available_at): a claim moves the entry within one
-- index, on one page while the outbox is short, and a sweep of lapsed leases still reads
-- only sending replies, in the order their leases run out.
--
-- (SQLite uses a partial index only for a query whose WHERE names each of its terms, so the
-- queries say ``state IN ('pending', 'sending') AND parked_at IS NULL`` too: {live_reply}.)

-- (Before the index of sending replies goes: it finds them.)
UPDATE replies SET available_at = lease_until WHERE state = 'sending';
DROP INDEX replies_ready;
DROP INDEX replies_sending_leases;
CREATE INDEX replies_live ON replies (state, available_at)
    WHERE state IN ('pending', 'sending') AND parked_at IS NULL;
