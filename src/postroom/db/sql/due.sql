-- Whether a claim would find anything to do: read in a transaction of its own before the claim
-- takes SQLite's write lock (see Database.write_if). Each subquery is the head of the partial
-- index its claim or sweep walks (written as they are, oldest first, so a planner takes the
-- same index), and the look costs the same whatever the backlog. A hint only: the claim
-- decides everything again under the lock.

-- name: tasks_due
-- A claimable task in :queue, or a lease or a deadline for the claim's sweep.
SELECT ((NOT EXISTS (SELECT 1 FROM paused_queues WHERE queue = :queue)
         AND (SELECT claim_at FROM tasks WHERE {claimable}
              ORDER BY claim_at LIMIT 1) IS NOT NULL)
        OR {lease_ran_out} IS NOT NULL
        OR {deadline_passed} IS NOT NULL) AS due

-- name: sweep_due
-- A task or delivery lease that ran out (:leases), or a live task past its deadline
-- (:deadlines): what a sweep would do.
SELECT ((:leases = 1 AND {lease_ran_out} IS NOT NULL)
        OR (:leases = 1 AND (SELECT available_at FROM replies
                             WHERE {live_reply} AND state = 'sending'
                               AND available_at <= :now
                             ORDER BY available_at LIMIT 1) IS NOT NULL)
        OR (:deadlines = 1 AND {deadline_passed} IS NOT NULL)) AS due

-- name: waits_due_any
-- A waiting wait whose deadline has come: what a sweep of due waits would time out.
SELECT 1 AS due FROM waits WHERE state = 'waiting' AND deadline <= :now
ORDER BY deadline, flow, step, generation LIMIT 1

-- name: replies_due
-- A reply due for delivery, or a delivery whose publisher's lease expired.
SELECT ((SELECT available_at FROM replies
         WHERE {live_reply} AND state = 'pending' AND available_at <= :now
         ORDER BY available_at LIMIT 1) IS NOT NULL
        OR (SELECT available_at FROM replies
            WHERE {live_reply} AND state = 'sending' AND available_at <= :now
            ORDER BY available_at LIMIT 1) IS NOT NULL) AS due
