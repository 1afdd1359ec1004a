-- Deleting an upstream disables the dependents that had an edge to it, whoever may see it now.
--
-- job_dependency's edges to an upstream went with it (ON DELETE CASCADE), before the statement
-- trigger that disables its dependents (pgsched._dependency_deleted, sql/api/07_dependencies.sql)
-- could read them: that trigger decided by whether each dependent's owner might see the upstream
-- at that moment. A dependent whose owner saw it when the edge was made and lost sight of it since
-- was left waiting for runs that would never come; one whose owner named it blind (no edge, the
-- id taken as unknown) and came to see it since was disabled, learning that the id had existed.
--
-- The edge is the fact to decide by, so the upstream side has no foreign key any more: the trigger
-- reads an upstream's edges, then deletes them, and whoever makes an edge locks its upstream first
-- (_sync_dependencies), so that a deletion and a new edge wait for each other. (A foreign key
-- checked at commit would have served too, but `SET CONSTRAINTS ALL IMMEDIATE` would then check it
-- before the trigger had deleted the edges, and every deletion of an upstream would fail.) The
-- dependent's side keeps its ON DELETE CASCADE. Edges to jobs that no longer exist (left by a
-- deletion made with session_replication_role = replica, which fires no trigger) are removed.
ALTER TABLE pgsched.job_dependency DROP CONSTRAINT job_dependency_upstream_id_fkey;
DELETE FROM pgsched.job_dependency e WHERE NOT EXISTS (SELECT 1 FROM pgsched.job j WHERE j.job_id = e.upstream_id);
