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
-- for centuries. Tokens issued before this migration came from the
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
-- The acquire functions call {next_token}() where they called nextval on
-- the token sequence; nothing else of them changes. Rather than repeat
-- their bodies, the migration edits each function's own definition
-- (pg_get_functiondef, which keeps its settings: lock_timeout and the
-- planner settings of 00004 and 00007) and fails, changing nothing, if the
-- text to replace is not found.
--
-- Privileges: setval needs UPDATE on the sequence, where nextval needed
-- only USAGE. Every role that may use the sequence (USAGE, other than its
-- owner) gets UPDATE on it, with the grant option where it had that; and
-- {next_token} gets the EXECUTE privileges of the acquire functions, as
-- {wake} did in 00008. Down drops the function but keeps those UPDATE
-- grants (it cannot tell them from grants made by hand).
--
-- {name} markers are rendered by the migrate package; do not run this file
-- as is.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION {next_token}() RETURNS bigint
LANGUAGE sql VOLATILE
AS $fn$
SELECT CASE WHEN s.n >= s.c THEN s.n ELSE setval('{token_seq}', s.c) END
FROM (SELECT nextval('{token_seq}') AS n, {to_us}(clock_timestamp()) AS c) s
$fn$;
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

    -- Roles that may call nextval on the sequence may now need setval.
    FOR g IN SELECT a.grantee, bool_or(a.is_grantable) AS is_grantable
             FROM pg_class c, aclexplode(c.relacl) a
             WHERE c.oid = '{token_seq}'::regclass
               AND a.privilege_type = 'USAGE' AND a.grantee <> c.relowner
             GROUP BY a.grantee
    LOOP
        EXECUTE format('GRANT UPDATE ON SEQUENCE {token_seq} TO %s%s',
                       CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE g.grantee::regrole::text END,
                       CASE WHEN g.is_grantable AND g.grantee <> 0 THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
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
