-- Several schedulers per database: per-job lease and catch-up settings.
--   allow_stale_reentry: a run whose holder stopped renewing its lease may be taken
--     over (run again, as a new attempt of the same plan) by another scheduler; for
--     idempotent jobs. Otherwise such a run is closed as a crash and not re-run.
--   catch_up_window: how late a plan may still start after it became eligible (plan time +
--     schedule_delay); older ones are recorded as missed.
--   max_plans_per_tick: catch_up 'all' replays at most this many missed plans when it
--     finds a job behind; the older ones are recorded as missed.
--   schedule_delay: a plan becomes eligible this long after its plan time.
ALTER TABLE pgsched.job
    ADD COLUMN allow_stale_reentry boolean  NOT NULL DEFAULT false,
    ADD COLUMN catch_up_window     interval,
    ADD COLUMN max_plans_per_tick  integer  NOT NULL DEFAULT 100,
    ADD COLUMN schedule_delay      interval NOT NULL DEFAULT interval '0',
    ADD CONSTRAINT job_catch_up_window_positive CHECK (catch_up_window IS NULL OR catch_up_window > interval '0'),
    ADD CONSTRAINT job_max_plans_per_tick_positive CHECK (max_plans_per_tick >= 1),
    ADD CONSTRAINT job_schedule_delay_not_negative CHECK (schedule_delay >= interval '0');

-- Plans that came due but were not run under the job's catch-up policy.
ALTER TABLE pgsched.job_stat ADD COLUMN total_missed bigint NOT NULL DEFAULT 0;
