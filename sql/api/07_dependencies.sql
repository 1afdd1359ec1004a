-- Dependencies (README "Dependencies"): a job may run after other jobs, its upstreams. This file
-- owns the rule, once:
--   * a dependent with no schedule of its own (schedule '@after') runs once after each time all of
--     its upstreams have succeeded since its own last run (one upstream: after each success of it;
--     several: fan-in). Its run's plan_time is the latest plan time among those upstream runs, so
--     a chain of jobs all see one pgsched.plan_time;
--   * a dependent with a schedule runs a plan only if all of its upstreams have succeeded since its
--     previous run; otherwise the plan is recorded as skipped, waiting for them;
--   * an upstream that is deleted or disabled leaves its dependents disabled, with the reason.
-- State: pgsched.job_dependency, one row per edge (migration 0012). An upstream's successful plan
-- run (its close, pgsched._end_runs) marks the edges it feeds; an '@after' dependent whose edges
-- are all marked gets a plan (it becomes due, and any instance's claim starts it like a scheduled
-- job; job_stat.upstream_backlog keeps the plans that come while one is pending or running) and
-- its marks are consumed in the same transaction; a scheduled dependent consumes them when its run
-- starts (pgsched._take_upstreams). A close locks the dependents' job_stat rows before it reads
-- their edges, so two closes on two instances cannot both miss the other's mark.

-- All of this file's functions are internal: replaced whole on every upgrade.
SELECT pgsched._drop_functions(ARRAY[
    '_check_edges_made',
    '_check_upstreams',
    '_may_see',
    '_upstream_deleted',
    '_depends_form',
    '_resolve_upstreams',
    '_sync_dependencies',
    '_take_upstreams',
    '_upstream_disabled',
    '_upstream_wait',
    '_upstreams_succeeded']);

-- What depends_on accepts, for every error about it.
CREATE OR REPLACE FUNCTION pgsched._depends_form()
RETURNS text LANGUAGE sql IMMUTABLE
RETURN 'an array of 1 to 100 job ids or names of jobs the job''s owner may see, such as '
    || 'ARRAY[''nightly_rollup''] or ''{1001,1002}'' (in alter_job: NULL keeps them, ''{}'' removes them)';

-- Whether jobs of `owner` may depend on a job of `job_owner`: the rule of the job_read policy
-- (pgsched._may_see_as, migration 0018) for the owner instead of the caller, so that a dependent
-- never reveals (its waits, its disable reasons) what its owner could not read anyway.
-- An owner role dropped since (its jobs stay, docs/security.md) may see nothing: false, not an error.
CREATE OR REPLACE FUNCTION pgsched._may_see(owner regrole, job_owner regrole)
RETURNS boolean LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce((SELECT pgsched._may_see_as(r.rolname, job_owner)
                            OR pgsched._may_see_as(r.rolname, (SELECT d.datdba FROM pg_catalog.pg_database d
                                                               WHERE d.datname = pg_catalog.current_database()))
                       FROM pg_catalog.pg_roles r WHERE r.oid = owner), false)
$$;

-- The upstream jobs `refs` names (ids or names), as sorted distinct ids; NULL stays NULL (not
-- given) and an empty array gives '{}' (none). A name is one of the owner's jobs, else the one
-- job of that name the owner may see. A job the owner may not see (_may_see) is refused as if it
-- did not exist. Runs as the caller, so the caller's row-level security applies as well.
CREATE OR REPLACE FUNCTION pgsched._resolve_upstreams(refs text[], owner regrole)
RETURNS integer[] LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ref text;
    id integer;
    ids integer[] := '{}';
    n integer;
BEGIN
    IF refs IS NULL THEN
        RETURN NULL;
    END IF;
    IF cardinality(refs) > 100 THEN
        PERFORM pgsched._bad_arg('depends_on', format('%s jobs', cardinality(refs)), pgsched._depends_form());
    END IF;
    FOREACH ref IN ARRAY refs LOOP
        IF ref IS NULL OR btrim(ref) = '' THEN
            PERFORM pgsched._bad_arg('depends_on', format('%s is not a job', coalesce(quote_literal(ref), 'NULL')),
                                     pgsched._depends_form());
        END IF;
        id := NULL;
        IF btrim(ref) ~ '^[0-9]+$' THEN
            -- An id; one beyond the range of ids names no job.
            SELECT j.job_id INTO id FROM pgsched.job j
             WHERE length(btrim(ref)) <= 10 AND btrim(ref)::bigint <= 2147483647
               AND j.job_id = btrim(ref)::bigint AND pgsched._may_see(_resolve_upstreams.owner, j.owner);
        ELSE
            SELECT j.job_id INTO id FROM pgsched.job j WHERE j.owner = _resolve_upstreams.owner AND j.job_name = ref;
            IF id IS NULL THEN
                SELECT min(j.job_id), count(*) INTO id, n FROM pgsched.job j
                 WHERE j.job_name = ref AND pgsched._may_see(_resolve_upstreams.owner, j.owner);
                IF n > 1 THEN
                    PERFORM pgsched._bad_arg('depends_on', format('%L names %s jobs of different owners', ref, n),
                                             'job ids where names are ambiguous: ' || pgsched._depends_form());
                END IF;
            END IF;
        END IF;
        IF id IS NULL THEN
            PERFORM pgsched._bad_arg('depends_on', format('no job %L that role %s may see', ref, _resolve_upstreams.owner),
                                     pgsched._depends_form());
        END IF;
        ids := ids || id;
    END LOOP;
    RETURN ARRAY(SELECT DISTINCT u FROM unnest(ids) AS u ORDER BY u);
END
$$;

-- Refuse a job depending on itself, or on a job that (through its own upstreams) runs after it:
-- such a job could never run. job_id NULL: a new job, which nothing depends on yet. Called by the
-- job's trigger (_sync_dependencies) for every write of depends_on, through the API or not; it reads
-- every job's depends_on, whoever may see it (a cycle through a job the caller cannot see is a cycle
-- all the same), so it is not PUBLIC's to call (95_grants.sql), and its message names no job but the
-- two concerned. Changes of the graph take turns (an advisory lock held to commit), so that two
-- transactions cannot each close half of a cycle. Reachability is computed per job (UNION), not per
-- path, so a dense graph costs its edges, not its paths.
CREATE OR REPLACE FUNCTION pgsched._check_upstreams(job_id integer, depends_on integer[])
RETURNS void LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    via integer;
BEGIN
    IF job_id IS NULL OR depends_on IS NULL THEN
        RETURN;
    END IF;
    IF job_id = ANY (depends_on) THEN
        PERFORM pgsched._bad_arg('depends_on', format('job %s would depend on itself', job_id),
                                 'jobs other than the job itself: ' || pgsched._depends_form());
    END IF;
    -- Any fixed number, other than the deploy's and the concurrency limits'.
    PERFORM pg_catalog.pg_advisory_xact_lock(7401295313);
    -- The first given upstream from which the job is reachable.
    SELECT u INTO via
      FROM unnest(_check_upstreams.depends_on) AS u
     WHERE EXISTS (
         WITH RECURSIVE up(job_id) AS (
             SELECT u
             UNION
             SELECT x FROM up JOIN pgsched.job j ON j.job_id = up.job_id CROSS JOIN LATERAL unnest(j.depends_on) AS x
         )
         SELECT 1 FROM up WHERE up.job_id = _check_upstreams.job_id)
     ORDER BY u LIMIT 1;
    IF via IS NOT NULL THEN
        PERFORM pgsched._bad_arg('depends_on', format('it would make a cycle: job %s already runs after job %s '
                                                      '(directly or through other jobs)', via, job_id),
                                 'jobs that do not already run after this one: ' || pgsched._depends_form());
    END IF;
END
$$;

-- Keep job_dependency equal to job.depends_on (the job's trigger calls this, for writes through the
-- API and direct ones alike): edges that stay keep their marks, new ones start unmarked. A direct
-- write is held to the API's rules: an upstream the owner may not see is taken as if it did not
-- exist, and a cycle is refused (_check_upstreams). inserted: a new job. A new job may name ids that do
-- not exist yet, and jobs inserted before it may name it, when their owner may see it (pg_restore of
-- an extension's catalog inserts jobs in any order; job_dependency is not dumped: it is derived, and
-- its marks are transient).
CREATE OR REPLACE FUNCTION pgsched._sync_dependencies(job_id integer, owner regrole, depends_on integer[],
                                                      inserted boolean, old_depends_on integer[] DEFAULT NULL)
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    added integer[];
    bad integer;
BEGIN
    IF inserted THEN
        INSERT INTO pgsched.job_dependency (job_id, upstream_id)
        SELECT j.job_id, _sync_dependencies.job_id FROM pgsched.job j
         WHERE j.depends_on @> ARRAY[_sync_dependencies.job_id] AND pgsched._may_see(j.owner, _sync_dependencies.owner)
        ON CONFLICT DO NOTHING;
    END IF;
    -- Only what is added is checked: removing an upstream (as deleting one does, whoever deletes it)
    -- cannot make a cycle or reveal anything. Added to depends_on, not to the edges: an id a new job
    -- named without an edge (unknown then, or hidden) is not checked again at each later change, or
    -- deleting one of its other upstreams, by whoever deletes it, would fail on it.
    SELECT array_agg(u) INTO added FROM unnest(depends_on) AS u
     WHERE NOT (u = ANY (coalesce(old_depends_on, '{}')))
       AND NOT EXISTS (SELECT 1 FROM pgsched.job_dependency d
                        WHERE d.job_id = _sync_dependencies.job_id AND d.upstream_id = u);
    IF added IS NULL THEN
        added := '{}';
    ELSIF NOT inserted THEN
        PERFORM pgsched._check_upstreams(_sync_dependencies.job_id, added);
    END IF;
    -- A new job may name an id that does not exist (yet), so one the owner may not see is taken
    -- the same way, with no edge (below): refusing it would tell the writer the id exists. A
    -- changed job's new upstreams must exist and be visible, both refused alike.
    SELECT u INTO bad FROM unnest(added) AS u
     WHERE NOT inserted
       AND NOT EXISTS (SELECT 1 FROM pgsched.job j
                        WHERE j.job_id = u AND pgsched._may_see(_sync_dependencies.owner, j.owner))
     LIMIT 1;
    IF bad IS NOT NULL THEN
        PERFORM pgsched._bad_arg('depends_on', format('no job %L that role %s may see', bad::text, _sync_dependencies.owner),
                                 pgsched._depends_form());
    END IF;
    -- Its edges in the order everyone locks them (_upstreams_succeeded), before any is deleted.
    PERFORM 1 FROM pgsched.job_dependency d WHERE d.job_id = _sync_dependencies.job_id
     ORDER BY d.upstream_id FOR UPDATE;
    DELETE FROM pgsched.job_dependency d
     WHERE d.job_id = _sync_dependencies.job_id AND NOT (d.upstream_id = ANY (coalesce(depends_on, '{}')));
    -- The upstreams it gets edges to locked first, in the order of their ids, as the edges' foreign
    -- key check would lock them: a deletion of one still in progress is waited for, and one deleted
    -- meanwhile is then skipped and gets no edge, where the check would have failed the write with a
    -- foreign key violation. Only those its owner may see: a job it may not see gets no edge, and
    -- a lock on it would hold up its deletion.
    PERFORM 1 FROM pgsched.job j
     WHERE j.job_id = ANY (CASE WHEN inserted THEN _sync_dependencies.depends_on ELSE added END)
       AND pgsched._may_see(_sync_dependencies.owner, j.owner)
     ORDER BY j.job_id FOR KEY SHARE;
    -- A changed job gets edges for what was checked above only: an id it kept without an edge
    -- keeps none (an edge made for it now would skip the cycle check).
    INSERT INTO pgsched.job_dependency (job_id, upstream_id)
    SELECT _sync_dependencies.job_id, u FROM unnest(CASE WHEN inserted THEN depends_on ELSE added END) AS u
     WHERE EXISTS (SELECT 1 FROM pgsched.job j
                    WHERE j.job_id = u AND pgsched._may_see(_sync_dependencies.owner, j.owner))
    ON CONFLICT DO NOTHING;
    -- A changed job's new upstreams were all there a moment ago (above): one without its edge now
    -- was deleted while the lock waited. (A new job may name ids that do not exist: the API checks
    -- its own, _store_new_job.)
    IF NOT inserted THEN
        PERFORM pgsched._check_edges_made(_sync_dependencies.job_id, added);
    END IF;
END
$$;

-- An upstream was paused or disabled (the job's trigger calls this): its dependents are disabled
-- too, with the reason; their own dependents follow through the same trigger. The reason names the
-- upstream and says why it is disabled only to a dependent whose owner may still see it (_may_see);
-- the others are told its id.
CREATE OR REPLACE FUNCTION pgsched._upstream_disabled(upstream_id integer, why text)
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ids integer[];
    up_owner regrole;
BEGIN
    SELECT array_agg(j.job_id ORDER BY j.job_id) INTO ids FROM pgsched.job j
     WHERE j.job_id IN (SELECT e.job_id FROM pgsched.job_dependency e WHERE e.upstream_id = _upstream_disabled.upstream_id)
       AND j.scheduled;
    IF ids IS NOT NULL THEN
        -- Their rows before their job_stat rows, in the order of their ids: the order alter_job and
        -- an upstream's deletion (_upstream_deleted) take them in.
        PERFORM 1 FROM pgsched.job j WHERE j.job_id = ANY (ids) ORDER BY j.job_id FOR NO KEY UPDATE;
        SELECT j.owner INTO up_owner FROM pgsched.job j WHERE j.job_id = _upstream_disabled.upstream_id;
        -- The reason before the pause, which passes it on to their own dependents.
        UPDATE pgsched.job_stat s
           SET disabled_reason = CASE WHEN pgsched._may_see(j.owner, up_owner) THEN why
                                      ELSE format('upstream job %s is disabled: resume it, then this job',
                                                  _upstream_disabled.upstream_id) END
          FROM pgsched.job j WHERE j.job_id = s.job_id AND s.job_id = ANY (ids);
        UPDATE pgsched.job j SET scheduled = false WHERE j.job_id = ANY (ids) AND j.scheduled;
        PERFORM pg_catalog.pg_notify('pgsched_events', pgsched._event('job_disabled', u, NULL, NULL, NULL, NULL))
           FROM unnest(ids) AS u;
    END IF;
END
$$;

-- An upstream deleted (the job table's row trigger below calls this): the jobs with an edge to it
-- are disabled with the reason and lose it from depends_on. The edges decide, not who may see the
-- upstream now: an edge was made when its dependent's owner could see the upstream (and is what the
-- dependent waits for), so a dependent whose owner lost sight of it since is disabled all the same
-- (told its id only, as _upstream_disabled tells it), and one that named it without an edge (its id
-- unknown, or the job hidden, then) is left as it is: the deletion tells it nothing.
CREATE OR REPLACE FUNCTION pgsched._upstream_deleted()
RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ids integer[];
BEGIN
    -- The dependents' rows first, in the order of their ids (alter_job, _upstream_disabled and
    -- _disable_job_v2 lock a job's row before its job_stat row), then their edges read again: a
    -- change that removed the edge while this waited has committed, and its job is left alone. Then
    -- the job_stat rows, the deleted job's among them, in the order of their ids, as a close locks
    -- them (20_runs.sql). A dependent deleted by the same statement is gone from pgsched.job
    -- already: none of this touches it.
    PERFORM 1 FROM pgsched.job j
     WHERE j.job_id IN (SELECT e.job_id FROM pgsched.job_dependency e WHERE e.upstream_id = OLD.job_id)
     ORDER BY j.job_id FOR NO KEY UPDATE;
    SELECT array_agg(e.job_id ORDER BY e.job_id) INTO ids
      FROM pgsched.job_dependency e JOIN pgsched.job j ON j.job_id = e.job_id
     WHERE e.upstream_id = OLD.job_id AND OLD.job_id = ANY (j.depends_on);
    IF ids IS NULL THEN
        RETURN NULL;
    END IF;
    -- The deleted job's runs in progress before it (a close locks a run, then its job_stat row), which
    -- the cascade deletes after this.
    PERFORM 1 FROM pgsched.job_run_live r WHERE r.job_id = OLD.job_id AND r.outcome = 'running'
     ORDER BY r.run_id FOR UPDATE;
    PERFORM 1 FROM pgsched.job_stat s WHERE s.job_id = ANY (ids || OLD.job_id) ORDER BY s.job_id FOR UPDATE;
    -- The reason before the pause, which passes it on to their own dependents (_upstream_disabled).
    -- One still disabled for other upstreams deleted (by the same statement, say) names them all;
    -- not a reason passed on from an upstream disabled for that (it ends otherwise).
    UPDATE pgsched.job_stat s
       SET disabled_reason = format('upstream job %s deleted: give the job other upstreams (alter_job depends_on) '
                                    || 'or a schedule, then resume it',
                                    concat_ws(', ', CASE WHEN NOT j.scheduled THEN substring(s.disabled_reason FROM
                                                  '^upstream job (.*) deleted: give the job other upstreams '
                                                  || '[(]alter_job depends_on[)] or a schedule, then resume it$') END,
                                              CASE WHEN pgsched._may_see(j.owner, OLD.owner)
                                                   THEN format('%s (%s)', OLD.job_id, OLD.job_name)
                                                   ELSE OLD.job_id::text END))
      FROM pgsched.job j WHERE j.job_id = s.job_id AND s.job_id = ANY (ids);
    UPDATE pgsched.job j
       SET depends_on = nullif(array_remove(j.depends_on, OLD.job_id), '{}'), scheduled = false
     WHERE j.job_id = ANY (ids);
    RETURN NULL;
END
$$;

-- A row trigger whose name sorts before PostgreSQL's own triggers of the edges' foreign keys
-- (RI_ConstraintTrigger_...): the triggers of one event fire in the order of their names, so this one
-- reads a deleted upstream's edges before their ON DELETE CASCADE removes them. (The statement
-- trigger before migration 0019 fired after the cascade and could only ask who might see the
-- upstream at that moment.) In REPEATABLE READ, an edge committed after the deletion's snapshot is
-- not seen here, and the cascade then fails the deletion with 40001 rather than leave its dependent.
SELECT pgsched._replace_if_changed('pgsched.job', 'Before_RI_upstream_deleted', $ddl$
CREATE OR REPLACE TRIGGER "Before_RI_upstream_deleted" AFTER DELETE ON pgsched.job
    FOR EACH ROW EXECUTE FUNCTION pgsched._upstream_deleted()
$ddl$);

-- A change gave the job `upstreams`, each of which existed and its owner could see a moment before
-- (add_job's resolved upstreams, _store_new_job; any change's added ones, _sync_dependencies): each
-- must have its edge now. One without was deleted (or hidden from the owner) while the change ran:
-- the change is refused as a serialization failure, to be retried, rather than leave a dependent
-- waiting for a job that will never run again.
CREATE OR REPLACE FUNCTION pgsched._check_edges_made(job_id integer, upstreams integer[])
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    gone integer;
BEGIN
    SELECT u INTO gone FROM unnest(upstreams) AS u
     WHERE NOT EXISTS (SELECT 1 FROM pgsched.job_dependency d
                        WHERE d.job_id = _check_edges_made.job_id AND d.upstream_id = u)
     ORDER BY u LIMIT 1;
    IF gone IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '40001',
            MESSAGE = format('invalid depends_on: job %s was deleted (or hidden from the job''s owner) while this '
                             'change ran', gone),
            HINT = 'retry the transaction: the change was not made';
    END IF;
END
$$;

-- The plans '@after' jobs have been given and not yet started: the pending one (next_start, less
-- the job's schedule_delay) and the ones waiting behind it, in the order they will run (position). A pending plan whose run has started
-- (its job is starting or running it) is not listed. What the tests and bench/chaos.py count as
-- given; as the invoker, under row-level security.
SELECT pgsched._replace_if_changed('pgsched._upstream_plans', NULL, $ddl$
CREATE OR REPLACE VIEW pgsched._upstream_plans WITH (security_invoker = true) AS
SELECT s.job_id, p.plan_time, p.n = 1 AS pending, p.n AS position
  FROM pgsched.job_stat s
  JOIN pgsched.job j ON j.job_id = s.job_id
 CROSS JOIN LATERAL unnest(pgsched._delayed(s.next_start, -j.schedule_delay) || coalesce(s.upstream_backlog, '{}'))
                    WITH ORDINALITY AS p(plan_time, n)
 WHERE j.schedule = '@after' AND p.plan_time IS NOT NULL
   AND NOT EXISTS (SELECT 1 FROM pgsched.job_run_live r
                    WHERE r.job_id = s.job_id AND r.scope = '' AND r.plan_time = p.plan_time)
$ddl$);

-- Upstream plan runs that succeeded (the close calls this: their jobs and plan times, in the close's
-- transaction): mark the edges they feed, plan a run of each '@after' dependent whose edges are then
-- all marked, and consume its marks. A paused dependent is not planned; its marks wait for it.
-- Returns how many plans it gave dependents. One statement (it runs in the close of every upstream):
-- * the close has locked every dependent's job_stat row before anything else (pgsched._end_runs,
--   one order with its own): a close of another upstream of the same dependent waits there for
--   this one's commit, and this statement, which comes after, then reads the first's marks (each
--   statement reads what was committed when it began). The edges need no lock of their own (one
--   a scheduled dependent takes, pgsched._take_upstreams, holds back a mark's write until it ends);
-- * what the edges will hold is worked out from those rows and the batch, and written where it
--   changes (one upstream: its mark is set and consumed at once, and the edge is not written);
-- * a dependent's plan makes it due, as a schedule does (job_stat.next_start: the claim starts it
--   like any due job, one insert); a plan that comes while one is pending or running waits in
--   job_stat.upstream_backlog until that run's close (pgsched._end_runs) takes it.
-- The schedulers are woken when nothing else was due (see below).
CREATE OR REPLACE FUNCTION pgsched._upstreams_succeeded(upstreams integer[], plan_times timestamptz[],
                                                        now timestamptz DEFAULT now())
RETURNS integer LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- Its statement's plan is made once per session: left to choose, PostgreSQL planned it again at
-- every call (a custom plan looked cheaper than the generic one), three times its execution.
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    planned integer;
    made_due integer;
    nothing_due boolean;
BEGIN
    -- Under REPEATABLE READ or SERIALIZABLE (a run_job's close in such a transaction), a statement
    -- reads the transaction's snapshot, not what the close's lock waited for: the edges are locked
    -- too, which raises a serialization failure where another close marked them meanwhile, rather
    -- than missing its mark. (The scheduler's sessions read committed: pgsched/store.py.)
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM 1 FROM pgsched.job_dependency d
         WHERE d.job_id IN (SELECT e.job_id FROM pgsched.job_dependency e WHERE e.upstream_id = ANY (upstreams))
         ORDER BY d.job_id, d.upstream_id
           FOR UPDATE;
    END IF;
    WITH batch AS (
        SELECT x.upstream_id, max(x.plan_time) AS plan_time
          FROM unnest(upstreams, plan_times) AS x(upstream_id, plan_time) GROUP BY x.upstream_id
    ), marks AS (
        -- every edge of every dependent concerned (their job_stat rows are locked: see above)
        SELECT d.job_id, d.upstream_id, d.succeeded_plan FROM pgsched.job_dependency d
         WHERE d.job_id IN (SELECT e.job_id FROM pgsched.job_dependency e WHERE e.upstream_id = ANY (upstreams))
    ), edges AS (
        SELECT l.job_id, l.upstream_id, l.succeeded_plan, b.upstream_id IS NOT NULL AS fed,
               CASE WHEN b.upstream_id IS NULL THEN l.succeeded_plan
                    ELSE greatest(l.succeeded_plan, b.plan_time) END AS mark
          FROM marks l LEFT JOIN batch b ON b.upstream_id = l.upstream_id
    ), ready AS (
        -- The job looked up per dependent (a subquery the planner keeps: as a join, a plan made while
        -- no job was '@after' read every job for each close).
        SELECT r.* FROM (
            SELECT e.job_id, max(e.mark) AS plan_time,
                   (SELECT j.schedule_delay FROM pgsched.job j
                     WHERE j.job_id = e.job_id AND j.schedule = '@after' AND j.scheduled) AS schedule_delay
              FROM edges e
             GROUP BY e.job_id
            HAVING bool_and(e.mark IS NOT NULL)) r
         WHERE r.schedule_delay IS NOT NULL
    ), plans AS (
        -- A plan the dependent has pending or waiting already (its upstreams succeeded twice for one
        -- plan: a takeover's second attempt) is not planned again; one it has run is passed over by
        -- the claim (its ON CONFLICT), which then takes the next.
        UPDATE pgsched.job_stat s
           SET next_start = coalesce(s.next_start, pgsched._delayed(r.plan_time, r.schedule_delay)),
               upstream_backlog = CASE WHEN s.next_start IS NULL THEN s.upstream_backlog
                                       ELSE coalesce(s.upstream_backlog, '{}') || r.plan_time END
          FROM ready r
         -- By key, from an array: the generic plan guesses a hundred dependents made ready, and
         -- joined them to job_stat by hash, reading every row of it at each close (0.1 ms at 400
         -- jobs, growing with them), where a close writes a few.
         WHERE s.job_id = ANY (ARRAY(SELECT x.job_id FROM ready x)) AND s.job_id = r.job_id
           AND s.next_start IS DISTINCT FROM pgsched._delayed(r.plan_time, r.schedule_delay)
           AND r.plan_time <> ALL (coalesce(s.upstream_backlog, '{}'))
        RETURNING r.plan_time <> ALL (coalesce(s.upstream_backlog, '{}')) AS due_now
    ), written AS (
        -- A ready dependent's edges are consumed; the others' fed edges take their mark.
        UPDATE pgsched.job_dependency d
           SET succeeded_plan = CASE WHEN r.job_id IS NULL THEN e.mark END,
               succeeded_at = CASE WHEN r.job_id IS NULL THEN _upstreams_succeeded.now END
          FROM edges e LEFT JOIN ready r ON r.job_id = e.job_id
         WHERE d.job_id = ANY (ARRAY(SELECT x.job_id FROM marks x))  -- by key, as above
           AND d.job_id = e.job_id AND d.upstream_id = e.upstream_id AND (r.job_id IS NOT NULL OR e.fed)
           AND e.succeeded_plan IS DISTINCT FROM CASE WHEN r.job_id IS NULL THEN e.mark END
        RETURNING 1
    )
    -- The statement's snapshot: what was due before these plans (the closed jobs' next starts
    -- included: the close wrote them in an earlier statement). Only a job any instance may start
    -- counts: not one waiting for its concurrency key, nor a Python job (whose module some
    -- instances may not load). The job's kind is a scalar subquery, so that the due index leads:
    -- as a semi-join, a plan walked the jobs in id order until one was due (a read per job).
    SELECT (SELECT count(*) FROM plans), (SELECT count(*) FROM plans p WHERE p.due_now),
           NOT EXISTS (SELECT 1 FROM pgsched.job_stat q
                        WHERE q.state = 'scheduled' AND q.concurrency_key IS NULL
                          AND pgsched._due_at(q.job_id, q.next_start, q.jitter_us)
                              <= pg_catalog.timezone('UTC', _upstreams_succeeded.now)
                          AND (SELECT j.kind FROM pgsched.job j WHERE j.job_id = q.job_id) <> 'python')
      INTO planned, made_due, nothing_due;
    -- Any instance may claim them: wake them all, when nothing else was due. While something is,
    -- an instance is about to claim, and a claim starts due jobs in order and says when the next is
    -- due (_claim_v2's next_due): a notification per close would serialise commits on the
    -- notification queue's lock, and make every instance ask again what is due.
    IF made_due > 0 AND nothing_due THEN
        PERFORM pg_catalog.pg_notify('pgsched_catalog', 'job_run:upstream');
    END IF;
    RETURN planned;
END
$$;

-- A scheduled dependent's plan run is starting (the scheduler asks before it runs it): NULL, and
-- its upstreams' marks consumed, when all of them have succeeded since its previous run; else
-- why it waits, and nothing changes (the scheduler records the plan as skipped with that reason).
CREATE OR REPLACE FUNCTION pgsched._take_upstreams(run_id bigint)
RETURNS text LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    dependent integer;
    waiting text;
BEGIN
    SELECT r.job_id INTO dependent FROM pgsched.job_run_live r WHERE r.run_id = _take_upstreams.run_id;
    IF dependent IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM 1 FROM pgsched.job_dependency d WHERE d.job_id = dependent ORDER BY d.upstream_id FOR UPDATE;
    waiting := pgsched._upstream_wait(dependent);
    IF waiting IS NULL THEN
        UPDATE pgsched.job_dependency d SET succeeded_plan = NULL, succeeded_at = NULL WHERE d.job_id = dependent;
    END IF;
    RETURN waiting;
END
$$;

-- What a dependent waits for (NULL: nothing): its upstreams that have not succeeded since its last
-- run, each with what it is doing. Runs as the caller: an upstream the reader may not see is named
-- by its id only.
CREATE OR REPLACE FUNCTION pgsched._upstream_wait(job_id integer)
RETURNS text LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT 'upstream job(s) not succeeded since its last run: '
           || string_agg(format('%s%s%s', d.upstream_id, coalesce(' (' || j.job_name || ')', ''),
                                CASE WHEN s.state = 'disabled' THEN ': disabled'
                                     WHEN s.state IN ('starting', 'terminating') THEN ': running'
                                     WHEN s.consecutive_failures > 0 THEN format(': failing (%s in a row)',
                                                                                 s.consecutive_failures)
                                     ELSE '' END), ', ' ORDER BY d.upstream_id)
      FROM pgsched.job_dependency d
      LEFT JOIN pgsched.job j ON j.job_id = d.upstream_id
      LEFT JOIN pgsched.job_stat s ON s.job_id = j.job_id
     WHERE d.job_id = _upstream_wait.job_id AND d.succeeded_plan IS NULL
     HAVING count(*) > 0
$$;
