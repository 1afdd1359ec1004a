-- pg_cron's SQL interface over pgsched's catalog: the schema `cron` with pg_cron 1.4's
-- functions (schedule in two forms, unschedule in two forms, alter_job, schedule_in_database)
-- and its two tables as views (job, job_run_details), so that SQL written for pg_cron runs
-- unchanged. Installed only on request (`pgsched init --pg-cron-compat`, pgsched/compat.py),
-- never beside the pg_cron extension itself, and re-applied by every later init while the
-- schema carries the marker comment set at its end.
--
-- Nothing here is a second definition: each function checks pg_cron's own rules (who may
-- change which job, which database) and then calls pgsched's API (pgsched.schedule,
-- pgsched.alter_job, pgsched.unschedule), which checks the settings and writes the catalog.
-- Everything is SECURITY INVOKER: row-level security on pgsched.job decides what a role may
-- change, as it does for pgsched's own API.
--
-- pg_cron's permission rules: a role sees and changes its own jobs (cron.job shows those);
-- a superuser sees and changes every job and is the only one who may schedule a job for
-- another role (username) or move a job to another owner.
--
-- Which jobs are pg_cron's: jobs of kind 'command' (SQL text). proc and Python jobs are
-- pgsched's own; they are in pgsched.jobs, not here. An unnamed job (cron.schedule(schedule,
-- command)) gets pgsched's generated name 'command [<id>]', shown here as NULL as pg_cron does.

CREATE SCHEMA IF NOT EXISTS cron;

-- Whether the current role is a superuser (pg_cron's test for "may act for others").
CREATE OR REPLACE FUNCTION cron._is_superuser()
RETURNS boolean LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce((SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user), false)
$$;

-- The name cron.job shows for a job: NULL for the name pgsched generated for an unnamed one.
CREATE OR REPLACE FUNCTION cron._job_name(job_name text, job_id integer)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN job_name = pg_catalog.format('command [%s]', job_id) THEN NULL ELSE job_name END
$$;

CREATE OR REPLACE VIEW cron.job WITH (security_invoker = true) AS
SELECT j.job_id::bigint AS jobid, j.schedule, j.command,
       'localhost'::text AS nodename, pg_catalog.current_setting('port')::integer AS nodeport,
       coalesce(j.database, pg_catalog.current_database()::text) AS database,
       pg_catalog.pg_get_userbyid(j.owner)::text AS username, j.scheduled AS active,
       cron._job_name(j.job_name, j.job_id) AS jobname
  FROM pgsched.job j
 WHERE j.kind = 'command' AND (j.owner = current_user::regrole OR cron._is_superuser());

-- pg_cron's statuses: starting, running, sending, connecting, succeeded, failed. pgsched's
-- other outcomes (timeout, crash, skipped, missed, cancelled) are failures here, their
-- outcome named in return_message.
CREATE OR REPLACE VIEW cron.job_run_details WITH (security_invoker = true) AS
SELECT r.job_id::bigint AS jobid, r.run_id AS runid, r.backend_pid AS job_pid,
       coalesce(j.database, pg_catalog.current_database()::text) AS database,
       pg_catalog.pg_get_userbyid(j.owner)::text AS username, j.command,
       CASE r.outcome WHEN 'running' THEN 'running' WHEN 'queued' THEN 'starting'
                      WHEN 'success' THEN 'succeeded' ELSE 'failed' END AS status,
       CASE WHEN r.outcome IN ('success', 'failure', 'running', 'queued') THEN r.message
            ELSE r.outcome || coalesce(': ' || r.message, '') END AS return_message,
       r.started_at AS start_time, r.finished_at AS end_time
  FROM pgsched.job_run r
  JOIN pgsched.job j ON j.job_id = r.job_id
 WHERE j.kind = 'command' AND (j.owner = current_user::regrole OR cron._is_superuser());

-- A job's database is checked as pg_cron does by pgsched._check_database (00_internal.sql);
-- the wrapper that stood here once added a restriction and is gone.
DROP FUNCTION IF EXISTS cron._check_database(text, regrole);

-- The owner a call names, as pg_cron resolves it: NULL is the current role; another role only
-- for a superuser (ERROR as pg_cron's: "permission denied for function <fn>").
CREATE OR REPLACE FUNCTION cron._target_owner(username text, fn text)
RETURNS regrole LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    target regrole;
BEGIN
    IF username IS NULL THEN
        RETURN current_user::regrole;
    END IF;
    -- The role's name as given (pg_cron compares names, not identifiers): no quoting rules.
    -- Permission first, as pg_cron: a non-superuser learns nothing about other roles.
    IF username <> current_user AND NOT cron._is_superuser() THEN
        RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = format('permission denied for function %s', fn),
            HINT = 'only a superuser schedules a job for another role';
    END IF;
    SELECT r.oid::regrole INTO target FROM pg_catalog.pg_roles r WHERE r.rolname = username;
    IF target IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '42704', MESSAGE = format('role "%s" does not exist', username);
    END IF;
    RETURN target;
END
$$;

-- Run `body` (a pgsched API call) as `owner`: a superuser scheduling for another role creates
-- the job as that role, so pgsched's own checks (LOGIN, unique name per owner, row-level
-- security) see the job's real owner. SET LOCAL ROLE lasts to the end of the transaction,
-- so the previous role is restored here; an error rolls the whole statement back, role included.
CREATE OR REPLACE FUNCTION cron._as_owner(owner regrole, body text, args text[])
RETURNS bigint LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    previous constant text := pg_catalog.current_setting('role');
    result bigint;
BEGIN
    IF owner <> current_user::regrole THEN
        PERFORM pg_catalog.set_config('role', pg_catalog.pg_get_userbyid(owner), true);
    END IF;
    EXECUTE body INTO result USING args[1], args[2], args[3];
    PERFORM pg_catalog.set_config('role', previous, true);
    RETURN result;
END
$$;

-- schedule and unschedule are STRICT, as pg_cron's: a NULL argument gives NULL and does nothing
-- (cron.unschedule((SELECT jobid FROM cron.job WHERE jobname = 'gone')) is the usual idempotent call).
CREATE OR REPLACE FUNCTION cron.schedule(schedule text, command text)
RETURNS bigint LANGUAGE sql STRICT
SET search_path = pg_catalog, pg_temp AS $$
    SELECT pgsched.schedule(schedule => schedule, command => command)
$$;

-- pg_cron's functions act on pg_cron's jobs, the command jobs cron.job shows: the caller's job
-- named `job_name` of another kind (a procedure's, a Python job) is not theirs to change or delete.
-- Its id, or NULL.
CREATE OR REPLACE FUNCTION cron._other_kind(job_name text, owner regrole DEFAULT current_user::regrole)
RETURNS integer LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT j.job_id FROM pgsched.job j
     WHERE j.owner = _other_kind.owner AND j.job_name = _other_kind.job_name AND j.kind <> 'command'
$$;

-- The refusal of a name another kind of job has (cron.schedule, cron.schedule_in_database).
CREATE OR REPLACE FUNCTION cron._check_name_free(job_name text, owner regrole DEFAULT current_user::regrole)
RETURNS void LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    other constant integer := cron._other_kind(job_name, owner);
BEGIN
    IF other IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '42710',
            MESSAGE = format('invalid job_name: %L is the name of pgsched job %s of role %I, which is not a '
                             'pg_cron command job', job_name, other, owner),
            HINT = 'give the pg_cron job another name';
    END IF;
END
$$;

-- The same name again (for the same role) updates that job: pgsched.schedule does that.
CREATE OR REPLACE FUNCTION cron.schedule(job_name text, schedule text, command text)
RETURNS bigint LANGUAGE plpgsql STRICT
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM cron._check_name_free(job_name);
    RETURN pgsched.schedule(job_name => job_name, schedule => schedule, command => command);
END
$$;

CREATE OR REPLACE FUNCTION cron.schedule_in_database(job_name text, schedule text, command text, database text,
                                                     username text DEFAULT NULL, active boolean DEFAULT true)
RETURNS bigint LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    owner regrole;
    id bigint;
BEGIN
    IF database IS NULL THEN
        PERFORM pgsched._bad_arg('database', 'NULL', 'the name of a database', '22004');
    END IF;
    owner := cron._target_owner(username, 'schedule_in_database');
    PERFORM pgsched._check_database(database, owner);
    PERFORM cron._check_name_free(job_name, owner);
    id := cron._as_owner(owner, 'SELECT pgsched.schedule(job_name => $1, schedule => $2, command => $3)',
                         ARRAY[job_name, schedule, command]);
    PERFORM pgsched.alter_job(id::integer, database => database, scheduled => active);
    RETURN id;
END
$$;

CREATE OR REPLACE FUNCTION cron.unschedule(job_id bigint)
RETURNS boolean LANGUAGE plpgsql STRICT
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM cron._own_job(job_id);
    RETURN pgsched.unschedule(job_id);
END
$$;

CREATE OR REPLACE FUNCTION cron.unschedule(job_name text)
RETURNS boolean LANGUAGE plpgsql STRICT
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF cron._other_kind(job_name) IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '42704',
            MESSAGE = format('job named %L not found for role %I among its pg_cron jobs', job_name, current_user),
            HINT = 'job_name must name one of your jobs in cron.job';
    END IF;
    RETURN pgsched.unschedule(job_name => job_name);
END
$$;

-- The pg_cron job `job_id` if the caller may change it (its own, or any for a superuser),
-- locked; otherwise pg_cron's error.
CREATE OR REPLACE FUNCTION cron._own_job(job_id bigint)
RETURNS pgsched.job LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    j pgsched.job;
BEGIN
    IF job_id IS NULL THEN
        PERFORM pgsched._bad_arg('job_id', 'NULL', 'the id of one of your jobs (see cron.job)', '22004');
    END IF;
    SELECT * INTO j FROM pgsched.job x
     WHERE x.job_id = _own_job.job_id AND x.kind = 'command'
       AND (x.owner = current_user::regrole OR cron._is_superuser())
       FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = '42704',
            MESSAGE = format('Job %s does not exist or you don''t own it', job_id),
            HINT = 'job_id must be the id of one of your jobs (see cron.job)';
    END IF;
    RETURN j;
END
$$;

-- Give a job another owner (a superuser's cron.alter_job(username => ...)): the new owner must
-- be able to log in (it runs as that role) and have no other job of that name.
CREATE OR REPLACE FUNCTION cron._set_owner(job_id integer, owner regrole)
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    name text;
BEGIN
    IF NOT coalesce((SELECT r.rolcanlogin FROM pg_catalog.pg_roles r WHERE r.oid = owner), false) THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = format('role %s cannot own a job: it has no LOGIN', owner),
            HINT = 'pgsched runs every job in a session opened as its owner';
    END IF;
    SELECT j.job_name INTO name FROM pgsched.job j WHERE j.job_id = _set_owner.job_id;
    IF EXISTS (SELECT 1 FROM pgsched.job o WHERE o.owner = _set_owner.owner AND o.job_name = name) THEN
        RAISE EXCEPTION USING ERRCODE = '42710',
            MESSAGE = format('invalid username: role %s already has a job named %L', owner, name),
            HINT = 'job names are unique per user: rename or unschedule one of them first';
    END IF;
    UPDATE pgsched.job j SET owner = _set_owner.owner WHERE j.job_id = _set_owner.job_id;
END
$$;

CREATE OR REPLACE FUNCTION cron.alter_job(job_id bigint, schedule text DEFAULT NULL, command text DEFAULT NULL,
                                          database text DEFAULT NULL, username text DEFAULT NULL,
                                          active boolean DEFAULT NULL)
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    j pgsched.job;
    owner regrole;
BEGIN
    IF schedule IS NULL AND command IS NULL AND database IS NULL AND username IS NULL AND active IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'no updates specified',
            HINT = 'You must specify at least one job attribute to change when calling alter_job';
    END IF;
    j := cron._own_job(job_id);
    owner := j.owner;
    IF username IS NOT NULL THEN
        IF NOT cron._is_superuser() THEN
            RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = 'must be superuser to alter username';
        END IF;
        owner := cron._target_owner(username, 'alter_job');
    END IF;
    IF database IS NOT NULL OR owner <> j.owner THEN
        PERFORM pgsched._check_database(coalesce(database, j.database, pg_catalog.current_database()), owner);
    END IF;
    IF command IS NOT NULL AND btrim(command) = '' THEN
        PERFORM pgsched._bad_arg('command', quote_literal(command), 'non-empty SQL text');
    END IF;
    -- The checks are done; each change below is pgsched's own (an error in any of them rolls
    -- the whole call back).
    IF schedule IS NOT NULL OR active IS NOT NULL THEN
        -- pg_cron's schedule is the whole schedule: fixed, no origin, UTC (as pgsched.schedule sets it).
        PERFORM pgsched.alter_job(j.job_id, schedule => schedule, scheduled => active,
                                  fixed_schedule => CASE WHEN schedule IS NOT NULL THEN true END);
    END IF;
    IF command IS NOT NULL THEN
        UPDATE pgsched.job x SET command = alter_job.command WHERE x.job_id = j.job_id;
    END IF;
    -- The owner first: the database is then checked for the role the job will run as.
    IF owner <> j.owner THEN
        PERFORM cron._set_owner(j.job_id, owner);
    END IF;
    IF database IS NOT NULL THEN
        PERFORM pgsched.alter_job(j.job_id, database => database);
    END IF;
END
$$;

-- pg_cron lets each user delete its own rows of cron.job_run_details: the cleanup its README
-- suggests scheduling (DELETE FROM cron.job_run_details WHERE end_time < now() - interval '7 days').
-- Here the rows are pgsched's history (which its retention purges anyway): deleting one through the
-- view deletes that run, if it has ended and its job is one the session's role may act for
-- (pgsched._session_may_act: its owner, a role that may SET ROLE to it; a superuser). A row that keeps
-- a run from happening twice (pgsched._kept_in_place: a run trigger_job started on a scheduler, an
-- @restart job's run) stays for the purge and is not counted as deleted.
CREATE OR REPLACE FUNCTION cron._forget_run(run_id bigint)
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    job_owner oid;
BEGIN
    SELECT j.owner INTO job_owner FROM pgsched.job_run r JOIN pgsched.job j ON j.job_id = r.job_id
     WHERE r.run_id = _forget_run.run_id AND j.kind = 'command';
    -- Anyone may call this: a run of a job the session may not act for is as one that is not there
    -- (false, no error that would tell it apart). A superuser's cleanup also takes the runs of a
    -- job whose owner was dropped.
    IF job_owner IS NULL
       OR NOT (coalesce((SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = session_user), false)
               OR pgsched._session_may_act(job_owner)) THEN
        RETURN false;
    END IF;
    DELETE FROM pgsched.job_run r USING pgsched.job j
     WHERE r.run_id = _forget_run.run_id AND j.job_id = r.job_id AND r.outcome NOT IN ('running', 'queued')
       AND NOT pgsched._kept_in_place(r.trigger, r.instance_id, j.schedule, r.scope);
    RETURN FOUND;
END
$$;

CREATE OR REPLACE FUNCTION cron._delete_run_details()
RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN CASE WHEN cron._forget_run(OLD.runid) THEN OLD END;
END
$$;

-- The first time (a new schema, or one from before this trigger): DELETE for every role, as
-- pg_cron grants it; a later REVOKE stays.
DO $delete$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger
                    WHERE tgrelid = 'cron.job_run_details'::regclass AND tgname = 'job_run_details_delete') THEN
        GRANT DELETE ON cron.job_run_details TO PUBLIC;
    END IF;
END
$delete$;
CREATE OR REPLACE TRIGGER job_run_details_delete INSTEAD OF DELETE ON cron.job_run_details
    FOR EACH ROW EXECUTE FUNCTION cron._delete_run_details();

-- Who may use it: like pgsched's own API, every role (row-level security and the checks above
-- decide the rest). Granted when the schema is created only, so a later REVOKE stays.
DO $grants$
BEGIN
    IF obj_description('cron'::regnamespace, 'pg_namespace') IS DISTINCT FROM 'pgsched pg_cron compatibility' THEN
        GRANT USAGE ON SCHEMA cron TO PUBLIC;
        GRANT SELECT ON cron.job, cron.job_run_details TO PUBLIC;
    END IF;
END
$grants$;

COMMENT ON SCHEMA cron IS 'pgsched pg_cron compatibility';
