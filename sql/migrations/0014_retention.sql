-- History that stays bounded (issue 12, README "History and retention"): a run's row in
-- pgsched.job_run is kept for its retention, counted from the run's end: the database's, set by
-- pgsched.set_retention (this table), or its job's own (the two columns below). A successful,
-- skipped or missed run is kept success_retention; a failure, timeout, crash or cancelled run
-- failure_retention. pgsched.purge_history removes what is past it; the schedulers call it a few
-- times an hour, one instance at a time (purged_at). Runs still running or queued are never
-- removed.

-- At most one row: the database's policy, a NULL retention (or no row) meaning the default
-- (pgsched._history_policy). Written by pgsched.set_retention (the catalog's administrators only)
-- and by the schedulers' turns, read by all (pgsched.settings). No row is inserted here: a
-- restore of a dump (`CREATE EXTENSION` first, then the dumped rows) brings its own.
CREATE TABLE pgsched.history_policy (
    one                 boolean     PRIMARY KEY DEFAULT true CHECK (one),
    success_retention   interval    CHECK (success_retention > interval '0'),
    failure_retention   interval    CHECK (failure_retention > interval '0'),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    -- When a scheduler last took its turn to purge (pgsched._purge_turn): the others skip theirs.
    purged_at           timestamptz
);
GRANT SELECT ON pgsched.history_policy TO PUBLIC;

-- A job's own: which of its runs keep a row once they end (all; failures only; none: only the
-- counters in job_stat), and retentions that replace the database's for its runs (NULL: the
-- database's). The CHECKs repeat _check_settings' rules for direct writes of the table.
ALTER TABLE pgsched.job
    ADD COLUMN history text NOT NULL DEFAULT 'all' CHECK (history IN ('all', 'failures', 'none')),
    ADD COLUMN success_retention interval CHECK (success_retention > interval '0'),
    ADD COLUMN failure_retention interval CHECK (failure_retention > interval '0');

-- A run's instance_id stays as a plain number: the purge removes an instance's row once it has
-- no run in progress, while rows of its runs kept longer (a job's own retention) still name it.
-- Without the key, that removal updates no run, and a claim checks no key per run it inserts.
ALTER TABLE pgsched.job_run DROP CONSTRAINT job_run_instance_id_fkey;
