-- sqlease: the failover pause (SPEC S7). After the promotion of an
-- asynchronous standby, a holder whose grant the standby never received
-- still trusts its lease until its trusted window ends, while the new
-- primary has no row and could grant the key at once. With the pause on
-- (lock.WithFailoverPause, which sets {epoch}.pause_us to the longest TTL
-- of the namespace), a primary that is not the one the {epoch} row names
-- grants nothing until pause_us after it was first seen: every lost grant
-- was made before the old primary died, so its holder's window has ended
-- by then. Renewals of the rows that survived are not paused.
--
-- A server is named by its system identifier and timeline: a promoted
-- standby has a new timeline, a cluster restored from a dump a new system
-- identifier. {next_token}, which every grant calls for its token, refuses
-- with SQLSTATE SL002 while the server differs from {epoch}.server or the
-- pause since the change runs; nothing of that grant is written. The
-- engine then calls {primary_seen}(0), which records the new server and the
-- moment it was first seen (once: later calls leave it), and reports the
-- key locked until the pause ends. Without the row, or with pause_us 0
-- (the option never used), {next_token} only reads the one-row table.
--
-- {primary_seen} runs with its owner's privileges, as {next_token} does, so the
-- service role needs no privilege on the table; it gets {next_token}'s
-- EXECUTE grants. {name} markers are rendered by the migrate package; do
-- not run this file as is.

-- +goose Up
CREATE TABLE {epoch} (
    id       int PRIMARY KEY CHECK (id = 1),
    server   text NOT NULL,
    since_us bigint NOT NULL,
    -- At most lock.MaxTTL (24 h): since_us + pause_us cannot overflow.
    pause_us bigint NOT NULL CHECK (pause_us BETWEEN 0 AND 86400000000)
);

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION {next_token}() RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
DECLARE
    n bigint;
    c bigint := {to_us}(clock_timestamp());
    e record;
BEGIN
    SELECT server, since_us, pause_us INTO e FROM {epoch} WHERE id = 1;
    IF FOUND AND e.pause_us > 0 AND (c < e.since_us + e.pause_us OR e.server <>
            (pg_control_system()).system_identifier::text || '/' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)) THEN
        RAISE EXCEPTION 'sqlease: failover pause: this primary grants nothing until % microseconds after it was first seen', e.pause_us
            USING ERRCODE = 'SL002';
    END IF;
    n := nextval('{token_seq}');
    IF n >= c THEN
        RETURN n;
    END IF;
    RETURN setval('{token_seq}', c);
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION {primary_seen}(p_pause_us bigint) RETURNS TABLE (until_us bigint, now_us bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
DECLARE
    c bigint := {to_us}(clock_timestamp());
BEGIN
    INSERT INTO {epoch} AS e (id, server, since_us, pause_us)
    VALUES (1, (pg_control_system()).system_identifier::text || '/' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8),
            0, greatest(p_pause_us, 0))
    ON CONFLICT (id) DO UPDATE
        SET since_us = CASE WHEN e.server = excluded.server THEN e.since_us ELSE c END,
            server = excluded.server,
            pause_us = greatest(e.pause_us, excluded.pause_us)
        WHERE e.server <> excluded.server OR e.pause_us < excluded.pause_us;
    RETURN QUERY SELECT e.since_us + e.pause_us, c FROM {epoch} e WHERE e.id = 1;
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $do$
DECLARE
    schema text := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                    WHERE c.oid = '{token_seq}'::regclass);
    g record;
BEGIN
    -- CREATE OR REPLACE reset {next_token}'s settings: pin search_path again.
    EXECUTE format('ALTER FUNCTION {next_token}() SET search_path = pg_catalog, %I, pg_temp', schema);
    EXECUTE format('ALTER FUNCTION {primary_seen}(bigint) SET search_path = pg_catalog, %I, pg_temp', schema);
    IF (SELECT proacl IS NOT NULL FROM pg_proc WHERE oid = '{next_token}()'::regprocedure) THEN
        REVOKE EXECUTE ON FUNCTION {primary_seen}(bigint) FROM PUBLIC;
        FOR g IN SELECT a.grantee, a.is_grantable
                 FROM pg_proc p, aclexplode(p.proacl) a
                 WHERE p.oid = '{next_token}()'::regprocedure AND a.privilege_type = 'EXECUTE'
        LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION {primary_seen}(bigint) TO %s%s',
                           CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE g.grantee::regrole::text END,
                           CASE WHEN g.is_grantable AND g.grantee <> 0 THEN ' WITH GRANT OPTION' ELSE '' END);
        END LOOP;
    END IF;
END
$do$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION {primary_seen}(bigint);

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION {next_token}() RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
DECLARE
    n bigint := nextval('{token_seq}');
    c bigint := {to_us}(clock_timestamp());
BEGIN
    IF n >= c THEN
        RETURN n;
    END IF;
    RETURN setval('{token_seq}', c);
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $do$
BEGIN
    EXECUTE format('ALTER FUNCTION {next_token}() SET search_path = pg_catalog, %I, pg_temp',
                   (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                    WHERE c.oid = '{token_seq}'::regclass));
END
$do$;
-- +goose StatementEnd

DROP TABLE {epoch};
