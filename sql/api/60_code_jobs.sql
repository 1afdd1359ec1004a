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

-- A spec is one job's settings by name (pgsched.job_settings: those it leaves out take
-- add_job's defaults) plus code_module and code_function, where its handler is.
CREATE OR REPLACE FUNCTION pgsched._deploy_code_jobs(modules text[], specs jsonb)
RETURNS TABLE (job_id integer, job_name text, action text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    spec jsonb;
    j pgsched.job;
    old pgsched.job_settings;
    s pgsched.job_settings;
    iv interval;
    id integer;
    gone text;
BEGIN
    -- Any fixed number: the lock only has to be the same for every deploy.
    PERFORM pg_catalog.pg_advisory_xact_lock(7401295311);
    FOR spec IN SELECT value FROM jsonb_array_elements(specs) LOOP
        -- depends_on names jobs (@pgsched.job(after=...)): the code orders its specs upstreams first, so
        -- that each resolves to a job of this deploy or one that exists.
        IF jsonb_typeof(spec->'depends_on') = 'array' THEN
            spec := spec || jsonb_build_object('depends_on', to_jsonb(pgsched._resolve_upstreams(
                ARRAY(SELECT jsonb_array_elements_text(spec->'depends_on')), current_user::regrole)));
        END IF;
        s := pgsched._settings(pgsched._settings_defaults(), spec - 'code_module' - 'code_function');
        SELECT * INTO j FROM pgsched.job
         WHERE job.owner = current_user::regrole AND job.job_name = s.job_name
           FOR NO KEY UPDATE;
        IF NOT FOUND THEN
            iv := pgsched._check_settings(s);
            id := pgsched._store_new_job(kind => 'python', proc_schema => NULL, proc_name => NULL, command => NULL,
                                         code_module => spec->>'code_module',
                                         code_function => spec->>'code_function', check_schema => NULL,
                                         check_name => NULL, s => s, iv => iv);
            job_id := id; job_name := s.job_name; action := 'inserted';
            RETURN NEXT;
            CONTINUE;
        END IF;
        old := pgsched._job_settings(j);
        iv := pgsched._check_settings(s, check_scope => s.scope_query IS DISTINCT FROM old.scope_query,
                                      check_database => s.database IS DISTINCT FROM old.database,
                                      check_period => s.schedule IS DISTINCT FROM old.schedule);
        IF j.kind <> 'python' THEN
            RAISE EXCEPTION USING ERRCODE = '42710',
                MESSAGE = format('invalid job_name: %L is already the name of %s job %s of role %s',
                                 s.job_name, j.kind, j.job_id, j.owner),
                HINT = 'give the Python job another name with @pgsched.job(name=...)';
        END IF;
        IF (j.code_module, j.code_function, old) IS DISTINCT FROM (spec->>'code_module', spec->>'code_function', s)
        THEN
            UPDATE pgsched.job SET code_module = spec->>'code_module', code_function = spec->>'code_function'
             WHERE job.job_id = j.job_id;
            PERFORM pgsched._store_settings(j.job_id, s);
            PERFORM pgsched._replan(j.job_id, old, s, iv);
            job_id := j.job_id; job_name := j.job_name; action := 'updated';
        ELSE
            job_id := j.job_id; job_name := j.job_name; action := 'unchanged';
        END IF;
        RETURN NEXT;
    END LOOP;

    -- A job of these modules no longer in the code is disabled with the reason; one paused already
    -- (alter_job, its upstream disabled, max_retries) is given the reason too, once, keeping what it
    -- said before, so that job_stats.disabled_reason says why it will not come back.
    FOR j IN
        SELECT job.* FROM pgsched.job JOIN pgsched.job_stat st ON st.job_id = job.job_id
         WHERE job.owner = current_user::regrole AND job.kind = 'python' AND job.code_module = ANY (modules)
           AND (job.scheduled OR st.disabled_reason IS NULL
                OR NOT pg_catalog.starts_with(st.disabled_reason, format('%s.%s is no longer in the code of module ',
                                                                         job.code_module, job.code_function)))
           AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(specs) e WHERE e.value->>'job_name' = job.job_name)
           FOR NO KEY UPDATE OF job
    LOOP
        SELECT st.disabled_reason INTO gone FROM pgsched.job_stat st WHERE st.job_id = j.job_id;
        -- The reason first: pausing it passes the reason on to its dependents (07_dependencies.sql).
        UPDATE pgsched.job_stat st
           SET disabled_reason = format('%s.%s is no longer in the code of module %s (deployed %s)%s',
                                        j.code_module, j.code_function, j.code_module, now(),
                                        CASE WHEN NOT j.scheduled
                                             THEN format('; it was paused before: %s', coalesce(gone, 'paused'))
                                        END)
         WHERE st.job_id = j.job_id;
        IF j.scheduled THEN
            UPDATE pgsched.job SET scheduled = false WHERE job.job_id = j.job_id;
            PERFORM pg_catalog.pg_notify('pgsched_events',
                                         pgsched._event('job_disabled', j.job_id, NULL, NULL, NULL, NULL));
        END IF;
        job_id := j.job_id; job_name := j.job_name; action := 'disabled';
        RETURN NEXT;
    END LOOP;

    -- The same jobs deployed before by another role (`serve` run as another user once): keyed by
    -- owner, they are other jobs, and every instance with the module would run both, each plan
    -- twice, one as that role. The last deploy wins: those still scheduled are paused, with the
    -- reason. (The catalog's administrators deploy, and may act as any job's owner.)
    FOR j IN
        SELECT job.* FROM pgsched.job
         WHERE job.owner <> current_user::regrole AND job.kind = 'python' AND job.code_module = ANY (modules)
           AND job.scheduled
           AND EXISTS (SELECT 1 FROM jsonb_array_elements(specs) e WHERE e.value->>'job_name' = job.job_name)
           FOR NO KEY UPDATE OF job
    LOOP
        UPDATE pgsched.job_stat st
           SET disabled_reason = format('superseded by the job %s of the same name that role %s deployed (%s)',
                                        (SELECT x.job_id FROM pgsched.job x
                                          WHERE x.owner = current_user::regrole AND x.job_name = j.job_name),
                                        current_user, now())
         WHERE st.job_id = j.job_id;
        UPDATE pgsched.job SET scheduled = false WHERE job.job_id = j.job_id;
        PERFORM pg_catalog.pg_notify('pgsched_events',
                                     pgsched._event('job_disabled', j.job_id, NULL, NULL, NULL, NULL));
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
        UPDATE pgsched.job_run_live r SET heartbeat_at = now()
         WHERE r.run_id = _renew_lease.run_id AND r.lease_token IS NOT DISTINCT FROM _renew_lease.lease_token
           AND r.outcome = 'running'
        RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM u)
$$;
