-- postroom store, version 16: tasks_by_created goes. A task's id is handed out by the one
-- writer in commit order, and its created_at is its transaction's time, never below the
-- high-water that the newest task keeps: ids follow creation (Dialect.ids_follow_creation).
-- The table walked by id is already the order a listing, a look at the newest task or a
-- prune by age needs, and a bound on created_at is found among the ids by halving, so the
-- index said nothing the table does not; every receive wrote a page of it.
--
-- (Tasks carried over from version 11 were numbered in (created_at, task_id) order by
-- version 12, and every task since takes the next id.)

DROP INDEX tasks_by_created;
