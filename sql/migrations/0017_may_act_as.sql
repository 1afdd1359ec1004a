-- Acting as a job's owner needs the right to SET ROLE to it, not mere membership (docs/security.md).
--
-- A job runs as its owner, so whoever may write a job (its command, proc, config, owner) or
-- start a run of it acts as the owner. 0002_security.sql asked pg_has_role(..., 'MEMBER') for
-- that, which until PostgreSQL 15 meant "may SET ROLE to it". Since PostgreSQL 16 a grant says
-- separately whether the member inherits the role's rights (INHERIT) and whether it may become
-- it (SET), and MEMBER is true for `GRANT r TO m WITH INHERIT FALSE, SET FALSE` (also what
-- CREATEROLE gives its creator by default), a grant made to keep m from acting as r: m could
-- write a job of r's, which the scheduler then ran as r. PostgreSQL's own rule for making an
-- object someone else's (ALTER ... OWNER TO, since 16) is SET, and so is pgsched's now.
--
-- pgsched._may_act_as is that rule, once: the write policies below, pgsched._catalog_admin (the
-- catalog's owner: Python jobs, concurrency limits, retention) and the rights checks of run_job,
-- trigger_job and cancel_job (sql/api/20_runs.sql) all ask it. It lives here, not in sql/api/,
-- because the policies made here depend on it (as on _catalog_admin: migrate._drop_leftovers).
-- Seeing a job (job_read, _may_see) is unchanged: membership, or that of the database owner.
--
-- PostgreSQL 15 rejects the privilege 'SET' ("unrecognized privilege type"), and there MEMBER
-- already implies SET: so the server's version decides, when the function runs and not when it
-- is created, so that a cluster pg_upgrade'd from 15 to 16 asks SET from its first query on.
-- CASE evaluates only the branch it takes, and pg_has_role reads its privilege text only when
-- called (it is STABLE, so the planner never calls it early), so 15 never sees 'SET'. The
-- SET clause keeps the function from being inlined into the policies, so it is called as
-- written.
CREATE FUNCTION pgsched._may_act_as(member name, owner oid) RETURNS boolean LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN pg_catalog.current_setting('server_version_num')::integer >= 160000
                THEN pg_catalog.pg_has_role(_may_act_as.member, _may_act_as.owner, 'SET')
                ELSE pg_catalog.pg_has_role(_may_act_as.member, _may_act_as.owner, 'MEMBER') END
$$;

-- The catalog's administrators: those who may act as the catalog's owner (the scheduler's role)
-- and have its rights: the functions this admits them to (set_concurrency_limit, set_retention,
-- purge_history) run with the caller's rights and write tables only the owner may.
CREATE OR REPLACE FUNCTION pgsched._catalog_admin() RETURNS boolean LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT pgsched._may_act_as(current_user, o.owner) AND pg_catalog.pg_has_role(current_user, o.owner, 'USAGE')
      FROM (SELECT c.relowner AS owner FROM pg_catalog.pg_class c
             WHERE c.oid = 'pgsched.job'::pg_catalog.regclass) o
$$;

-- The same policies as 0002_security.sql, with the rule above. A new owner (an INSERT, or an
-- UPDATE of owner) is checked by WITH CHECK: the default owner is current_user, whom one may
-- always act as; any other must pass the same test.
ALTER POLICY job_insert ON pgsched.job
    WITH CHECK (pgsched._may_act_as(current_user, owner) AND (kind <> 'python' OR pgsched._catalog_admin()));
ALTER POLICY job_update ON pgsched.job
    USING (pgsched._may_act_as(current_user, owner))
    WITH CHECK (pgsched._may_act_as(current_user, owner) AND (kind <> 'python' OR pgsched._catalog_admin()));
ALTER POLICY job_delete ON pgsched.job
    USING (pgsched._may_act_as(current_user, owner));
ALTER POLICY job_stat_update ON pgsched.job_stat
    USING (EXISTS (SELECT 1 FROM pgsched.job j
                    WHERE j.job_id = job_stat.job_id AND pgsched._may_act_as(current_user, j.owner)))
    WITH CHECK (EXISTS (SELECT 1 FROM pgsched.job j
                         WHERE j.job_id = job_stat.job_id AND pgsched._may_act_as(current_user, j.owner)));
