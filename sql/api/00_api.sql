-- The version of the internal API: the contract between this release's SQL and the
-- scheduler's Python (pgsched/api.py explains it; API_VERSION there must equal
-- api_version here, and release must equal pgsched.__version__: a test checks both).
--
-- api_version: the API this release's scheduler speaks. oldest_api_served: the oldest
-- API whose calls these functions still answer, so that the previous release's
-- instances keep working after `pgsched init` of this one until they are replaced (see
-- the README's rolling upgrade). A function, not a table row, so that bumping it takes
-- no migration (release 0.1.0's instances refuse a schema with a migration they do not
-- know). Every release reads it, on connect and on every reconnect: its name, its
-- arguments and its result never change.
CREATE OR REPLACE FUNCTION pgsched._api(OUT api_version integer, OUT oldest_api_served integer,
                                        OUT release text)
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT 2, 1, '0.2.0'
$$;
