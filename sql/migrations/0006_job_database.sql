-- A job may run in another database of the same server (pg_cron's schedule_in_database):
-- its run's session opens there, as its owner. NULL: the scheduler's own database.
ALTER TABLE pgsched.job ADD COLUMN database text;
