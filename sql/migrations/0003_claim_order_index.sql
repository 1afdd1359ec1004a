-- The claim takes due jobs in (next_start, job_id) order, most overdue first. With an
-- index in exactly that order the scan stops after the few rows it claims, instead of
-- reading and sorting every due job (and joining each to pgsched.job) on every claim.
CREATE INDEX job_stat_due_order_idx ON pgsched.job_stat (next_start, job_id) WHERE state = 'scheduled';
DROP INDEX pgsched.job_stat_due_idx;
