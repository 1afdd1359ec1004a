-- Jobs declared in Python code (@pgsched.job), deployed by `pgsched serve --app`.
--
-- A deploy is one statement (one transaction) under an advisory lock: deploys
-- from several instances serialize, each leaves the catalog consistent, and the
-- last one wins. Code jobs are owned by the deploying role and keyed by
-- (owner, job_name). A deploy writes every setting from the code, so a pause
-- or change made with alter_job lasts until the next deploy. A code job of a
-- deployed module that is no longer in the code is disabled with the reason
-- shown, never deleted (its history stays). A scope_query is planned (checked as
-- add_job checks it) when it is new or changed; an unchanged one is not re-checked, so
-- one job whose query broke does not stop every other job's deploy.

-- All of this file's functions are internal: replaced whole on every upgrade.
SELECT pgsched._drop_functions(ARRAY[
    '_deploy_code_jobs',
    '_renew_lease']);

CREATE OR REPLACE FUNCTION pgsched._deploy_code_jobs(modules text[], specs jsonb)
RETURNS TABLE (job_id integer, job_name text, action text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s jsonb;
    j pgsched.job;
    iv interval;
    id integer;
    new_start timestamptz;
    schedule_changed boolean;
    delay interval;
    is_new boolean;
BEGIN
    -- Any fixed number: the lock only has to be the same for every deploy.
    PERFORM pg_catalog.pg_advisory_xact_lock(7401295311);
    FOR s IN SELECT value FROM jsonb_array_elements(specs) LOOP
        -- Settings a spec leaves out take add_job's defaults.
        s := jsonb_build_object('catch_up_window', NULL, 'max_plans_per_tick', 100, 'schedule_delay', '0',
                                'allow_stale_reentry', false, 'scope_query', NULL) || s;
        SELECT * INTO j FROM pgsched.job
         WHERE job.owner = current_user::regrole AND job.job_name = s->>'job_name'
           FOR UPDATE;
        is_new := NOT FOUND;
        iv := pgsched._check_settings(s->>'schedule', (s->>'fixed_schedule')::boolean, s->>'timezone',
                                      (s->>'max_runtime')::interval, (s->>'max_retries')::integer,
                                      (s->>'retry_period')::interval, s->>'catch_up', s->>'job_name',
                                      (s->>'catch_up_window')::interval, (s->>'max_plans_per_tick')::integer,
                                      (s->>'schedule_delay')::interval, (s->>'allow_stale_reentry')::boolean,
                                      CASE WHEN is_new OR j.scope_query IS DISTINCT FROM s->>'scope_query'
                                           THEN s->>'scope_query' END);
        delay := (s->>'schedule_delay')::interval;
        IF is_new THEN
            INSERT INTO pgsched.job (job_name, kind, code_module, code_function, schedule, fixed_schedule,
                                     initial_start, timezone, config, scheduled, max_runtime, max_retries,
                                     retry_period, catch_up, catch_up_window, max_plans_per_tick, schedule_delay,
                                     allow_stale_reentry, scope_query)
            VALUES (s->>'job_name', 'python', s->>'code_module', s->>'code_function', s->>'schedule',
                    (s->>'fixed_schedule')::boolean, (s->>'initial_start')::timestamptz, s->>'timezone',
                    nullif(s->'config', 'null'), (s->>'scheduled')::boolean, (s->>'max_runtime')::interval,
                    (s->>'max_retries')::integer, (s->>'retry_period')::interval, s->>'catch_up',
                    (s->>'catch_up_window')::interval, (s->>'max_plans_per_tick')::integer, delay,
                    (s->>'allow_stale_reentry')::boolean, s->>'scope_query')
            RETURNING job.job_id INTO id;
            -- next_start is when the first plan becomes eligible: its time + schedule_delay (10_jobs.sql).
            UPDATE pgsched.job_stat st
               SET next_start = pgsched._first_start(s->>'schedule', iv, (s->>'fixed_schedule')::boolean,
                                                     (s->>'initial_start')::timestamptz, s->>'timezone')
                                + pgsched._as_elapsed(delay)
             WHERE st.job_id = id;
            job_id := id; job_name := s->>'job_name'; action := 'inserted';
            RETURN NEXT;
            CONTINUE;
        END IF;
        IF j.kind <> 'python' THEN
            RAISE EXCEPTION USING ERRCODE = '42710',
                MESSAGE = format('invalid job_name: %L is already the name of %s job %s of role %s',
                                 s->>'job_name', j.kind, j.job_id, j.owner),
                HINT = 'give the Python job another name with @pgsched.job(name=...)';
        END IF;
        schedule_changed := j.schedule IS DISTINCT FROM s->>'schedule'
            OR j.fixed_schedule IS DISTINCT FROM (s->>'fixed_schedule')::boolean
            OR j.initial_start IS DISTINCT FROM (s->>'initial_start')::timestamptz
            OR j.timezone IS DISTINCT FROM s->>'timezone';
        IF schedule_changed
           OR (j.code_module, j.code_function, j.config, j.scheduled, j.max_runtime, j.max_retries,
               j.retry_period, j.catch_up, j.catch_up_window, j.max_plans_per_tick, j.schedule_delay,
               j.allow_stale_reentry, j.scope_query)
              IS DISTINCT FROM
              (s->>'code_module', s->>'code_function', nullif(s->'config', 'null'), (s->>'scheduled')::boolean,
               (s->>'max_runtime')::interval, (s->>'max_retries')::integer, (s->>'retry_period')::interval,
               s->>'catch_up', (s->>'catch_up_window')::interval, (s->>'max_plans_per_tick')::integer, delay,
               (s->>'allow_stale_reentry')::boolean, s->>'scope_query')
        THEN
            UPDATE pgsched.job SET
                code_module = s->>'code_module', code_function = s->>'code_function', schedule = s->>'schedule',
                fixed_schedule = (s->>'fixed_schedule')::boolean,
                initial_start = (s->>'initial_start')::timestamptz, timezone = s->>'timezone',
                config = nullif(s->'config', 'null'), scheduled = (s->>'scheduled')::boolean,
                max_runtime = (s->>'max_runtime')::interval, max_retries = (s->>'max_retries')::integer,
                retry_period = (s->>'retry_period')::interval, catch_up = s->>'catch_up',
                catch_up_window = (s->>'catch_up_window')::interval,
                max_plans_per_tick = (s->>'max_plans_per_tick')::integer, schedule_delay = delay,
                allow_stale_reentry = (s->>'allow_stale_reentry')::boolean, scope_query = s->>'scope_query'
             WHERE job.job_id = j.job_id;
            IF schedule_changed THEN
                new_start := pgsched._first_start(s->>'schedule', iv, (s->>'fixed_schedule')::boolean,
                                                  (s->>'initial_start')::timestamptz, s->>'timezone')
                             + pgsched._as_elapsed(delay);
                UPDATE pgsched.job_stat st SET next_start = new_start WHERE st.job_id = j.job_id;
            ELSIF delay <> j.schedule_delay THEN
                -- Same plan, another delay: it becomes eligible (new - old) later (or earlier).
                UPDATE pgsched.job_stat st
                   SET next_start = st.next_start + pgsched._as_elapsed(delay)
                                    - pgsched._as_elapsed(j.schedule_delay)
                 WHERE st.job_id = j.job_id AND st.next_start IS NOT NULL;
            END IF;
            job_id := j.job_id; job_name := j.job_name; action := 'updated';
        ELSE
            job_id := j.job_id; job_name := j.job_name; action := 'unchanged';
        END IF;
        RETURN NEXT;
    END LOOP;

    FOR j IN
        SELECT * FROM pgsched.job
         WHERE job.owner = current_user::regrole AND job.kind = 'python' AND job.code_module = ANY (modules)
           AND job.scheduled
           AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(specs) e WHERE e.value->>'job_name' = job.job_name)
           FOR UPDATE
    LOOP
        UPDATE pgsched.job SET scheduled = false WHERE job.job_id = j.job_id;
        UPDATE pgsched.job_stat st
           SET disabled_reason = format('%s.%s is no longer in the code of module %s (deployed %s)',
                                        j.code_module, j.code_function, j.code_module, now())
         WHERE st.job_id = j.job_id;
        job_id := j.job_id; job_name := j.job_name; action := 'disabled';
        RETURN NEXT;
    END LOOP;
END
$$;

-- Renew a run's lease (run.heartbeat() in a Python job): only while the run is
-- still open and still carries this lease token.
CREATE OR REPLACE FUNCTION pgsched._renew_lease(run_id bigint, lease_token bigint)
RETURNS boolean LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $$
    WITH u AS (
        UPDATE pgsched.job_run r SET heartbeat_at = now()
         WHERE r.run_id = _renew_lease.run_id AND r.lease_token IS NOT DISTINCT FROM _renew_lease.lease_token
           AND r.outcome = 'running'
        RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM u)
$$;
