-- Scoped (sharded) jobs: a job may name a query (scope_query) returning scope keys.
-- Each plan of such a job is first fanned out: its plan run (scope '') runs the query
-- as the job's owner and queues one run per key, (job, scope, plan_time), which any
-- scheduler then claims with its own lease, as capacity allows. A queued run has not
-- started: outcome 'queued', no lease.
ALTER TABLE pgsched.job ADD COLUMN scope_query text;

ALTER TABLE pgsched.job_run DROP CONSTRAINT job_run_outcome_check;
ALTER TABLE pgsched.job_run ADD CONSTRAINT job_run_outcome_check
    CHECK (outcome IN ('queued', 'running', 'success', 'failure', 'timeout', 'crash', 'skipped', 'missed',
                       'cancelled'));

-- The claim's question about scope runs: which are queued, oldest plan first.
CREATE INDEX job_run_queued_idx ON pgsched.job_run (plan_time, run_id) WHERE outcome = 'queued';
