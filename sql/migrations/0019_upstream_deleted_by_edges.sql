-- Deleting an upstream job decides by its edges (README "Dependencies"): the jobs with an edge to it
-- are disabled. The statement trigger that did it fired after the edges' ON DELETE CASCADE (a trigger
-- of PostgreSQL's own, and triggers of one event fire in name order), so it could no longer read them
-- and asked instead who might see the upstream at that moment. Its row trigger,
-- "Before_RI_upstream_deleted" (sql/api/07_dependencies.sql), fires before the cascade.
-- (IF EXISTS: on a new install the API files, which made it, come after the migrations.)
DROP TRIGGER IF EXISTS job_upstream_deleted ON pgsched.job;
