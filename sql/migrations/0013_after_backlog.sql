-- An '@after' dependent's runs are no longer queued in pgsched.job_run (issue 14, measured in
-- bench/scheduler.py throughput --dependencies): its upstreams' success makes the dependent due,
-- as a schedule does, by setting its next_start to the plan; the claim then starts it like any
-- due job, with one insert and no queued row to walk past and update. A plan that arrives while
-- the dependent already has one pending or running waits here, in arrival order, until its
-- run's close takes the next (07_dependencies.sql, 20_runs.sql). NULL: none waits.
ALTER TABLE pgsched.job_stat ADD COLUMN upstream_backlog timestamptz[];

-- Runs queued by an earlier release become that (the delay added as pgsched._delayed does, which
-- a fresh install has not defined yet): per @after job, the oldest queued plan is due
-- (unless a plan is pending already), the others wait behind it.
WITH q AS (
    SELECT r.job_id, array_agg(r.plan_time ORDER BY r.plan_time) AS plans
      FROM pgsched.job_run r JOIN pgsched.job j ON j.job_id = r.job_id
     WHERE j.schedule = '@after' AND r.scope = '' AND r.outcome = 'queued'
     GROUP BY r.job_id
), moved AS (
    UPDATE pgsched.job_stat s
       SET next_start = coalesce(s.next_start, q.plans[1] + make_interval(secs => extract(epoch FROM j.schedule_delay))),
           upstream_backlog = nullif(CASE WHEN s.next_start IS NULL THEN q.plans[2:] ELSE q.plans END, '{}')
      FROM q JOIN pgsched.job j ON j.job_id = q.job_id
     WHERE s.job_id = q.job_id
    RETURNING s.job_id
)
DELETE FROM pgsched.job_run r
 WHERE r.job_id IN (SELECT m.job_id FROM moved m) AND r.scope = '' AND r.outcome = 'queued';

-- Written by the API as the invoker, like next_start (0002_security.sql): alter_job and
-- pg_cron's schedule() drop a job's waiting plans when it stops being '@after'. Row-level
-- security keeps it to the caller's own jobs, whose next_start they may set already.
GRANT UPDATE (upstream_backlog) ON pgsched.job_stat TO PUBLIC;
