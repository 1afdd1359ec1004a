-- Requests from people to the schedulers are rows (sql/api/50_requests.sql): trigger_job and
-- cancel_job check the caller's rights and write one here; the notification on pgsched_catalog
-- that wakes the schedulers carries only its id. Until now the notification was the request, and
-- pg_notify is open to every role that can connect: anyone could start a job (paused or not, at
-- a plan_time of their choosing) or cancel a run in somebody's name. A notification now proves
-- nothing, and the scheduler acts only on what this table says.
--
-- Written only by the SECURITY DEFINER request functions, read and deleted only by the schedulers
-- (the schema's owner role, as every pgsched table): no grant to PUBLIC. A row goes once a
-- scheduler acted on it (a trigger when its run starts, a cancel when the scheduler holding the
-- run takes it), or when the purge finds it past pgsched._request_ttl(). Not in a dump
-- (pgsched/extension.py CONFIG_TABLES): a pending request is minutes old.
CREATE TABLE pgsched.request (
    request_id   bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind         text        NOT NULL CHECK (kind IN ('trigger', 'cancel')),
    job_id       integer     NOT NULL,
    -- a trigger: its manual run's plan_time (what trigger_job returned); a cancel: the run
    plan_time    timestamptz,
    run_id       bigint,
    -- the session user who asked, named in a cancelled run's message
    requested_by name        NOT NULL,
    requested_at timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    CHECK (CASE kind WHEN 'trigger' THEN plan_time IS NOT NULL AND run_id IS NULL
                     ELSE run_id IS NOT NULL AND plan_time IS NULL END)
);
-- The purge reads the expired ones from the oldest.
CREATE INDEX request_requested_at_idx ON pgsched.request (requested_at);
REVOKE ALL ON pgsched.request FROM PUBLIC;
