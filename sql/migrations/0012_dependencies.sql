-- Dependencies (issue 14): a job may run after other jobs (README "Dependencies").
-- job.depends_on is the setting: the ids of the job's upstream jobs, sorted, NULL for none.
-- A job whose schedule is '@after' has no schedule of its own: it runs after its upstreams.
ALTER TABLE pgsched.job ADD COLUMN depends_on integer[]
    CHECK (depends_on IS NULL OR (cardinality(depends_on) BETWEEN 1 AND 100 AND array_position(depends_on, NULL) IS NULL));

-- Who depends on a job: read when it is deleted, and when it is inserted (a restore may insert a
-- dependent before its upstream).
CREATE INDEX job_depends_on_idx ON pgsched.job USING gin (depends_on);

-- One row per (dependent, upstream): what the dependency rule reads and writes, kept equal to
-- job.depends_on by the job's trigger (sql/api/00_internal.sql). succeeded_plan: the plan time of
-- the upstream's latest successful run that the dependent has not yet consumed (NULL: none since
-- the dependent's last run). Deleting the upstream deletes the row; its trigger first disables
-- the dependent, with the reason.
CREATE TABLE pgsched.job_dependency (
    job_id          integer     NOT NULL REFERENCES pgsched.job ON DELETE CASCADE,
    upstream_id     integer     NOT NULL REFERENCES pgsched.job ON DELETE CASCADE,
    succeeded_plan  timestamptz,
    succeeded_at    timestamptz,
    PRIMARY KEY (job_id, upstream_id),
    CHECK (job_id <> upstream_id)
);
-- The close's question: which jobs depend on the one whose run succeeded.
CREATE INDEX job_dependency_upstream_idx ON pgsched.job_dependency (upstream_id);

-- Read by whoever may read the dependent job (its edges say nothing the jobs view does not).
ALTER TABLE pgsched.job_dependency ENABLE ROW LEVEL SECURITY;
CREATE POLICY job_dependency_read ON pgsched.job_dependency FOR SELECT
    USING (EXISTS (SELECT 1 FROM pgsched.job j WHERE j.job_id = job_dependency.job_id));
GRANT SELECT ON pgsched.job_dependency TO PUBLIC;

-- Whether a queued run is the oldest of its (job, scope): the claim asks for every queued run it
-- looks at (sql/api/40_scheduler.sql, _claimable_scope_runs). Queued runs are few.
CREATE INDEX job_run_queued_job_idx ON pgsched.job_run (job_id, scope, plan_time) WHERE outcome = 'queued';

-- The jobs with a concurrency key, for the claim's first question (whether a keyed run is queued),
-- which walked every queued run otherwise.
CREATE INDEX job_stat_keyed_idx ON pgsched.job_stat (job_id) WHERE concurrency_key IS NOT NULL;

-- A dependent's run started by its upstreams' success: trigger 'upstream'.
ALTER TABLE pgsched.job_run DROP CONSTRAINT job_run_trigger_check;
ALTER TABLE pgsched.job_run ADD CONSTRAINT job_run_trigger_check
    CHECK (trigger IN ('schedule', 'retry', 'manual', 'catch_up', 'upstream'));
