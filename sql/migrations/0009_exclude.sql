-- A job's exclusion window (issue 14): a 5-field cron expression, read at minute resolution in
-- the job's time zone. A plan whose minute matches is not run: the scheduler records it as
-- skipped with the reason and plans past the window (README "Exclusion windows"). NULL: none.
ALTER TABLE pgsched.job ADD COLUMN exclude text;
