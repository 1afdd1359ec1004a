-- Deleting an upstream disables the dependents that had an edge to it, whoever may see it now.
--
-- job_dependency's edges to an upstream went with it (ON DELETE CASCADE), before the statement
-- trigger that disables its dependents (pgsched._dependency_deleted, sql/api/07_dependencies.sql)
-- could read them: that trigger decided by whether each dependent's owner might see the upstream
-- at that moment. A dependent whose owner saw it when the edge was made and lost sight of it since
-- was left waiting for runs that would never come; one whose owner named it blind (no edge, the
-- id taken as unknown) and came to see it since was disabled, learning that the id had existed.
-- The edge is the fact to decide by: the check that an upstream's edges are gone now waits for the
-- end of the transaction (NO ACTION, deferred), and the trigger reads them, then deletes them.
ALTER TABLE pgsched.job_dependency DROP CONSTRAINT job_dependency_upstream_id_fkey;
ALTER TABLE pgsched.job_dependency ADD CONSTRAINT job_dependency_upstream_id_fkey
    FOREIGN KEY (upstream_id) REFERENCES pgsched.job DEFERRABLE INITIALLY DEFERRED;
