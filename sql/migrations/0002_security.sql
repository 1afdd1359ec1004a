-- Who may see and change which rows (docs/security.md).
--
-- The role that runs `pgsched init` owns the schema and its tables, and a table's
-- owner is not subject to its row-level security: that role is the scheduler's,
-- and sees and writes everything. Every other role sees the jobs of the roles it
-- is a member of (its own included) and, if it is a member of the database
-- owner, all jobs; it may change only the jobs of roles it is a member of. A job
-- runs as its owner, so writing a job of a role you cannot become would be a way
-- to become it: the database owner therefore only reads others' jobs.
--
-- job_stat and job_run follow their job. Other roles do not write them
-- directly, except job_stat.next_start of their own jobs (what alter_job's
-- next_start sets); a run is started and closed by the scheduler or, for
-- run_job, by two SECURITY DEFINER functions that only touch the caller's own
-- manual run (sql/api/20_runs.sql).
--
-- Grants go to PUBLIC: schema USAGE is the one switch. A deployment that wants
-- only some roles to have jobs revokes it (REVOKE USAGE ON SCHEMA pgsched FROM
-- PUBLIC) and grants it to them; later upgrades leave that choice alone.
-- EXECUTE on functions is managed by sql/api/95_grants.sql, re-applied with the
-- functions.

ALTER TABLE pgsched.job ENABLE ROW LEVEL SECURITY;
ALTER TABLE pgsched.job_stat ENABLE ROW LEVEL SECURITY;
ALTER TABLE pgsched.job_run ENABLE ROW LEVEL SECURITY;

CREATE POLICY job_read ON pgsched.job FOR SELECT
    USING (pg_catalog.pg_has_role(current_user, owner, 'MEMBER')
           OR pg_catalog.pg_has_role(current_user, (SELECT d.datdba FROM pg_catalog.pg_database d
                                                     WHERE d.datname = pg_catalog.current_database()), 'MEMBER'));
-- Python jobs name application code that the scheduler's workers import: only the
-- scheduler's role (the catalog's owner) and its members deploy or change them.
CREATE FUNCTION pgsched._catalog_admin() RETURNS boolean LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT pg_catalog.pg_has_role(current_user, (SELECT c.relowner FROM pg_catalog.pg_class c
                                                 WHERE c.oid = 'pgsched.job'::pg_catalog.regclass), 'MEMBER')
$$;
CREATE POLICY job_insert ON pgsched.job FOR INSERT
    WITH CHECK (pg_catalog.pg_has_role(current_user, owner, 'MEMBER') AND (kind <> 'python' OR pgsched._catalog_admin()));
CREATE POLICY job_update ON pgsched.job FOR UPDATE
    USING (pg_catalog.pg_has_role(current_user, owner, 'MEMBER'))
    WITH CHECK (pg_catalog.pg_has_role(current_user, owner, 'MEMBER') AND (kind <> 'python' OR pgsched._catalog_admin()));
CREATE POLICY job_delete ON pgsched.job FOR DELETE
    USING (pg_catalog.pg_has_role(current_user, owner, 'MEMBER'));

-- The job's own policies apply inside these subqueries too; the owner test is
-- spelled out anyway so each policy reads on its own.
CREATE POLICY job_stat_read ON pgsched.job_stat FOR SELECT
    USING (EXISTS (SELECT 1 FROM pgsched.job j WHERE j.job_id = job_stat.job_id));
CREATE POLICY job_stat_update ON pgsched.job_stat FOR UPDATE
    USING (EXISTS (SELECT 1 FROM pgsched.job j
                    WHERE j.job_id = job_stat.job_id AND pg_catalog.pg_has_role(current_user, j.owner, 'MEMBER')))
    WITH CHECK (EXISTS (SELECT 1 FROM pgsched.job j
                         WHERE j.job_id = job_stat.job_id
                           AND pg_catalog.pg_has_role(current_user, j.owner, 'MEMBER')));
CREATE POLICY job_run_read ON pgsched.job_run FOR SELECT
    USING (EXISTS (SELECT 1 FROM pgsched.job j WHERE j.job_id = job_run.job_id));

GRANT USAGE ON SCHEMA pgsched TO PUBLIC;
GRANT SELECT, INSERT, UPDATE, DELETE ON pgsched.job TO PUBLIC;
GRANT SELECT ON pgsched.job_stat, pgsched.job_run, pgsched.instance, pgsched.migration, pgsched.api_state
    TO PUBLIC;
GRANT UPDATE (next_start) ON pgsched.job_stat TO PUBLIC;

DO $$
BEGIN
    EXECUTE format('GRANT USAGE ON SEQUENCE %s TO PUBLIC', pg_catalog.pg_get_serial_sequence('pgsched.job', 'job_id'));
END
$$;
