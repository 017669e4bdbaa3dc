-- sqlease: fencing tokens follow the database clock, so they never go back
-- (SPEC S7): not after the promotion of an asynchronous standby that lost
-- acknowledged grants, a restore from a base backup or a dump, or a crash,
-- and with no manual step. Until this migration a token was the token
-- sequence's next value alone, and the sequence goes back with the WAL that
-- is lost (measured: 161 before a promotion, 34 after), so a token already
-- handed out could be issued again.
--
-- The {next_token} function is a hybrid logical clock: a token is the
-- greater of the sequence's next value and the database clock
-- (clock_timestamp()) in microseconds since the Unix epoch, and when the
-- clock is the greater the sequence is set to it (setval), so the sequence
-- stays the durable high-water mark: tokens of one key strictly increase
-- even if the clock steps back. Tokens are therefore about 1.8e15 today,
-- well inside a bigint and below 2^53 (exact in JSON numbers and float64)
-- until the year 2255. Tokens issued before this migration came from the
-- sequence alone and are far below every token issued after it, so tokens
-- keep increasing through the upgrade (and through a Down, which returns
-- to the sequence alone: it is then at the clock's value).
--
-- What it assumes: after a loss of WAL, the clock of the server that
-- issues the next token (the promoted standby, the restored copy) is not
-- behind the old primary's by more than the time the failover or restore
-- took; every lost token was then below the new server's clock. Two
-- grants of different keys at the same moment may leave the sequence a few
-- microseconds behind the highest token issued (each sets it to its own
-- clock reading, and the later setval can carry the smaller value); that
-- matters only if the clock also steps back between two grants of one key.
--
-- {next_token} is written in PL/pgSQL, which keeps its plans per
-- connection: the same in one LANGUAGE sql statement (a CASE over a
-- subquery of nextval and the clock) is never inlined and was planned again
-- on every call. Server time of the acquire function per grant, measured on
-- PostgreSQL 15 (TestTokenCostMeasure): 18 microseconds before this
-- migration, 22.6 after it, 45 with the SQL function. A grant and its
-- release as the engine sends them, each committed with its WAL flush,
-- took 727 and 742 microseconds (medians of 6 interleaved rounds).
--
-- The acquire functions call {next_token}() where they called nextval on
-- the token sequence; nothing else of them changes. Rather than repeat
-- their bodies, the migration edits each function's own definition
-- (pg_get_functiondef, which keeps its settings: lock_timeout and the
-- planner settings of 00004 and 00007) and fails, changing nothing, if the
-- text to replace is not found.
--
-- Privileges: setval needs UPDATE on the sequence, where nextval needs
-- only USAGE, the privilege a service role is given (docs/operations.md).
-- So {next_token} runs with its owner's privileges (SECURITY DEFINER: the
-- role that runs the migrations, which owns the sequence), and callers
-- need no more than before. Its search_path is pinned to pg_catalog, the
-- schema of the lock tables and pg_temp last, so that a caller cannot make
-- it run functions or operators of the caller's choosing. It gets the
-- EXECUTE privileges of the acquire functions, grant options included, as
-- {wake} did in 00008.
--
-- {name} markers are rendered by the migrate package; do not run this file
-- as is.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION {next_token}() RETURNS bigint
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

-- +goose StatementBegin
DO $do$
DECLARE
    f regprocedure;
    def text;
    changed text;
    g record;
BEGIN
    FOREACH f IN ARRAY ARRAY['{acquire}(text, text, text, text, bigint, bigint, bigint)'::regprocedure,
                             '{acquire_fifo}(text, text, text, text, bigint, bigint, bigint, text, bigint)'::regprocedure]
    LOOP
        def := pg_get_functiondef(f);
        changed := replace(def, 'nextval(''{token_seq}'')', '{next_token}()');
        IF changed = def THEN
            RAISE EXCEPTION 'sqlease: migration 00009: function % does not call nextval(''{token_seq}''); nothing was changed', f;
        END IF;
        EXECUTE changed;
    END LOOP;

    -- NULL proacl: the default, EXECUTE for PUBLIC, which {next_token} has
    -- too. Otherwise it gets every EXECUTE grant of either function.
    IF EXISTS (SELECT 1 FROM pg_proc
               WHERE oid IN ('{acquire}(text, text, text, text, bigint, bigint, bigint)'::regprocedure,
                             '{acquire_fifo}(text, text, text, text, bigint, bigint, bigint, text, bigint)'::regprocedure)
                 AND proacl IS NOT NULL) THEN
        REVOKE EXECUTE ON FUNCTION {next_token}() FROM PUBLIC;
        FOR g IN SELECT a.grantee, bool_or(a.is_grantable) AS is_grantable
                 FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
                 WHERE p.oid IN ('{acquire}(text, text, text, text, bigint, bigint, bigint)'::regprocedure,
                                 '{acquire_fifo}(text, text, text, text, bigint, bigint, bigint, text, bigint)'::regprocedure)
                   AND a.privilege_type = 'EXECUTE'
                 GROUP BY a.grantee
        LOOP
            -- PUBLIC (grantee 0) cannot hold a grant option.
            EXECUTE format('GRANT EXECUTE ON FUNCTION {next_token}() TO %s%s',
                           CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE g.grantee::regrole::text END,
                           CASE WHEN g.is_grantable AND g.grantee <> 0 THEN ' WITH GRANT OPTION' ELSE '' END);
        END LOOP;
    END IF;
END
$do$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $do$
DECLARE
    f regprocedure;
    def text;
    changed text;
BEGIN
    FOREACH f IN ARRAY ARRAY['{acquire}(text, text, text, text, bigint, bigint, bigint)'::regprocedure,
                             '{acquire_fifo}(text, text, text, text, bigint, bigint, bigint, text, bigint)'::regprocedure]
    LOOP
        def := pg_get_functiondef(f);
        changed := replace(def, '{next_token}()', 'nextval(''{token_seq}'')');
        IF changed = def THEN
            RAISE EXCEPTION 'sqlease: reverting migration 00009: function % does not call {next_token}(); nothing was changed', f;
        END IF;
        EXECUTE changed;
    END LOOP;
END
$do$;
-- +goose StatementEnd
DROP FUNCTION {next_token}();
