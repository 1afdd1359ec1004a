-- Jitter (issue 14): each planned start of a job is delayed by a pseudo-random amount in
-- [0, jitter), derived from the job and the plan, so that every instance computes the same one
-- and nothing needs storing before the claim (README "Jitter"). 0: none.
ALTER TABLE pgsched.job ADD COLUMN jitter interval NOT NULL DEFAULT interval '0';

-- The job's jitter in microseconds, copied beside next_start by the job's trigger (as priority
-- is, 0008), where the indexes below read it.
ALTER TABLE pgsched.job_stat ADD COLUMN jitter_us bigint NOT NULL DEFAULT 0;

-- What a run's start was delayed by (NULL: its job has no jitter). Its plan_time stays the
-- planned instant; it became eligible at plan_time + schedule_delay + jitter.
ALTER TABLE pgsched.job_run ADD COLUMN jitter interval;

-- The rule, once: the delay of the plan that becomes eligible at next_start (its plan time +
-- schedule_delay, a fixed offset per job), in [0, jitter_us) microseconds. hashint8extended is
-- the hash PostgreSQL's hash partitioning relies on, so it is the same on every server and
-- platform. IMMUTABLE and inlinable (every step is), so that indexes can hold it.
CREATE FUNCTION pgsched._jitter_us(job_id integer, next_start timestamptz, jitter_us bigint)
RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN jitter_us > 0 AND pg_catalog.isfinite(next_start)
            THEN (pg_catalog.hashint8extended(
                      (extract(epoch FROM pg_catalog.timezone('UTC', next_start)) * 1000000)::bigint, job_id)
                  & 9223372036854775807) % jitter_us
            ELSE 0 END;

-- When the plan may start, jitter included, in UTC wall time (timestamp without time zone, so
-- every step is IMMUTABLE: see _claim_key in 0008).
CREATE FUNCTION pgsched._due_at(job_id integer, next_start timestamptz, jitter_us bigint)
RETURNS timestamp LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN pg_catalog.timezone('UTC', next_start)
       + pgsched._jitter_us(job_id, next_start, jitter_us) * interval '1 microsecond';

-- The claim's order: 0008's key (due instant less the priority in seconds), the due instant
-- now with jitter.
CREATE FUNCTION pgsched._start_key(job_id integer, next_start timestamptz, jitter_us bigint, priority integer)
RETURNS timestamp LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN pgsched._due_at(job_id, next_start, jitter_us) - pg_catalog.make_interval(secs => priority);

CREATE INDEX job_stat_start_order_idx ON pgsched.job_stat
    (pgsched._start_key(job_id, next_start, jitter_us, priority), job_id) WHERE state = 'scheduled';
DROP INDEX pgsched.job_stat_claim_order_idx;
DROP FUNCTION pgsched._claim_key(timestamptz, integer);

-- When the next job is due (the scheduler's sleep) and which are behind: 0003's order, jitter
-- included.
CREATE INDEX job_stat_due_at_idx ON pgsched.job_stat
    (pgsched._due_at(job_id, next_start, jitter_us), job_id) WHERE state = 'scheduled';
DROP INDEX pgsched.job_stat_due_order_idx;
