import psycopg


def test_smoke(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    conn.execute("CREATE FUNCTION public.p(job_id int, config jsonb) RETURNS void LANGUAGE sql AS 'SELECT 1'")
    jid = conn.execute("SELECT add_job('p', '5 minutes')").fetchone()
    print(jid, conn.execute("SELECT * FROM job_stats").fetchall())
