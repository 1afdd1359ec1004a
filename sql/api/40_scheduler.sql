-- What `pgsched serve` runs: claiming due jobs (mark_start for a batch, one
-- statement), the instance registry, finding runs nobody will finish, and the
-- skipped-slot record. Closing a run is pgsched._end_runs (20_runs.sql).

-- Python jobs are claimed only by instances that loaded their module (an instance
-- without it must not wake for them): the condition
--     kind <> 'python' OR code_module = ANY (code_modules)
-- is written out in each query below rather than called, because a function with a
-- pinned search_path cannot be inlined and would cost a call per candidate row.
-- Likewise +/-infinity timestamps (possible only by writing the catalog by hand)
-- are filtered with isfinite() and read as NULL, never handed to the client.

-- Time: every function here that needs the current time takes it as its last argument,
-- `now`, defaulting to the database's now(): the scheduler passes nothing (one clock for
-- every host, the database's), and tests pass the instant they want instead of sleeping.
-- db_now columns stay clock_timestamp(): they are the reading the scheduler anchors its
-- clock on (pgsched/clock.py), not a scheduling decision.

-- All of this file's functions are internal: replaced whole on every upgrade.
SELECT pgsched._drop_functions(ARRAY[
    '_abandoned_runs',
    '_abandoned_runs_v2',
    '_abandoned_scope_run',
    '_arm_restart_jobs',
    '_behind',
    '_behind_v2',
    '_catch_up',
    '_catch_up_v2',
    '_claim_v2',
    '_close_batch',
    '_close_runs',
    '_disable_job_v2',
    '_finish_run',
    '_finish_runs',
    '_heartbeat',
    '_heartbeat_v2',
    '_instance_heartbeat',
    '_instance_heartbeat_v2',
    '_instance_stop',
    '_instance_stop_v2',
    '_missing_runs',
    '_next_due',
    '_next_due_v2',
    '_plan',
    '_record_skipped',
    '_record_skipped_v2',
    '_register_instance',
    '_register_instance_v2',
    '_run_app_name',
    '_set_terminating',
    '_take_over_v2',
    '_terminate_run_backend',
    '_unplanned']);

-- Queued runs a scheduler may claim (a scoped job's scope runs): of a scheduled job, and the
-- oldest queued run of their (job, scope) with no run of that scope in progress (a scope runs one
-- plan at a time). Read by _claim_v2 and _next_due; a view, so it is inlined into both
-- (_claim_v2's queued runs repeat its conditions, for their plan). Two tests, each on its partial
-- index (running runs by job; queued runs by job, scope and plan): one test with an OR read the
-- job's whole history for every queued run. The second is the scope's first plan_time, a subquery
-- by key: as NOT EXISTS (no earlier queued run), the planner, going by statistics taken while the
-- queue was short, joined it by reading the whole queue for each run tested (3 ms a _next_due
-- call with 8,000 scope runs queued, 0.6 ms now; bench scheduler scopes with pg_stat_statements).
SELECT pgsched._replace_if_changed('pgsched._claimable_scope_runs', NULL, $ddl$
CREATE OR REPLACE VIEW pgsched._claimable_scope_runs AS
SELECT q.run_id, q.job_id, q.plan_time, j.kind, j.code_module
  FROM pgsched.job_run_live q JOIN pgsched.job j ON j.job_id = q.job_id
 WHERE q.outcome = 'queued' AND j.scheduled
   AND NOT EXISTS (SELECT 1 FROM pgsched.job_run_live o
                    WHERE o.job_id = q.job_id AND o.outcome = 'running' AND o.scope = q.scope)
   AND q.plan_time = (SELECT min(o.plan_time) FROM pgsched.job_run_live o
                       WHERE o.job_id = q.job_id AND o.scope = q.scope AND o.outcome = 'queued')
$ddl$);

-- A run to launch, as _claim_v2 and _take_over_v2 return it: the run, its job's counters before
-- it, and what pgsched._job_launch says about the job, every setting of pgsched.job_settings
-- among it by its own name, an interval setting in seconds as <name>_s (extract(epoch ...)):
-- the scheduler reads them by name (pgsched.model.JobSettings.from_launch_row, whose test fails
-- when a setting is missing here). job_state is the job's state after the claim. (Created again
-- only when it changed: see _define_type.) Not the job row as jsonb: building and parsing it
-- cost 3 % of the claim and a tenth of the scheduler's Python per run.
SELECT pgsched._define_type('_launch_row_v2', $$
    run_id bigint, job_id integer, scope text, attempt integer, plan_time timestamptz, started_at timestamptz,
    lease_token bigint, worker_pid integer, backend_pid integer, consecutive_failures integer,
    consecutive_crashes integer, job_name text, kind text, owner text, proc_schema name, proc_name name,
    is_procedure boolean, command text, code_module text, code_function text, config jsonb, schedule text,
    months integer, days integer, micros bigint, fixed_schedule boolean, initial_start timestamptz,
    timezone text, max_runtime_s double precision, max_retries integer, retry_period_s double precision,
    catch_up text, catch_up_window_s double precision, max_plans_per_tick integer,
    schedule_delay_s double precision, allow_stale_reentry boolean, scope_query text, next_due timestamptz,
    db_now timestamptz, scheduled boolean, job_state text, database text, priority integer,
    exclude text, jitter_s double precision, concurrency_key text, depends_on integer[], history text,
    success_retention_s double precision, failure_retention_s double precision$$);

-- What a scheduler needs to launch a run of a job, by job_id: read by _claim_v2 and
-- _take_over_v2. A view, so that it is inlined into their queries (a function with a
-- pinned search_path would be called once per row).
-- Columns may only be appended (CREATE OR REPLACE VIEW replaces release 0.1.0's in place).
SELECT pgsched._replace_if_changed('pgsched._job_launch', NULL, $ddl$
CREATE OR REPLACE VIEW pgsched._job_launch AS
SELECT j.job_id, j.job_name, j.kind,
       -- The role's name as it logs in (regrole's text would be a quoted identifier), NULL if
       -- the role was dropped: the scheduler then disables the job instead of running it.
       ro.rolname::text AS owner, j.proc_schema, j.proc_name, pr.is_procedure, j.command,
       j.code_module, j.code_function, j.config, j.schedule,
       -- pgsched._interval_parts' components, each inlined
       pgsched._iv_months(j.schedule_interval) AS months, pgsched._iv_days(j.schedule_interval) AS days,
       pgsched._iv_micros(j.schedule_interval) AS micros,
       j.fixed_schedule, CASE WHEN pg_catalog.isfinite(j.initial_start) THEN j.initial_start END AS initial_start,
       j.timezone, extract(epoch FROM j.max_runtime)::float8 AS max_runtime_s, j.max_retries,
       extract(epoch FROM j.retry_period)::float8 AS retry_period_s, j.catch_up,
       extract(epoch FROM j.catch_up_window)::float8 AS catch_up_window_s, j.max_plans_per_tick,
       extract(epoch FROM j.schedule_delay)::float8 AS schedule_delay_s, j.allow_stale_reentry, j.scope_query,
       j.scheduled,
       -- appended (release 0.1.0's view is replaced in place): the job's database, NULL for ours
       j.database, j.priority, j.exclude, extract(epoch FROM j.jitter)::float8 AS jitter_s, j.concurrency_key,
       j.depends_on, j.history, extract(epoch FROM j.success_retention)::float8 AS success_retention_s,
       extract(epoch FROM j.failure_retention)::float8 AS failure_retention_s
  FROM pgsched.job j
  LEFT JOIN pg_catalog.pg_roles ro ON ro.oid = j.owner
  LEFT JOIN LATERAL (
      SELECT p.prokind = 'p' AS is_procedure
        FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
       WHERE n.nspname = j.proc_schema AND p.proname = j.proc_name
         AND p.proargtypes = '23 3802'::pg_catalog.oidvector
  ) pr ON true
$ddl$);

-- Scope retries queued for later (_close_batch queues one for its time), of scheduled jobs: the
-- first one's plan_time is a wake-up like a job's next start (_claim_v2, _next_due), read in
-- plan_time order on job_run_queued_idx from `now` on. (A retry of a scope still running, or of
-- a job whose key is full, wakes a scheduler that then finds nothing; it is claimed later.)
SELECT pgsched._replace_if_changed('pgsched._scope_retries', NULL, $ddl$
CREATE OR REPLACE VIEW pgsched._scope_retries AS
SELECT q.run_id, q.plan_time, j.kind, j.code_module
  FROM pgsched.job_run_live q JOIN pgsched.job j ON j.job_id = q.job_id
 WHERE q.outcome = 'queued' AND j.scheduled
$ddl$);

-- Claim up to cardinality(worker_pids) due runs and mark their start: first due jobs
-- (most overdue first, a job's priority counted as that many seconds more overdue: migration
-- 0008; a job is due at next_start plus its plan's jitter: 0010, whose index gives this order),
-- then, with the workers left, queued runs (of scoped jobs: an @after job whose upstreams succeeded
-- is a due job, 07_dependencies.sql). While queued runs are claimable, due jobs take at most half of
-- the workers, so that neither starves the other when the workers are short.
-- Each gets a 'running' job_run row carrying the worker that will run it and a lease
-- token, and its crash counters go up (see 20_runs.sql for why). SKIP LOCKED and the
-- state check let several schedulers claim at once without waiting on or
-- double-claiming each other; the unique (job_id, scope, plan_time) key makes a planned
-- run happen at most once even so. A job whose planned run already exists (e.g.
-- next_start was set back by hand to a plan that ran) gets its next_start cleared, and
-- the scheduler computes a fresh one.
-- `ahead` claims runs due within that much time: the scheduler hands them to a
-- worker that waits for the start time, so the claim's own latency does not delay
-- the start. Such a run's started_at is its start time.
-- Which queued scope runs are claimable: pgsched._claimable_scope_runs.
-- Concurrency limits (25_concurrency.sql): a job with a concurrency_key is claimed only while its
-- key has room, counting the runs holding it and those this claim takes. Two instances must not
-- both see the same room: a claim that may take a keyed run first takes one advisory lock, held
-- to its commit, and only then counts (its next statement sees what the previous holder
-- committed). A claim with no keyed run due takes no lock, and no keyed run.
CREATE OR REPLACE FUNCTION pgsched._claim_v2(instance_id bigint, worker_pids integer[], backend_pids integer[],
                                          ahead interval DEFAULT interval '0', code_modules text[] DEFAULT '{}',
                                          now timestamptz DEFAULT now())
RETURNS SETOF pgsched._launch_row_v2
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- The next-due subquery must walk job_stat_due_at_idx in order and stop at its first row. When
-- the statistics of job_stat (whose rows flip between scheduled and starting all the time) say
-- few jobs are scheduled, the planner preferred a bitmap scan of every due job and a sort: 0.9 of
-- the claim's 2.3 ms with 400 jobs due (bench/claim_close.py). Nothing here wants a bitmap scan.
SET enable_bitmapscan = off
-- Generic plans from the first call. Left to choose, a session plans each statement afresh at its
-- first five calls and only then keeps the generic plan it runs on from there on (the same plan:
-- claim_close and --statements show no other); a new scheduler's first claims, often a burst of
-- jobs due at its start, paid about 3 ms a plan for the main statement below (`./dev bench
-- scheduler burst --statements`: 16 us a run of planning, 2.5-3.6 with this).
SET plan_cache_mode = force_generic_plan AS $$
-- PL/pgSQL rather than SQL: it keeps this statement's plan for the session, where a SQL
-- function would plan the whole query again on every claim.
DECLARE
    keyed boolean;
    queued boolean;
BEGIN
    -- On the partial index of keyed due jobs, and the queued scope runs (usually none; with many
    -- queued runs of unkeyed jobs this walks them until a keyed one, a plain index scan).
    keyed := EXISTS (SELECT 1 FROM pgsched.job_stat s
                      WHERE s.state = 'scheduled' AND s.concurrency_key IS NOT NULL
                        AND pgsched._due_at(s.job_id, s.next_start, s.jitter_us)
                            <= pg_catalog.timezone('UTC', _claim_v2.now + ahead))
          -- keyed jobs first (few: job_stat_keyed_idx), then their queued runs: the queue may be long
          OR EXISTS (SELECT 1 FROM pgsched.job_stat s
                      WHERE s.concurrency_key IS NOT NULL
                        AND EXISTS (SELECT 1 FROM pgsched.job_run_live q
                                     WHERE q.job_id = s.job_id AND q.outcome = 'queued'
                                       AND q.plan_time <= _claim_v2.now + ahead));
    IF keyed THEN
        PERFORM pg_catalog.pg_advisory_xact_lock(7401295312);
    END IF;
    -- Any queued scope run, claimable or a retry for later, of any job (job_run_queued_idx).
    queued := EXISTS (SELECT 1 FROM pgsched.job_run_live q WHERE q.outcome = 'queued');
    IF NOT keyed AND NOT queued THEN
        -- The usual claim: no keyed job due and no scope run queued. The statement below with
        -- what only keys and queued runs need left out (their room, ranks, queue walk, the
        -- workers kept for the queue, and the next-due terms of queued runs): a claim of 1, 8 and
        -- 16 runs took 0.66, 1.78 and 2.57 ms against 0.99, 2.38 and 3.22 (bench/claim_close.py,
        -- 2026-12-02), most of the difference the larger plan's executor start-up at every call.
        -- Every rule it keeps is the full statement's, in the same words: a change to one is a
        -- change to both, and tests/integration/test_claim_paths.py runs both on the same states
        -- and compares what they return and write (it tells the two apart by this DEBUG line).
        RAISE DEBUG 'pgsched claim: no keyed job due, no scope run queued';
        RETURN QUERY
        WITH due AS (
            SELECT c.job_id, c.next_start, c.consecutive_failures, c.consecutive_crashes, c.after_upstreams,
                   c.schedule_delay,
                   pgsched._delayed(c.next_start, -c.schedule_delay) AS plan_time,
                   pgsched._jitter_us(c.job_id, c.next_start, c.jitter_us) AS jitter_us,
                   row_number() OVER (ORDER BY c.start_key, c.job_id) AS n
              FROM (SELECT s.job_id, s.next_start, s.consecutive_failures, s.consecutive_crashes, jj.schedule_delay,
                           s.jitter_us, jj.schedule = '@after' AS after_upstreams,
                           pgsched._start_key(s.job_id, s.next_start, s.jitter_us, s.priority) AS start_key
                      FROM pgsched.job_stat s
                      JOIN pgsched.job jj ON jj.job_id = s.job_id
                     WHERE s.state = 'scheduled'
                       AND pgsched._due_at(s.job_id, s.next_start, s.jitter_us)
                           <= pg_catalog.timezone('UTC', _claim_v2.now + ahead)
                       AND pgsched._start_key(s.job_id, s.next_start, s.jitter_us, s.priority)
                           <= pg_catalog.timezone('UTC', _claim_v2.now + ahead) + interval '3600 seconds'
                       AND pg_catalog.isfinite(s.next_start)
                       AND (jj.kind <> 'python' OR jj.code_module = ANY (code_modules))
                       -- none is due (keyed is false); one due since is the full claim's to take
                       AND s.concurrency_key IS NULL
                     ORDER BY pgsched._start_key(s.job_id, s.next_start, s.jitter_us, s.priority), s.job_id
                     LIMIT cardinality(worker_pids)
                       FOR UPDATE OF s SKIP LOCKED) c
        ), runs AS (
            INSERT INTO pgsched.job_run_live AS r (job_id, plan_time, trigger, started_at, worker_pid, backend_pid,
                                              instance_id, lease_token, heartbeat_at, jitter, concurrency_key)
            SELECT d.job_id, d.plan_time,
                   CASE WHEN d.after_upstreams THEN 'upstream' WHEN d.consecutive_failures > 0 THEN 'retry'
                        ELSE 'schedule' END,
                   greatest(_claim_v2.now, d.next_start + d.jitter_us * interval '1 microsecond'),
                   worker_pids[d.n], backend_pids[d.n], instance_id,
                   nextval('pgsched.lease_token_seq'), _claim_v2.now,
                   CASE WHEN d.jitter_us > 0 THEN d.jitter_us * interval '1 microsecond' END, NULL
              FROM due d
             ORDER BY d.n
            ON CONFLICT ON CONSTRAINT job_run_plan_key DO NOTHING
            RETURNING r.run_id, r.job_id, r.scope, r.attempt, r.plan_time, r.started_at, r.lease_token, r.worker_pid,
                      r.backend_pid
        ), started AS (
            -- one plan run per job: no scope runs here
            UPDATE pgsched.job_stat s
               SET state = 'starting', current_run_id = c.run_id, last_start = greatest(s.last_start, c.started_at),
                   total_runs = s.total_runs + 1, total_crashes = s.total_crashes + 1,
                   consecutive_crashes = s.consecutive_crashes + 1
              FROM runs c
             WHERE s.job_id = c.job_id
            RETURNING s.job_id, s.state
        ), conflicted AS (
            UPDATE pgsched.job_stat s
               SET next_start = CASE WHEN d.after_upstreams
                                     THEN pgsched._delayed(s.upstream_backlog[1], d.schedule_delay) END,
                   upstream_backlog = CASE WHEN d.after_upstreams THEN nullif(s.upstream_backlog[2:], '{}') END
              FROM due d
             WHERE s.job_id = d.job_id AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.job_id = d.job_id)
            RETURNING s.job_id
        )
        SELECT c.run_id, c.job_id, c.scope, c.attempt, c.plan_time, c.started_at, c.lease_token, c.worker_pid,
               c.backend_pid, d.consecutive_failures, d.consecutive_crashes,
               v.job_name, v.kind, v.owner, v.proc_schema, v.proc_name, v.is_procedure, v.command, v.code_module,
               v.code_function, v.config, v.schedule, v.months, v.days, v.micros, v.fixed_schedule, v.initial_start,
               v.timezone, v.max_runtime_s, v.max_retries, v.retry_period_s, v.catch_up, v.catch_up_window_s,
               v.max_plans_per_tick, v.schedule_delay_s, v.allow_stale_reentry, v.scope_query,
               -- a keyed job is not due before `now + ahead` (keyed is false), so its key's room
               -- does not matter to when it is due
               least((SELECT pg_catalog.timezone('UTC', pgsched._due_at(s2.job_id, s2.next_start, s2.jitter_us))
                        FROM pgsched.job_stat s2 JOIN pgsched.job j2 ON j2.job_id = s2.job_id
                       WHERE s2.state = 'scheduled' AND pg_catalog.isfinite(s2.next_start)
                         AND (j2.kind <> 'python' OR j2.code_module = ANY (code_modules))
                         AND NOT EXISTS (SELECT 1 FROM due d2 WHERE d2.job_id = s2.job_id)
                       ORDER BY pgsched._due_at(s2.job_id, s2.next_start, s2.jitter_us) LIMIT 1),
                     -- Queued runs, none when `queued` was read: these see the ones another
                     -- instance's close committed since, so that this scheduler does not sleep past
                     -- them (a claimable one: now, and the next claim takes the full statement).
                     (SELECT _claim_v2.now FROM pgsched._claimable_scope_runs c2
                       WHERE (c2.kind <> 'python' OR c2.code_module = ANY (code_modules))
                         AND c2.plan_time <= _claim_v2.now
                       LIMIT 1),
                     (SELECT w.plan_time FROM pgsched._scope_retries w
                       WHERE w.plan_time > _claim_v2.now AND (w.kind <> 'python' OR w.code_module = ANY (code_modules))
                       ORDER BY w.plan_time LIMIT 1)),
               clock_timestamp(), v.scheduled, st.state, v.database, v.priority, v.exclude, v.jitter_s,
               v.concurrency_key, v.depends_on,
               v.history, v.success_retention_s, v.failure_retention_s
          FROM runs c
          JOIN due d ON d.job_id = c.job_id
          LEFT JOIN started st ON st.job_id = c.job_id
          JOIN pgsched._job_launch v ON v.job_id = c.job_id
         ORDER BY c.plan_time, c.job_id, c.scope;
        RETURN;
    END IF;
    RETURN QUERY
    WITH room AS (
        -- Each key's free places before this claim (25_concurrency.sql). Read only when a keyed
        -- job is due.
        SELECT k.concurrency_key, k.free FROM pgsched._key_room k
    ), cand AS (
        -- Due jobs in claim order; a keyed one only where its key has room before this claim (and
        -- only by a claim that holds the lock).
        SELECT s.*, row_number() OVER (PARTITION BY s.concurrency_key ORDER BY s.start_key, s.job_id) AS key_rank
          FROM (SELECT s.job_id, s.next_start, s.consecutive_failures, s.consecutive_crashes, jj.schedule_delay,
                       s.jitter_us, s.concurrency_key, f.free, jj.schedule = '@after' AS after_upstreams,
                       pgsched._start_key(s.job_id, s.next_start, s.jitter_us, s.priority) AS start_key
                  FROM pgsched.job_stat s
                  JOIN pgsched.job jj ON jj.job_id = s.job_id
                  LEFT JOIN LATERAL (
                      SELECT coalesce((SELECT r.free FROM room r WHERE r.concurrency_key = s.concurrency_key),
                                      pgsched._key_default_limit()) AS free
                       WHERE keyed AND s.concurrency_key IS NOT NULL) f ON true
                 WHERE s.state = 'scheduled'
                   AND pgsched._due_at(s.job_id, s.next_start, s.jitter_us)
                       <= pg_catalog.timezone('UTC', _claim_v2.now + ahead)
                   -- Implied by the line above (priorities are within +-3600 s): a bound on the
                   -- index's key, so that the index in claim order is the one read, whatever the
                   -- estimate of how many are due (else: the due index, then a sort of all).
                   AND pgsched._start_key(s.job_id, s.next_start, s.jitter_us, s.priority)
                       <= pg_catalog.timezone('UTC', _claim_v2.now + ahead) + interval '3600 seconds'
                   AND pg_catalog.isfinite(s.next_start)
                   AND (jj.kind <> 'python' OR jj.code_module = ANY (code_modules))
                   AND (s.concurrency_key IS NULL OR f.free > 0)
                 ORDER BY pgsched._start_key(s.job_id, s.next_start, s.jitter_us, s.priority), s.job_id
                 -- Workers kept for queued runs: as many as are claimable, up to half (in the
                 -- statement, not a statement of its own: a tenth of the claim's time).
                 LIMIT cardinality(worker_pids)
                       - (SELECT count(*) FROM (SELECT 1 FROM pgsched._claimable_scope_runs c
                                                 WHERE (c.kind <> 'python' OR c.code_module = ANY (code_modules))
                                                   AND c.plan_time <= _claim_v2.now + ahead
                                                 LIMIT cardinality(worker_pids) / 2) x)
                   FOR UPDATE OF s SKIP LOCKED) s
    ), due AS (
        -- Within the batch, a key takes no more than its room; n: the worker each run goes to.
        SELECT c.job_id, c.next_start, c.consecutive_failures, c.consecutive_crashes, c.concurrency_key,
               c.after_upstreams, c.schedule_delay,
               -- next_start is when the plan becomes eligible: plan_time + schedule_delay.
               pgsched._delayed(c.next_start, -c.schedule_delay) AS plan_time,
               pgsched._jitter_us(c.job_id, c.next_start, c.jitter_us) AS jitter_us,
               row_number() OVER (ORDER BY c.start_key, c.job_id) AS n
          FROM cand c
         WHERE c.concurrency_key IS NULL OR c.key_rank <= c.free
    ), queued AS (
        SELECT q.run_id, q.concurrency_key,
               (SELECT count(*) FROM due) + row_number() OVER (ORDER BY q.plan_time, q.run_id) AS n
          FROM (SELECT q.*, row_number() OVER (PARTITION BY q.concurrency_key ORDER BY q.plan_time, q.run_id)
                            AS key_rank
                  FROM (SELECT q.run_id, q.plan_time, qs.concurrency_key,
                               f.free - (SELECT count(*) FROM due d WHERE d.concurrency_key = qs.concurrency_key) AS free
                          FROM pgsched.job_run_live q
                          JOIN pgsched.job_stat qs ON qs.job_id = q.job_id
                          JOIN pgsched.job qj ON qj.job_id = q.job_id
                          LEFT JOIN LATERAL (
                              SELECT coalesce((SELECT r.free FROM room r WHERE r.concurrency_key = qs.concurrency_key),
                                              pgsched._key_default_limit()) AS free
                               WHERE keyed AND qs.concurrency_key IS NOT NULL) f ON true
                         -- _claimable_scope_runs' conditions, written out: through the view (a semi-join)
                         -- every queued run was tested, where this walks the queue in order and stops at
                         -- the batch (4.5 ms a claim with 350 runs queued, bench/scheduler.py --dependencies).
                         WHERE q.outcome = 'queued' AND qj.scheduled
                           AND (qj.kind <> 'python' OR qj.code_module = ANY (code_modules))
                           AND NOT EXISTS (SELECT 1 FROM pgsched.job_run_live o
                                            WHERE o.job_id = q.job_id AND o.outcome = 'running' AND o.scope = q.scope)
                           AND q.plan_time = (SELECT min(o.plan_time) FROM pgsched.job_run_live o
                                               WHERE o.job_id = q.job_id AND o.scope = q.scope AND o.outcome = 'queued')
                           AND (qs.concurrency_key IS NULL OR f.free > 0)
                         ORDER BY q.plan_time, q.run_id
                         LIMIT greatest(cardinality(worker_pids) - (SELECT count(*) FROM due), 0)
                           -- qs too: the job's row is updated below, and a close on another
                           -- instance that holds it may be waiting for this claim's lock.
                           FOR UPDATE OF q, qs SKIP LOCKED) q
                 -- A scope's retry queued for later (_close_batch) waits for its time (claimed
                 -- `ahead`, as a due job is: its worker waits for started_at). Tested here, past the
                 -- walk: the queue is in plan_time order, so the walk meets runs due now first, and
                 -- the test in it made the planner read and sort the whole queue (a claim of 16
                 -- from 8,000 queued runs took 166 ms instead of 2).
                 WHERE q.plan_time <= _claim_v2.now + ahead) q
         WHERE q.concurrency_key IS NULL OR q.key_rank <= q.free
    ), runs AS (
        INSERT INTO pgsched.job_run_live AS r (job_id, plan_time, trigger, started_at, worker_pid, backend_pid,
                                          instance_id, lease_token, heartbeat_at, jitter, concurrency_key)
        SELECT d.job_id, d.plan_time,
               -- an @after job's plan was given by its upstreams' success (07_dependencies.sql)
               CASE WHEN d.after_upstreams THEN 'upstream' WHEN d.consecutive_failures > 0 THEN 'retry'
                    ELSE 'schedule' END,
               greatest(_claim_v2.now, d.next_start + d.jitter_us * interval '1 microsecond'),
               worker_pids[d.n], backend_pids[d.n], instance_id,
               nextval('pgsched.lease_token_seq'), _claim_v2.now,
               CASE WHEN d.jitter_us > 0 THEN d.jitter_us * interval '1 microsecond' END, d.concurrency_key
          FROM due d
         ORDER BY d.n
        ON CONFLICT ON CONSTRAINT job_run_plan_key DO NOTHING
        RETURNING r.run_id, r.job_id, r.scope, r.attempt, r.plan_time, r.started_at, r.lease_token, r.worker_pid,
                  r.backend_pid
    ), scoped AS (
        UPDATE pgsched.job_run_live r
           SET outcome = 'running', started_at = greatest(_claim_v2.now, r.plan_time), worker_pid = worker_pids[q.n],
               backend_pid = backend_pids[q.n], instance_id = _claim_v2.instance_id,
               lease_token = nextval('pgsched.lease_token_seq'), heartbeat_at = _claim_v2.now,
               concurrency_key = q.concurrency_key
          FROM queued q
         -- By key, whatever the statistics say: once an ANALYZE saw a long queue, the join read all
         -- of job_run_live into a hash for the claim's few runs (a claim of 16 from 10,000 queued
         -- runs took about 7 ms, 3 with the ids as an array: bench/queue_claim.py).
         WHERE r.run_id = q.run_id AND r.run_id = ANY (ARRAY(SELECT q2.run_id FROM queued q2))
        RETURNING r.run_id, r.job_id, r.scope, r.attempt, r.plan_time, r.started_at, r.lease_token, r.worker_pid,
                  r.backend_pid
    ), claimed AS (
        SELECT * FROM runs UNION ALL SELECT * FROM scoped
    ), started AS (
        -- One update per job (a job may start a plan and scope runs of an earlier plan at once):
        -- scope runs count in the totals but leave the job's state to its plan run.
        UPDATE pgsched.job_stat s
           SET state = CASE WHEN c.plan_run IS NULL THEN s.state ELSE 'starting' END,
               current_run_id = coalesce(c.plan_run, s.current_run_id),
               last_start = greatest(s.last_start, c.started_at),
               total_runs = s.total_runs + c.n, total_crashes = s.total_crashes + c.n,
               consecutive_crashes = s.consecutive_crashes + (c.plan_run IS NOT NULL)::integer
          FROM (SELECT c.job_id, count(*)::integer AS n, max(c.run_id) FILTER (WHERE c.scope = '') AS plan_run,
                       max(c.started_at) AS started_at
                  FROM claimed c GROUP BY c.job_id) c
         WHERE s.job_id = c.job_id
        RETURNING s.job_id, s.state
    ), conflicted AS (
        -- The plan ran already (another instance's claim, or the server's start for @restart): none
        -- pending, or an @after job's next waiting plan.
        UPDATE pgsched.job_stat s
           SET next_start = CASE WHEN d.after_upstreams
                                 THEN pgsched._delayed(s.upstream_backlog[1], d.schedule_delay) END,
               upstream_backlog = CASE WHEN d.after_upstreams THEN nullif(s.upstream_backlog[2:], '{}') END
          FROM due d
         WHERE s.job_id = d.job_id AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.job_id = d.job_id)
        RETURNING s.job_id
    )
    SELECT c.run_id, c.job_id, c.scope, c.attempt, c.plan_time, c.started_at, c.lease_token, c.worker_pid,
           c.backend_pid,
           coalesce(d.consecutive_failures, 0), coalesce(d.consecutive_crashes, 0),
           v.job_name, v.kind, v.owner, v.proc_schema, v.proc_name, v.is_procedure, v.command, v.code_module,
           v.code_function, v.config, v.schedule, v.months, v.days, v.micros, v.fixed_schedule, v.initial_start,
           v.timezone, v.max_runtime_s, v.max_retries, v.retry_period_s, v.catch_up, v.catch_up_window_s,
           v.max_plans_per_tick, v.schedule_delay_s, v.allow_stale_reentry, v.scope_query,
           -- When the next job not claimed here is due, so the scheduler needs no
           -- separate query to know how long to sleep (evaluated once, on the index); a due job
           -- whose key was full before this claim is passed over, as _next_due does. A claimable
           -- queued run this claim left is due now.
           least((SELECT pg_catalog.timezone('UTC', pgsched._due_at(s2.job_id, s2.next_start, s2.jitter_us))
                    FROM pgsched.job_stat s2 JOIN pgsched.job j2 ON j2.job_id = s2.job_id
                   WHERE s2.state = 'scheduled' AND pg_catalog.isfinite(s2.next_start)
                     AND (j2.kind <> 'python' OR j2.code_module = ANY (code_modules))
                     AND NOT EXISTS (SELECT 1 FROM due d2 WHERE d2.job_id = s2.job_id)
                     AND (s2.concurrency_key IS NULL
                          OR pgsched._due_at(s2.job_id, s2.next_start, s2.jitter_us)
                             > pg_catalog.timezone('UTC', _claim_v2.now)
                          OR s2.concurrency_key NOT IN (SELECT r.concurrency_key FROM room r WHERE r.free <= 0))
                   ORDER BY pgsched._due_at(s2.job_id, s2.next_start, s2.jitter_us) LIMIT 1),
                 (SELECT _claim_v2.now FROM pgsched._claimable_scope_runs c2
                    JOIN pgsched.job_stat s3 ON s3.job_id = c2.job_id
                   WHERE (c2.kind <> 'python' OR c2.code_module = ANY (code_modules))
                     AND c2.plan_time <= _claim_v2.now
                     AND NOT EXISTS (SELECT 1 FROM queued q2 WHERE q2.run_id = c2.run_id)
                     AND (s3.concurrency_key IS NULL
                          OR s3.concurrency_key NOT IN (SELECT r.concurrency_key FROM room r WHERE r.free <= 0))
                   LIMIT 1),
                 (SELECT w.plan_time FROM pgsched._scope_retries w
                   WHERE w.plan_time > _claim_v2.now AND (w.kind <> 'python' OR w.code_module = ANY (code_modules))
                     AND NOT EXISTS (SELECT 1 FROM queued q3 WHERE q3.run_id = w.run_id)
                   ORDER BY w.plan_time LIMIT 1)),
           clock_timestamp(), v.scheduled, st.state, v.database, v.priority, v.exclude, v.jitter_s,
           v.concurrency_key, v.depends_on,
           v.history, v.success_retention_s, v.failure_retention_s
      FROM claimed c
      LEFT JOIN due d ON d.job_id = c.job_id AND c.scope = ''
      LEFT JOIN started st ON st.job_id = c.job_id
      JOIN pgsched._job_launch v ON v.job_id = c.job_id
     ORDER BY c.plan_time, c.job_id, c.scope;
END
$$;

-- Jobs whose next_start nobody has computed yet (cron jobs on a server without
-- PL/Python, fixed schedules whose origin is past, conflicts cleared by _claim).
CREATE OR REPLACE FUNCTION pgsched._unplanned(max_rows integer)
RETURNS TABLE (job_id integer, schedule text, months integer, days integer, micros bigint,
               fixed_schedule boolean, initial_start timestamptz, timezone text, infinite boolean)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT j.job_id, j.schedule, pgsched._iv_months(j.schedule_interval), pgsched._iv_days(j.schedule_interval),
           pgsched._iv_micros(j.schedule_interval), j.fixed_schedule,
           CASE WHEN pg_catalog.isfinite(j.initial_start) THEN j.initial_start END,
           j.timezone, s.next_start IS NOT NULL
      FROM pgsched.job_stat s
      JOIN pgsched.job j ON j.job_id = s.job_id
     WHERE s.state = 'scheduled' AND (s.next_start IS NULL OR NOT pg_catalog.isfinite(s.next_start))
       -- planned by the server's start (_arm_restart_jobs), and by upstreams (07_dependencies.sql), not by
       -- a scheduler
       AND j.schedule NOT IN ('@restart', '@after')
     ORDER BY j.job_id
     LIMIT max_rows
$$;

-- pg_cron's @restart: a job that runs once each time the server starts. Its plan time is the
-- server's start, pg_postmaster_start_time(), so the job_run key (job_id, scope, plan_time)
-- makes that run happen once however many schedulers arm it: each calls this when it connects
-- (a restart ends every session, so every scheduler reconnects after one), and the claim's
-- ON CONFLICT passes over a plan that already ran (and clears next_start again). A job created
-- or changed after the server started waits for the next start, as in pg_cron.
CREATE OR REPLACE FUNCTION pgsched._arm_restart_jobs()
RETURNS integer LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $$
    WITH u AS (
        UPDATE pgsched.job_stat s SET next_start = pgsched._delayed(pg_catalog.pg_postmaster_start_time(),
                                                                    j.schedule_delay)
          FROM pgsched.job j
         WHERE j.job_id = s.job_id AND j.schedule = '@restart' AND s.state = 'scheduled'
           AND s.next_start IS NULL AND j.updated_at < pg_catalog.pg_postmaster_start_time()
           AND NOT EXISTS (SELECT 1 FROM pgsched.job_run_live r
                            WHERE r.job_id = j.job_id AND r.scope = ''
                              AND r.plan_time = pg_catalog.pg_postmaster_start_time())
        RETURNING 1)
    SELECT count(*)::integer FROM u
$$;

-- Set next_start only where it is still unset, so a concurrent alter_job wins.
CREATE OR REPLACE FUNCTION pgsched._plan(job_ids integer[], next_starts timestamptz[])
RETURNS integer LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $$
    WITH u AS (
        UPDATE pgsched.job_stat s SET next_start = p.next_start
          FROM unnest(job_ids, next_starts) AS p(job_id, next_start)
         WHERE s.job_id = p.job_id AND s.next_start IS NULL
        RETURNING 1)
    SELECT count(*)::integer FROM u
$$;

CREATE OR REPLACE FUNCTION pgsched._next_due_v2(code_modules text[] DEFAULT '{}', now timestamptz DEFAULT now())
RETURNS TABLE (next_due timestamptz, unplanned boolean, db_now timestamptz)
LANGUAGE plpgsql STABLE ROWS 1
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- PL/pgSQL, so that the session keeps the statement's plan: a SQL function with a search_path
    -- of its own is planned again at every call (1.8 ms a call with 10,000 scope runs queued,
    -- where the claim, which holds the same look ahead, took 0.9 ms).
    RETURN QUERY
    -- ORDER BY ... LIMIT 1 walks the partial index; min() over the join would not. A due job
    -- waiting for its concurrency key is passed over (one not yet due is not: its instant is a
    -- wake-up like any other): the end of a run that frees the key wakes the schedulers when a
    -- job waits for it (pgsched._end_runs), and they ask again.
    SELECT least((SELECT pg_catalog.timezone('UTC', pgsched._due_at(s.job_id, s.next_start, s.jitter_us))
                    FROM pgsched.job_stat s JOIN pgsched.job j ON j.job_id = s.job_id
                   WHERE s.state = 'scheduled' AND pg_catalog.isfinite(s.next_start)
                     AND (j.kind <> 'python' OR j.code_module = ANY (code_modules))
                     AND (s.concurrency_key IS NULL
                          OR pgsched._due_at(s.job_id, s.next_start, s.jitter_us) > pg_catalog.timezone('UTC', _next_due_v2.now)
                          OR s.concurrency_key NOT IN (SELECT k.concurrency_key FROM pgsched._key_room k
                                                        WHERE k.free <= 0))
                   ORDER BY pgsched._due_at(s.job_id, s.next_start, s.jitter_us) LIMIT 1),
                 -- Claimable queued scope runs are due now.
                 (SELECT _next_due_v2.now FROM pgsched._claimable_scope_runs c
                    JOIN pgsched.job_stat s ON s.job_id = c.job_id
                   WHERE (c.kind <> 'python' OR c.code_module = ANY (code_modules))
                     AND c.plan_time <= _next_due_v2.now
                     AND (s.concurrency_key IS NULL
                          OR s.concurrency_key NOT IN (SELECT k.concurrency_key FROM pgsched._key_room k
                                                        WHERE k.free <= 0))
                   LIMIT 1),
                 -- Scope retries queued for later are due at their time.
                 (SELECT w.plan_time FROM pgsched._scope_retries w
                   WHERE w.plan_time > _next_due_v2.now AND (w.kind <> 'python' OR w.code_module = ANY (code_modules))
                   ORDER BY w.plan_time LIMIT 1)),
           EXISTS (SELECT 1 FROM pgsched.job_stat s JOIN pgsched.job j ON j.job_id = s.job_id
                    WHERE s.state = 'scheduled' AND (s.next_start IS NULL OR NOT pg_catalog.isfinite(s.next_start))
                      AND j.schedule NOT IN ('@restart', '@after')),
           clock_timestamp();
END
$$;

-- A run that ends while later slots of its job came due records them once:
-- total_skipped counts them and one 'skipped' history row names the range.
CREATE OR REPLACE FUNCTION pgsched._record_skipped_v2(run_id bigint, skipped integer, first_slot timestamptz,
                                                   last_slot timestamptz, now timestamptz DEFAULT clock_timestamp())
RETURNS void LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $$
    WITH r AS (SELECT jr.job_id, j.history FROM pgsched.job_run jr JOIN pgsched.job j ON j.job_id = jr.job_id
                WHERE jr.run_id = _record_skipped_v2.run_id),
    ins AS (
        -- The record is a history row: a job whose level keeps none of skips has only the count.
        INSERT INTO pgsched.job_run_live (job_id, plan_time, trigger, outcome, message, finished_at, result)
        SELECT r.job_id, first_slot, 'schedule', 'skipped',
               format('%s slot(s) from %s to %s skipped: run %s was still in progress', skipped, first_slot,
                      last_slot, _record_skipped_v2.run_id), _record_skipped_v2.now,
               -- The range in a form a program can check every slot against.
               jsonb_build_object('first', first_slot, 'last', last_slot, 'count', skipped)
          FROM r WHERE pgsched._kept(r.history, 'skipped')
        ON CONFLICT ON CONSTRAINT job_run_plan_key DO NOTHING)
    UPDATE pgsched.job_stat s SET total_skipped = s.total_skipped + skipped
      FROM r WHERE s.job_id = r.job_id
$$;

-- TERMINATING is persisted so that job_stats shows a run being cancelled.
CREATE OR REPLACE FUNCTION pgsched._set_terminating(run_id bigint)
RETURNS boolean LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $$
    WITH u AS (
        UPDATE pgsched.job_stat s SET state = 'terminating'
         WHERE s.current_run_id = _set_terminating.run_id AND s.state = 'starting'
        RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM u)
$$;

CREATE OR REPLACE FUNCTION pgsched._register_instance_v2(host text, pid integer, version text, max_workers integer,
                                                      now timestamptz DEFAULT now())
RETURNS TABLE (instance_id bigint, db_now timestamptz)
LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $$
    INSERT INTO pgsched.instance (host, pid, version, backend_pid, max_workers, started_at, heartbeat_at)
    VALUES (host, pid, version, pg_catalog.pg_backend_pid(), max_workers, _register_instance_v2.now,
            _register_instance_v2.now)
    RETURNING instance_id, _register_instance_v2.now
$$;

CREATE OR REPLACE FUNCTION pgsched._instance_heartbeat_v2(instance_id bigint, max_workers integer,
                                                       now timestamptz DEFAULT now())
RETURNS timestamptz LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $$
    UPDATE pgsched.instance i
       SET heartbeat_at = _instance_heartbeat_v2.now, max_workers = _instance_heartbeat_v2.max_workers,
           backend_pid = pg_catalog.pg_backend_pid(), stopped_at = NULL
     WHERE i.instance_id = _instance_heartbeat_v2.instance_id
    RETURNING _instance_heartbeat_v2.now
$$;

-- Whether an instance's row is still there: a scheduler cut off for longer than the history's
-- retention may find it pruned (pgsched.purge_history) when it reconnects, and registers again.
CREATE OR REPLACE FUNCTION pgsched._instance_exists(instance_id bigint)
RETURNS boolean LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT EXISTS (SELECT 1 FROM pgsched.instance i WHERE i.instance_id = _instance_exists.instance_id)
$$;

-- The peers are woken: the stopping instance's last closes moved next starts without a NOTIFY.
CREATE OR REPLACE FUNCTION pgsched._instance_stop_v2(instance_id bigint, now timestamptz DEFAULT now())
RETURNS void LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $$
    UPDATE pgsched.instance i SET stopped_at = _instance_stop_v2.now WHERE i.instance_id = _instance_stop_v2.instance_id;
    SELECT pg_catalog.pg_notify('pgsched_catalog', 'instance:stop');
$$;

-- The application_name a run's worker gives its backend: it names the job, the run and the
-- lease (a takeover's backend has another name than the stale attempt's). The worker's side is
-- pgsched.protocol.run_app_name; tests/integration/test_protocol.py checks they agree. No pinned
-- search_path (everything is qualified): so that it inlines into _abandoned_runs_v2' query.
CREATE OR REPLACE FUNCTION pgsched._run_app_name(job_id integer, run_id bigint, lease_token bigint)
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT pg_catalog.format('pgsched job %s run %s lease %s', job_id, run_id, lease_token)
$$;

-- Runs that nobody will finish, or whose holder may no longer finish them:
-- The causes are exactly pgsched.state.AbandonedCause's values (tests/integration/test_protocol.py):
--   'stopped': their scheduler stopped (or its row is gone);
--   'gone': their scheduler's database session ended and it has not heartbeated for
--           `grace` (a scheduler that reconnects at once keeps its runs; its connection
--           closes when its process dies, so this is the fast signal after a kill -9). A
--           session the server's restart ended says nothing of its scheduler, which may still
--           be backing off before it reconnects: a holder whose last heartbeat predates the
--           server's start is gone only dead_after after that start (the first peer back
--           closed the runs of a slower one as crashes, successes it was about to write among
--           them: seen once in CI on a slow machine);
--   'stale': the run's lease was not renewed for dead_after (a paused or partitioned
--           scheduler whose session is still there);
--   'session': a run_job whose calling session is gone;
--   'lost': our own run that we do not hold (a claim whose reply was lost, or a close
--           lost with the server: the scheduler commits asynchronously).
-- orphan_pid is a backend still running the run, found by the application_name its
-- worker set (it names the job, the run and the lease): the caller terminates it
-- before closing the run as a crash or taking it over (allow_stale_reentry).
CREATE OR REPLACE FUNCTION pgsched._abandoned_runs_v2(self_id bigint, dead_after interval, grace interval,
                                                   held bigint[], now timestamptz DEFAULT now())
RETURNS TABLE (run_id bigint, job_id integer, plan_time timestamptz, lease_token bigint, cause text,
               holder text, orphan_app text, orphan_pid integer, allow_stale_reentry boolean,
               consecutive_crashes integer, schedule text, months integer, days integer, micros bigint,
               fixed_schedule boolean, initial_start timestamptz, timezone text, retry_period_s double precision,
               schedule_delay_s double precision, after_restart boolean, scope text, code_module text)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT a.run_id, a.job_id, a.plan_time, a.lease_token, a.cause, a.holder, a.app,
           (SELECT sa.pid FROM pg_catalog.pg_stat_activity sa WHERE sa.application_name = a.app LIMIT 1),
           v.allow_stale_reentry AND a.trigger <> 'manual' AND s.state <> 'disabled', s.consecutive_crashes,
           v.schedule, v.months, v.days, v.micros, v.fixed_schedule, v.initial_start, v.timezone,
           v.retry_period_s, v.schedule_delay_s,
           -- after_restart: no scheduler saw the run's holder die. Its holder stopped heartbeating
           -- before we started, and no other live scheduler is there (not us, not the holder).
           -- Only then is it a restart, whose crash wait applies; otherwise it is a failover.
           coalesce(a.holder_beat < (SELECT me.started_at FROM pgsched.instance me WHERE me.instance_id = self_id),
                    true)
           AND NOT EXISTS (SELECT 1 FROM pgsched.instance o
                            WHERE o.instance_id <> self_id AND o.instance_id IS DISTINCT FROM a.instance_id
                              AND o.stopped_at IS NULL AND o.heartbeat_at >= _abandoned_runs_v2.now - dead_after
                              AND EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity sa WHERE sa.pid = o.backend_pid)),
           a.scope, CASE WHEN v.kind = 'python' THEN v.code_module END
      FROM (SELECT r.*, i.heartbeat_at AS holder_beat,
                   pgsched._run_app_name(r.job_id, r.run_id, r.lease_token) AS app,
                   pg_catalog.format('instance %s (%s, pid %s)', i.instance_id, i.host, i.pid) AS holder,
                   CASE
                     WHEN r.trigger = 'manual' AND r.instance_id IS NULL THEN
                         CASE WHEN NOT EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity sa
                                                WHERE sa.pid = r.backend_pid) THEN 'session' END
                     WHEN r.instance_id = self_id THEN CASE WHEN r.run_id <> ALL (held) THEN 'lost' END
                     WHEN i.instance_id IS NULL OR i.stopped_at IS NOT NULL THEN 'stopped'
                     WHEN i.heartbeat_at < _abandoned_runs_v2.now - grace
                          AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity sa WHERE sa.pid = i.backend_pid)
                          AND NOT (pg_catalog.pg_postmaster_start_time() > i.heartbeat_at
                                   AND pg_catalog.pg_postmaster_start_time() >= _abandoned_runs_v2.now - dead_after
                                   AND pg_catalog.pg_postmaster_start_time() <= _abandoned_runs_v2.now)
                         THEN 'gone'
                     WHEN coalesce(r.heartbeat_at, r.started_at) < _abandoned_runs_v2.now - dead_after THEN 'stale'
                   END AS cause
              FROM pgsched.job_run_live r
              LEFT JOIN pgsched.instance i ON i.instance_id = r.instance_id
             WHERE r.outcome = 'running') a
      JOIN pgsched.job_stat s ON s.job_id = a.job_id
      JOIN pgsched._job_launch v ON v.job_id = a.job_id
     WHERE a.cause IS NOT NULL
$$;

-- What the retry of a scope run found abandoned is decided on (pgsched.state.scope_retry_at):
-- the run's attempt and its job's max_retries and exclusion window; nothing for a plan run. Apart
-- from _abandoned_runs, whose columns release 0.1.0's prepared statements fix while API 1 is
-- served: the heartbeat joins it to each run that function returns (pgsched/store.py).
CREATE OR REPLACE FUNCTION pgsched._abandoned_scope_run(run_id bigint)
RETURNS TABLE (attempt integer, max_retries integer, exclude text)
LANGUAGE sql STABLE STRICT  -- (no call for the heartbeat's one row of NULLs when nothing is abandoned)
SET search_path = pg_catalog, pg_temp AS $$
    SELECT r.attempt, j.max_retries, j.exclude
      FROM pgsched.job_run_live r
      JOIN pgsched.job j ON j.job_id = r.job_id
     WHERE r.run_id = _abandoned_scope_run.run_id AND r.scope <> ''
$$;

-- A heartbeat: renew this instance's heartbeat and the leases of the runs it holds
-- (run_id, lease_token pairs); returns the held runs whose lease is no longer ours
-- (closed, or taken over by another scheduler that found it stale) and the database
-- time. The scheduler asks _abandoned_runs_v2 in the same statement (pgsched/store.py).
CREATE OR REPLACE FUNCTION pgsched._heartbeat_v2(instance_id bigint, max_workers integer, held bigint[],
                                              tokens bigint[], now timestamptz DEFAULT now())
RETURNS TABLE (lost bigint[], db_now timestamptz)
LANGUAGE plpgsql ROWS 1
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    beat timestamptz := pgsched._instance_heartbeat_v2(_heartbeat_v2.instance_id, _heartbeat_v2.max_workers, _heartbeat_v2.now);
BEGIN
    -- A row locked by someone's open transaction (a DELETE of the job, say) is skipped, not
    -- waited for: the loop must not freeze on it, and it is renewed at the next heartbeat.
    UPDATE pgsched.job_run_live r SET heartbeat_at = _heartbeat_v2.now
     WHERE r.run_id IN (SELECT l.run_id FROM pgsched.job_run_live l
                          JOIN unnest(held, tokens) AS h(run_id, token) ON h.run_id = l.run_id
                         WHERE l.lease_token = h.token AND l.outcome = 'running'
                           FOR UPDATE OF l SKIP LOCKED);
    -- Lost: closed, taken over (another token) or gone with its job. Read, not locked.
    RETURN QUERY
    SELECT ARRAY(SELECT h.run_id FROM unnest(held, tokens) AS h(run_id, token)
                  WHERE NOT EXISTS (SELECT 1 FROM pgsched.job_run_live r
                                     WHERE r.run_id = h.run_id AND r.lease_token = h.token
                                       AND r.outcome = 'running')),
           beat;
END
$$;

-- Take over stale runs of allow_stale_reentry jobs (found by _abandoned_runs_v2): the
-- same plan, run again as its next attempt under a new lease, by this instance's idle
-- workers. Fenced on the old lease token: if the holder came back and closed it, or
-- another instance took it first, nothing happens. The lost attempt stays counted as
-- a crash; the new one is counted in advance like any start (see 20_runs.sql). The job
-- keeps its state (starting, or terminating if its holder was cancelling the run: the
-- attempt ends like the one it replaces); only a job found scheduled becomes starting.
CREATE OR REPLACE FUNCTION pgsched._take_over_v2(instance_id bigint, run_ids bigint[], tokens bigint[],
                                              worker_pids integer[], backend_pids integer[],
                                              now timestamptz DEFAULT now())
RETURNS SETOF pgsched._launch_row_v2
LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $$
    WITH t AS (
        UPDATE pgsched.job_run_live r
           SET instance_id = _take_over_v2.instance_id, lease_token = nextval('pgsched.lease_token_seq'),
               attempt = r.attempt + 1, started_at = _take_over_v2.now, heartbeat_at = _take_over_v2.now,
               worker_pid = u.worker_pid, backend_pid = u.backend_pid,
               message = format('attempt %s: taken over after the lease of attempt %s (instance %s) went stale',
                                r.attempt + 1, r.attempt, r.instance_id)
          FROM unnest(run_ids, tokens, worker_pids, backend_pids) AS u(run_id, token, worker_pid, backend_pid)
         WHERE r.run_id = u.run_id AND r.lease_token = u.token AND r.outcome = 'running'
        RETURNING r.run_id, r.job_id, r.scope, r.attempt, r.plan_time, r.started_at, r.lease_token, r.worker_pid,
                  r.backend_pid
    ), s AS (
        UPDATE pgsched.job_stat s
           SET state = CASE WHEN c.plan_run IS NOT NULL AND s.state = 'scheduled' THEN 'starting' ELSE s.state END,
               current_run_id = coalesce(c.plan_run, s.current_run_id), last_start = c.started_at,
               total_runs = s.total_runs + c.n, total_crashes = s.total_crashes + c.n,
               consecutive_crashes = s.consecutive_crashes + (c.plan_run IS NOT NULL)::integer
          FROM (SELECT t.job_id, count(*)::integer AS n, max(t.run_id) FILTER (WHERE t.scope = '') AS plan_run,
                       max(t.started_at) AS started_at
                  FROM t GROUP BY t.job_id) c
         WHERE s.job_id = c.job_id
        RETURNING s.job_id, s.consecutive_failures, s.consecutive_crashes - 1 AS consecutive_crashes, s.state
    )
    SELECT t.run_id, t.job_id, t.scope, t.attempt, t.plan_time, t.started_at, t.lease_token, t.worker_pid,
           t.backend_pid,
           s.consecutive_failures, s.consecutive_crashes,
           v.job_name, v.kind, v.owner, v.proc_schema, v.proc_name, v.is_procedure, v.command, v.code_module,
           v.code_function, v.config, v.schedule, v.months, v.days, v.micros, v.fixed_schedule, v.initial_start,
           v.timezone, v.max_runtime_s, v.max_retries, v.retry_period_s, v.catch_up, v.catch_up_window_s,
           v.max_plans_per_tick, v.schedule_delay_s, v.allow_stale_reentry, v.scope_query,
           NULL::timestamptz, clock_timestamp(), v.scheduled, s.state, v.database, v.priority, v.exclude,
           v.jitter_s, v.concurrency_key, v.depends_on,
           v.history, v.success_retention_s, v.failure_retention_s
      FROM t JOIN s ON s.job_id = t.job_id JOIN pgsched._job_launch v ON v.job_id = t.job_id
$$;

-- Jobs whose next plan is more than `late` overdue: the scheduler applies their
-- catch-up policy (pgsched/catchup.py) and writes the result with _catch_up_v2. jitter_s: the delay
-- of the plan at next_start (API 2; API 1's _behind, 41_api1.sql, is this without it).
CREATE OR REPLACE FUNCTION pgsched._behind_v2(late interval, max_rows integer, now timestamptz DEFAULT now())
RETURNS TABLE (job_id integer, next_start timestamptz, schedule text, months integer, days integer,
               micros bigint, fixed_schedule boolean, initial_start timestamptz, timezone text, catch_up text,
               catch_up_window_s double precision, max_plans_per_tick integer, schedule_delay_s double precision,
               db_now timestamptz, jitter_s double precision)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT s.job_id, s.next_start, v.schedule, v.months, v.days, v.micros, v.fixed_schedule, v.initial_start,
           v.timezone, v.catch_up, v.catch_up_window_s, v.max_plans_per_tick, v.schedule_delay_s, clock_timestamp(),
           pgsched._jitter_us(s.job_id, s.next_start, s.jitter_us) / 1e6::float8
      FROM pgsched.job_stat s
      JOIN pgsched._job_launch v ON v.job_id = s.job_id
     WHERE s.state = 'scheduled' AND pg_catalog.isfinite(s.next_start)
       AND pgsched._due_at(s.job_id, s.next_start, s.jitter_us) < pg_catalog.timezone('UTC', _behind_v2.now - late)
       -- @restart: its one plan is the server's start, however late; @after: its plans are its
       -- upstreams', as old as their runs are long, and every one runs (07_dependencies.sql)
       AND v.schedule NOT IN ('@restart', '@after')
     ORDER BY pgsched._due_at(s.job_id, s.next_start, s.jitter_us)
     LIMIT max_rows
$$;

-- Write catch-up decisions: per job, move next_start (only if nobody changed or
-- claimed it meanwhile) and record the plans passed over: total_missed, and one
-- 'missed' history row with the range. Returns how many jobs were changed.
CREATE OR REPLACE FUNCTION pgsched._catch_up_v2(decisions jsonb, now timestamptz DEFAULT clock_timestamp())
RETURNS integer LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $$
    WITH d AS (
        SELECT (e->>'job_id')::integer AS job_id, (e->>'old_next')::timestamptz AS old_next,
               (e->>'new_next')::timestamptz AS new_next, (e->>'missed')::integer AS missed,
               (e->>'first')::timestamptz AS first_missed, (e->>'last')::timestamptz AS last_missed,
               e->>'policy' AS policy
          FROM jsonb_array_elements(decisions) e
    ), u AS (
        UPDATE pgsched.job_stat s
           SET next_start = d.new_next, total_missed = s.total_missed + d.missed
          FROM d
         WHERE s.job_id = d.job_id AND s.next_start = d.old_next AND s.state = 'scheduled'
        RETURNING d.*
    ), ins AS (
        INSERT INTO pgsched.job_run_live (job_id, plan_time, trigger, outcome, message, finished_at, result)
        SELECT u.job_id, u.first_missed, 'catch_up', 'missed',
               format('%s plan(s) from %s to %s missed (%s)', u.missed, u.first_missed, u.last_missed, u.policy),
               _catch_up_v2.now,
               jsonb_build_object('first', u.first_missed, 'last', u.last_missed, 'count', u.missed)
          FROM u JOIN pgsched.job j ON j.job_id = u.job_id
         WHERE u.missed > 0 AND pgsched._kept(j.history, 'missed')
        ON CONFLICT ON CONSTRAINT job_run_plan_key DO NOTHING)
    SELECT count(*)::integer FROM u
$$;

-- Of the given runs, those that no longer exist (their job was deleted).
CREATE OR REPLACE FUNCTION pgsched._missing_runs(run_ids bigint[])
RETURNS SETOF bigint LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT id FROM unnest(run_ids) AS id
     WHERE NOT EXISTS (SELECT 1 FROM pgsched.job_run_live r WHERE r.run_id = id AND r.outcome = 'running')
$$;

-- Disable a job the scheduler cannot run (bad schedule or a proc that no longer
-- exists), with the reason shown in job_stats, instead of failing it forever. Returns
-- the job's state after (NULL: no such job). Pausing it moves an idle job to disabled
-- (pgsched._job_row_change); the state is written here too for a job whose flag was
-- already off (a catalog edited by hand), so that it is not handed back every round.
CREATE OR REPLACE FUNCTION pgsched._disable_job_v2(job_id integer, reason text)
RETURNS text LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $$
    -- The job's row before its job_stat row, as alter_job and an upstream's deletion take them.
    SELECT 1 FROM pgsched.job j WHERE j.job_id = _disable_job_v2.job_id FOR NO KEY UPDATE;
    -- The reason before the pause: pausing passes it on to the job's dependents (07_dependencies.sql).
    UPDATE pgsched.job_stat s SET disabled_reason = reason,
           state = CASE WHEN s.state = 'scheduled' THEN 'disabled' ELSE s.state END
     WHERE s.job_id = _disable_job_v2.job_id;
    UPDATE pgsched.job j SET scheduled = false WHERE j.job_id = _disable_job_v2.job_id;
    -- A job_disabled event (README "Events"); no run is involved.
    SELECT pg_catalog.pg_notify('pgsched_events',
                                pgsched._event('job_disabled', j.job_id, NULL, NULL, NULL, NULL))
      FROM pgsched.job j WHERE j.job_id = _disable_job_v2.job_id;
    SELECT s.state FROM pgsched.job_stat s WHERE s.job_id = _disable_job_v2.job_id;
$$;

-- Close a batch of runs in one statement (one round trip): _close_batch. Returns the runs
-- it closed, each with its job's state before and after the close (what the scheduler logs); a
-- run already closed by someone else is left as it is. The batch is tried in one
-- subtransaction; only if that fails is it retried a run at a time, so that a row that cannot
-- be updated (absurd values written into the catalog by hand) closes its run and disables its
-- job with the reason instead of failing every batch. That fallback closes the run through
-- _end_runs too (without the counters): a run's end and its job's state have one writer.
CREATE OR REPLACE FUNCTION pgsched._close_runs(ends jsonb)
RETURNS TABLE (run_id bigint, job_id integer, old_state text, new_state text) LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- Generic plans from the first call, as in _claim_v2: for _close_batch and _end_runs too, which
-- inherit the setting (the main statement of _end_runs was planned five times, 1-2 ms each).
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    e jsonb;
    c record;
    -- Collected, and returned at the end: rows returned before a failed attempt could not be taken back.
    run_ids bigint[] := '{}';
    job_ids integer[] := '{}';
    olds text[] := '{}';
    news text[] := '{}';
    problem text;
    state_now text;
BEGIN
    BEGIN
        FOR c IN SELECT * FROM pgsched._close_batch(ends) LOOP
            run_ids := run_ids || c.run_id; job_ids := job_ids || c.job_id;
            olds := olds || c.old_state; news := news || c.new_state;
        END LOOP;
    EXCEPTION WHEN OTHERS THEN
        run_ids := '{}'; job_ids := '{}'; olds := '{}'; news := '{}';
        FOR e IN SELECT value FROM jsonb_array_elements(ends) LOOP
            BEGIN
                FOR c IN SELECT * FROM pgsched._close_batch(jsonb_build_array(e)) LOOP
                    run_ids := run_ids || c.run_id; job_ids := job_ids || c.job_id;
                    olds := olds || c.old_state; news := news || c.new_state;
                END LOOP;
            EXCEPTION
                -- A moment's conflict with another session (a lock held past lock_timeout, a
                -- deadlock, a serialization failure, a cancel) says nothing of the job's rows:
                -- the whole close fails, and the scheduler writes it again (its runs' ends are
                -- kept). Disabling the job for it stopped a healthy job for good.
                WHEN serialization_failure OR deadlock_detected OR lock_not_available OR query_canceled THEN
                    RAISE;
                WHEN OTHERS THEN
                problem := format('the catalog rows of this job cannot be updated (%s): disabled', SQLERRM);
                -- The row says why the job was disabled: kept, whatever the job's history level.
                FOR c IN SELECT * FROM pgsched._end_runs(jsonb_build_array(e || jsonb_build_object(
                             'disable_reason', problem, 'next_start', NULL, 'rows_affected', NULL, 'result', NULL,
                             'message', left(coalesce(e->>'message' || ' ', '') || '[' || problem || ']', 4000))),
                             counters => false, forget => false) LOOP
                    -- A scope run's close leaves its job alone; the job is paused all the same (a plan
                    -- run's close has paused it already).
                    UPDATE pgsched.job j SET scheduled = false WHERE j.job_id = c.job_id AND j.scheduled;
                    SELECT s.state INTO state_now FROM pgsched.job_stat s WHERE s.job_id = c.job_id;
                    run_ids := run_ids || c.run_id; job_ids := job_ids || c.job_id;
                    olds := olds || c.old_state; news := news || state_now;
                END LOOP;
            END;
        END LOOP;
    END;
    RETURN QUERY SELECT * FROM unnest(run_ids, job_ids, olds, news);
END
$$;

-- _close_runs' batch: the closes (_end_runs, fenced on the lease tokens the scheduler holds),
-- then what some of them bring along, each rare and so done only when asked for: the scope runs
-- a scoped job's plan run queues, the wake-up when queued scope runs became claimable, the
-- skipped-slot record.
CREATE OR REPLACE FUNCTION pgsched._close_batch(ends jsonb)
RETURNS TABLE (run_id bigint, job_id integer, old_state text, new_state text) LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- The closed rows are read by key, in job_run's time partitions by now: as in _end_runs, a plan
-- kept from the session's first closes, while a partition was a few pages, would read all of it.
SET enable_seqscan = off
SET jit = off AS $$
DECLARE
    c record;
    e record;
    closed bigint[] := '{}';
    forgotten bigint[] := '{}';
    scope_jobs integer[] := '{}';  -- the jobs of the scope runs closed
    scope_job integer;
    wake boolean := false;
BEGIN
    FOR c IN SELECT * FROM pgsched._end_runs(ends, forget => false) LOOP
        run_id := c.run_id; job_id := c.job_id; old_state := c.old_state; new_state := c.new_state;
        RETURN NEXT;
        closed := closed || c.run_id;
        IF c.drop_row THEN
            forgotten := forgotten || c.run_id;
        END IF;
        IF c.scope <> '' AND NOT c.job_id = ANY (scope_jobs) THEN
            scope_jobs := scope_jobs || c.job_id;
        END IF;
    END LOOP;
    IF closed = '{}' THEN
        RETURN;
    END IF;
    IF jsonb_path_exists(ends, '$[*] ? (@.scopes.type() == "array" || @.skipped > 0 || @.retry_at.type() == "string")')
    THEN
        FOR e IN SELECT x.run_id, x.scopes, x.skipped, x.skipped_first, x.skipped_last, x.finished_at, x.retry_at,
                        r.job_id, r.scope, r.attempt, r.outcome
                   FROM jsonb_to_recordset(ends) AS x(run_id bigint, scopes jsonb, skipped integer,
                                                      skipped_first timestamptz, skipped_last timestamptz,
                                                      finished_at timestamptz, retry_at timestamptz)
                   JOIN pgsched.job_run r ON r.run_id = x.run_id
                  WHERE x.run_id = ANY (closed)
                  -- A plan run's scopes first: a scope it queues is not then queued again as a retry of
                  -- a scope run of the plan before, closed in the same batch.
                  ORDER BY jsonb_typeof(x.scopes) = 'array' DESC NULLS LAST LOOP
            IF jsonb_typeof(e.scopes) = 'array' THEN
                -- A plan run of a scoped job ends by queuing one run per scope key it found, except
                -- for a scope whose run of an earlier plan is still queued: the queue never grows past
                -- one plan per scope, and the plans passed over are counted as skipped.
                WITH q AS (
                    INSERT INTO pgsched.job_run_live (job_id, scope, plan_time, trigger, outcome)
                    SELECT r.job_id, k.value, r.plan_time, r.trigger, 'queued'
                      FROM pgsched.job_run r, jsonb_array_elements_text(e.scopes) k
                     WHERE r.run_id = e.run_id AND k.value <> ''
                       AND NOT EXISTS (SELECT 1 FROM pgsched.job_run_live o
                                        WHERE o.job_id = r.job_id AND o.scope = k.value AND o.outcome = 'queued')
                    ON CONFLICT ON CONSTRAINT job_run_plan_key DO NOTHING
                    RETURNING 1)
                UPDATE pgsched.job_stat st
                   SET total_skipped = st.total_skipped + jsonb_array_length(e.scopes) - (SELECT count(*) FROM q)
                 WHERE st.job_id = e.job_id;
                wake := true;
            END IF;
            IF e.scope = '' AND coalesce(e.skipped, 0) > 0 THEN
                PERFORM pgsched._record_skipped_v2(e.run_id, e.skipped, e.skipped_first, e.skipped_last, e.finished_at);
            END IF;
            IF e.scope <> '' AND e.retry_at IS NOT NULL AND e.outcome IN ('failure', 'timeout', 'crash') THEN
                -- A scope run that failed, timed out or crashed is queued again for retry_at (its
                -- scheduler's backoff, pgsched.state.scope_retry_at), a run of its own: the next attempt,
                -- due at retry_at, which is its plan time. Not unless it comes before the job's next
                -- plan (which runs the scope anyway), nor for a job paused or disabled, nor when a
                -- later plan queued the scope meanwhile; the queue keeps one run per scope.
                INSERT INTO pgsched.job_run_live (job_id, scope, plan_time, attempt, trigger, outcome)
                SELECT e.job_id, e.scope, e.retry_at, e.attempt + 1, 'retry', 'queued'
                  FROM pgsched.job j
                  JOIN pgsched.job_stat st ON st.job_id = j.job_id
                 WHERE j.job_id = e.job_id AND j.scheduled AND st.state <> 'disabled'
                   AND NOT coalesce(pg_catalog.isfinite(st.next_start)
                                    AND pgsched._delayed(st.next_start, -j.schedule_delay) <= e.retry_at, false)
                   AND NOT EXISTS (SELECT 1 FROM pgsched.job_run_live o
                                    WHERE o.job_id = e.job_id AND o.scope = e.scope AND o.outcome = 'queued')
                ON CONFLICT ON CONSTRAINT job_run_plan_key DO NOTHING;
            END IF;
        END LOOP;
    END IF;
    -- One job at a time: with the array in the test (job_id = ANY), the session planned it again at
    -- every close (0.1 ms, ten times the test's own time), its plan for any array looking dearer
    -- than one for the array at hand. (A batch's scope runs are nearly always of one job.)
    IF NOT wake THEN
        FOREACH scope_job IN ARRAY scope_jobs LOOP
            wake := EXISTS (SELECT 1 FROM pgsched.job_run_live q
                             WHERE q.job_id = scope_job AND q.outcome = 'queued' AND q.plan_time <= now());
            EXIT WHEN wake;
        END LOOP;
    END IF;
    IF wake THEN
        -- Queued scope runs became claimable: wake every scheduler (ours included), not
        -- only the ones that happen to have an idle worker at their next claim.
        PERFORM pg_catalog.pg_notify('pgsched_catalog', 'scopes');
    END IF;
    -- Last: the statements above read the closed rows.
    IF forgotten <> '{}' THEN
        PERFORM pgsched._forget_runs(forgotten);
    END IF;
END
$$;

-- The closed runs' ids: the result of _close_runs as release 0.1.0 reads it.
CREATE OR REPLACE FUNCTION pgsched._finish_runs(ends jsonb)
RETURNS SETOF bigint LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $$
    SELECT c.run_id FROM pgsched._close_runs(ends) c
$$;

-- Terminate the backends still running a run: found by the application_name the
-- worker gave it (pgsched._run_app_name), never by a pid that may have been
-- reused, nor by a name that a later attempt of the same run (a takeover) also has.
CREATE OR REPLACE FUNCTION pgsched._terminate_run_backend(app text)
RETURNS boolean LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(bool_or(pg_catalog.pg_terminate_backend(a.pid)), false)
      FROM pg_catalog.pg_stat_activity a
     WHERE a.application_name = app AND a.pid <> pg_catalog.pg_backend_pid()
$$;