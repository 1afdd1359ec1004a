-- What users read: jobs (definitions), job_stats (one row per job), job_history
-- (one row per run). Columns may only be appended (CREATE OR REPLACE VIEW).

CREATE OR REPLACE VIEW pgsched.jobs AS
SELECT j.job_id, j.job_name, j.owner, j.kind,
       j.proc_schema, j.proc_name, j.command, j.code_module, j.code_function,
       j.schedule, j.schedule_interval, j.fixed_schedule, j.initial_start, j.timezone,
       j.config, j.check_schema, j.check_name, j.scheduled,
       j.max_runtime, j.max_retries, j.retry_period, j.catch_up,
       s.next_start, j.created_at, j.updated_at
  FROM pgsched.job j
  JOIN pgsched.job_stat s USING (job_id);

CREATE OR REPLACE VIEW pgsched.job_stats AS
SELECT s.job_id, j.job_name, j.owner, s.state, s.next_start,
       s.last_start, s.last_finish, s.last_successful_finish, s.last_run_success,
       CASE WHEN s.last_run_success THEN 'Success' WHEN NOT s.last_run_success THEN 'Failed' END
           AS last_run_status,
       s.last_run_duration,
       s.total_runs, s.total_successes, s.total_failures, s.total_crashes, s.total_skipped,
       s.consecutive_failures, s.consecutive_crashes,
       s.current_run_id, s.disabled_reason
  FROM pgsched.job_stat s
  JOIN pgsched.job j USING (job_id);

CREATE OR REPLACE VIEW pgsched.job_history AS
SELECT r.run_id, r.job_id, j.job_name, r.scope, r.plan_time, r.attempt, r.trigger,
       r.started_at, r.finished_at, r.finished_at - r.started_at AS duration,
       r.outcome, r.outcome = 'success' AS succeeded,
       r.sqlstate, r.message, r.worker_pid, r.backend_pid, r.instance_id,
       r.rows_affected, r.result
  FROM pgsched.job_run r
  JOIN pgsched.job j USING (job_id);
