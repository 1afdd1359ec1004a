-- What users read: jobs (definitions), job_stats (one row per job), job_history
-- (one row per run). Columns may only be appended (CREATE OR REPLACE VIEW).
-- security_invoker: the tables' row-level security applies to whoever reads the
-- view, not to the view's owner (who, owning the tables, would see every row);
-- so a role sees the rows, error messages included, of the jobs it may see.

SELECT pgsched._replace_if_changed('pgsched.jobs', NULL, $ddl$
CREATE OR REPLACE VIEW pgsched.jobs WITH (security_invoker = true) AS
SELECT j.job_id, j.job_name, j.owner, j.kind,
       j.proc_schema, j.proc_name, j.command, j.code_module, j.code_function,
       j.schedule, j.schedule_interval, j.fixed_schedule, j.initial_start, j.timezone,
       j.config, j.check_schema, j.check_name, j.scheduled,
       j.max_runtime, j.max_retries, j.retry_period, j.catch_up,
       s.next_start, j.created_at, j.updated_at,
       j.catch_up_window, j.max_plans_per_tick, j.schedule_delay, j.allow_stale_reentry,
       j.scope_query, j.database, j.priority, j.exclude, j.jitter, j.concurrency_key, j.depends_on,
       j.history, j.success_retention, j.failure_retention
  FROM pgsched.job j
  JOIN pgsched.job_stat s USING (job_id)
$ddl$);

SELECT pgsched._replace_if_changed('pgsched.job_stats', NULL, $ddl$
CREATE OR REPLACE VIEW pgsched.job_stats WITH (security_invoker = true) AS
SELECT s.job_id, j.job_name, j.owner, s.state, s.next_start,
       s.last_start, s.last_finish, s.last_successful_finish, s.last_run_success,
       CASE WHEN s.last_run_success THEN 'Success' WHEN NOT s.last_run_success THEN 'Failed' END
           AS last_run_status,
       s.last_run_duration,
       s.total_runs, s.total_successes, s.total_failures, s.total_crashes, s.total_skipped,
       s.consecutive_failures, s.consecutive_crashes,
       s.current_run_id, s.disabled_reason,
       -- appended, not beside total_skipped: a view's existing columns cannot move on upgrade
       s.total_missed,
       -- when the next run may start: next_start with the jitter of its plan (migration 0010)
       pg_catalog.timezone('UTC', pgsched._due_at(s.job_id, s.next_start, s.jitter_us)) AS next_due,
       -- why a due plan does not start: its concurrency key is at its limit (migration 0011), or its
       -- upstream jobs have not all succeeded since its last run (0012)
       coalesce(CASE WHEN s.state = 'scheduled' AND s.concurrency_key IS NOT NULL
                          AND pgsched._due_at(s.job_id, s.next_start, s.jitter_us)
                              <= pg_catalog.timezone('UTC', now())
                     THEN pgsched._key_wait(s.concurrency_key) END,
                CASE WHEN j.depends_on IS NOT NULL AND s.state <> 'disabled'
                     THEN pgsched._upstream_wait(s.job_id) END) AS waiting_for
  FROM pgsched.job_stat s
  JOIN pgsched.job j USING (job_id)
$ddl$);

-- Every concurrency key in use or with a limit (README "Concurrency limits"): its limit, the runs
-- holding it now (over every owner: _key_running), and the jobs you may see that have it and of
-- those, the ones waiting for it.
SELECT pgsched._replace_if_changed('pgsched.concurrency_limits', NULL, $ddl$
CREATE OR REPLACE VIEW pgsched.concurrency_limits WITH (security_invoker = true) AS
SELECT k.concurrency_key, pgsched._key_limit(k.concurrency_key) AS max_running,
       l.concurrency_key IS NULL AS is_default,
       pgsched._key_running(k.concurrency_key) AS running,
       (SELECT count(*) FROM pgsched.job j WHERE j.concurrency_key = k.concurrency_key)::integer AS jobs,
       (SELECT count(*) FROM pgsched.job_stats s JOIN pgsched.job j ON j.job_id = s.job_id
         WHERE j.concurrency_key = k.concurrency_key AND s.waiting_for IS NOT NULL)::integer AS waiting
  FROM (SELECT l.concurrency_key FROM pgsched.concurrency_limit l
        UNION SELECT j.concurrency_key FROM pgsched.job j WHERE j.concurrency_key IS NOT NULL) k
  LEFT JOIN pgsched.concurrency_limit l ON l.concurrency_key = k.concurrency_key
$ddl$);

SELECT pgsched._replace_if_changed('pgsched.job_history', NULL, $ddl$
CREATE OR REPLACE VIEW pgsched.job_history WITH (security_invoker = true) AS
SELECT r.run_id, r.job_id, j.job_name, r.scope, r.plan_time, r.attempt, r.trigger,
       r.started_at, r.finished_at, r.finished_at - r.started_at AS duration,
       r.outcome, r.outcome = 'success' AS succeeded,
       r.sqlstate, r.message, r.worker_pid, r.backend_pid, r.instance_id,
       r.rows_affected, r.result,
       r.jitter  -- what the start was delayed by (NULL: the job has no jitter)
  FROM pgsched.job_run r
  JOIN pgsched.job j USING (job_id)
$ddl$);

-- Row-level security decides which rows; every role may ask.
GRANT SELECT ON pgsched.jobs, pgsched.job_stats, pgsched.job_history, pgsched.concurrency_limits TO PUBLIC;

-- Live and stopped scheduler instances. alive: not stopped, heartbeat recent, and its
-- connection still there (the rules _abandoned_runs uses, with the default dead_after, 10 s).
-- runs_in_progress counts the runs the reader may see (row-level security).
SELECT pgsched._replace_if_changed('pgsched.instances', NULL, $ddl$
CREATE OR REPLACE VIEW pgsched.instances WITH (security_invoker = true) AS
SELECT i.instance_id, i.host, i.pid, i.version, i.max_workers, i.started_at, i.heartbeat_at, i.stopped_at,
       (i.stopped_at IS NULL AND i.heartbeat_at >= now() - interval '10 seconds'
        AND EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity a WHERE a.pid = i.backend_pid)) AS alive,
       (SELECT count(*) FROM pgsched.job_run_live r WHERE r.instance_id = i.instance_id AND r.outcome = 'running')
           AS runs_in_progress
  FROM pgsched.instance i
$ddl$);

GRANT SELECT ON pgsched.instances TO PUBLIC;
