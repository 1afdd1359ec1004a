-- The dashboard (pgsched web) and the operator commands read history by time: runs that
-- ended in the last hour, the runs of a timeline window. Without an index on the end time
-- each of those reads every history row (seconds at 10 million rows, and for a role under
-- row-level security the policy's check runs per row). One btree on finished_at: NULL for
-- runs in progress (found through `finished_at IS NULL`), so a window is one index range
-- plus the few running rows. Cost on the run path: one more index entry per run (the
-- close's UPDATE already changes outcome, which a partial index's predicate reads, so it
-- was not a HOT update before this index either).
CREATE INDEX job_run_finished_idx ON pgsched.job_run (finished_at);
