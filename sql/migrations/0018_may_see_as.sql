-- Seeing a job asks for the owner's rights or the right to become it, not mere membership.
--
-- 0002_security.sql let a role see the jobs of every role it is a member of (and all of them when
-- it is a member of the database's owner): pg_has_role(..., 'MEMBER'), which until PostgreSQL 15
-- meant the member had the role's rights. Since PostgreSQL 16, MEMBER is also true for
-- `GRANT r TO m WITH INHERIT FALSE, SET FALSE`, a grant that gives m neither r's rights (it cannot
-- read r's tables) nor r's identity: m still saw r's jobs, their configs, commands and errors.
-- 0017_may_act_as.sql made writing and running a job ask SET; seeing one now asks what reading
-- r's objects would: USAGE (m has r's rights) or SET (m may become r, and see them as r). On 15,
-- MEMBER, which implies both there.
--
-- pgsched._may_see_as is that rule, once: the job_read policy (which every other read policy
-- follows, through its subquery on pgsched.job) and pgsched._may_see (whose upstreams a job's
-- owner may name, sql/api/07_dependencies.sql) ask it. The server's version is read when it runs,
-- as in _may_act_as. Unlike _may_act_as it has no SET clause, and names every object with its
-- schema (operators too): the planner can then inline it into the policy's test of the owner,
-- which is evaluated for every row a listing reads. The test of the database's owner is a
-- subquery of its own, evaluated once per query (an InitPlan): as an argument, a subquery would
-- keep the function from being inlined, and it would be called for every row.
CREATE FUNCTION pgsched._may_see_as(member name, owner oid) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN pg_catalog.current_setting('server_version_num')::integer OPERATOR(pg_catalog.>=) 160000
                THEN pg_catalog.pg_has_role(member, owner, 'USAGE') OR pg_catalog.pg_has_role(member, owner, 'SET')
                ELSE pg_catalog.pg_has_role(member, owner, 'MEMBER') END
$$;

ALTER POLICY job_read ON pgsched.job
    USING ((SELECT pgsched._may_see_as(current_user, d.datdba) FROM pg_catalog.pg_database d
             WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
           OR pgsched._may_see_as(current_user, owner));
