-- History partitioned by the time a run's row may go (issue 12, README "History and retention").
-- pgsched.job_run becomes a table partitioned by RANGE (keep_until), the instant its row's
-- retention ends, stamped by the close (pgsched._end_runs):
-- * job_run_live, the DEFAULT partition: the table job_run was, attached whole (no row copied, no
--   scan). Its rows have no keep_until: the runs in progress (every claim, heartbeat and close
--   works on this small table), the rows kept in place (a triggered run's and an '@restart'
--   run's, which keep a run from happening twice; the rows a history level drops; a retention
--   that reaches past the partitions made so far) and the rows from before this migration. The
--   purge deletes those in batches, as before (pgsched.purge_history).
-- * job_run_YYYYMMDD_HH24MISS: one per partition_width of keep_until, created ahead and dropped
--   whole once past (pgsched._history_steps): the closed runs' rows, which nothing updates.
-- Rows with different retentions need no separate tables: each lands in the partition of its
-- own end of retention.

-- run_id keeps counting from where it was: a partition may not have an identity column of its
-- own before PostgreSQL 17, so the column takes its numbers from a sequence of the same name.
DO $$
DECLARE
    next_id bigint;
BEGIN
    EXECUTE pg_catalog.format('SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END FROM %s',
                              pg_catalog.pg_get_serial_sequence('pgsched.job_run', 'run_id'))
       INTO next_id;
    ALTER TABLE pgsched.job_run ALTER COLUMN run_id DROP IDENTITY;
    CREATE SEQUENCE pgsched.job_run_run_id_seq;
    PERFORM pg_catalog.setval('pgsched.job_run_run_id_seq', next_id, false);
END
$$;

ALTER TABLE pgsched.job_run RENAME TO job_run_live;
ALTER TABLE pgsched.job_run_live ADD COLUMN keep_until timestamptz;
ALTER TABLE pgsched.job_run_live ALTER COLUMN run_id SET DEFAULT nextval('pgsched.job_run_run_id_seq');

CREATE TABLE pgsched.job_run (LIKE pgsched.job_run_live INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY RANGE (keep_until);
ALTER SEQUENCE pgsched.job_run_run_id_seq OWNED BY pgsched.job_run.run_id;
-- Before the attach, so that job_run_live's own key is taken as the partition's (no validation).
ALTER TABLE pgsched.job_run ADD CONSTRAINT job_run_job_id_fkey
    FOREIGN KEY (job_id) REFERENCES pgsched.job ON DELETE CASCADE;
-- The first partition, and the default: nothing else to check its rows against, so no scan.
ALTER TABLE pgsched.job_run ATTACH PARTITION pgsched.job_run_live DEFAULT;
-- What makes a new time partition's attach skip scanning job_run_live: none of its rows has a
-- keep_until. Validated apart (pgsched._history_steps' 'validate', a lock that lets claims and
-- closes through), not here: on the millions of rows of an upgraded database it is a full read.
ALTER TABLE pgsched.job_run_live ADD CONSTRAINT job_run_live_kept_in_place CHECK (keep_until IS NULL) NOT VALID;

-- The same rights as the table it replaces (0002_security.sql, 0007): read under the job's policy.
ALTER TABLE pgsched.job_run ENABLE ROW LEVEL SECURITY;
CREATE POLICY job_run_read ON pgsched.job_run FOR SELECT USING (job_id IN (SELECT j.job_id FROM pgsched.job j));
GRANT SELECT ON pgsched.job_run TO PUBLIC;

-- The partitions' width (NULL: the default, pgsched._history_policy) and the range of keep_until
-- they cover, [partitions_from, partitions_until): what the close stamps only inside of.
ALTER TABLE pgsched.history_policy
    ADD COLUMN partition_width interval CHECK (partition_width >= interval '1 second'),
    ADD COLUMN partitions_from timestamptz,
    ADD COLUMN partitions_until timestamptz;
