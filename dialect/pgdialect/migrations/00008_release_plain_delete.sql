-- sqlease: cheaper grants and releases on the server (docs/performance.md,
-- "Server instructions per operation (PostgreSQL)").
--
-- 1. The holders table loses its CHECK (mode IN ('x', 's')). PostgreSQL
--    reads a CHECK constraint's expression back from its stored text and
--    prepares it on every statement that inserts a row: about 25,000 of the
--    server's 430,000 instructions per TryAcquire + Release. Every row of
--    the table is inserted by an acquire function, and both refuse any other
--    mode (SQLSTATE 22023) before they write, so the constraint guarded
--    nothing the functions do not.
--
-- 2. The wake function: the part of a release that runs only when a waiter
--    watches the key (is another live holder left, is a writer marked,
--    consume the watch, notify). The Release statement of this build is a
--    single DELETE that calls it from its RETURNING clause only for a
--    watched key, so an unwatched release no longer starts the statements
--    it does not run: about 72,000 instructions less per release. Releases
--    of older builds (their common table expression) work unchanged on this
--    version. The function plans its statements once per connection, with
--    index scans only (as 00007 does for the acquire functions). Its reads
--    take a snapshot newer than the DELETE's; they judge only whom to wake,
--    and a newer view is as good a hint. Releases of one watched key run it
--    one at a time (a per-key transaction lock), so that of two shared
--    leases released at once the later sees the earlier gone and notifies;
--    the common table expression before it, where each saw the other's row
--    live, could leave the waiters to their polls.
--
-- Dropping a constraint locks the table ACCESS EXCLUSIVE, and while that
-- lock request waits (behind a fenced transaction, which holds a holder row
-- for up to one TTL) every grant, renewal and release of every key queues
-- behind it. So the DROP waits at most 200 ms at a time, and is tried again
-- after a pause that lets the queued statements through, for up to about a
-- minute; then the migration fails, changing nothing, and can be run again.
--
-- {wake} gets the EXECUTE privileges of {acquire}, grant options included:
-- where EXECUTE was revoked from PUBLIC and granted to the service's roles,
-- they may call it too (otherwise their releases of watched keys would
-- fail), and roles that pass {acquire} on may pass {wake} on.
--
-- {name} markers are rendered by the migrate package; do not run this file
-- as is.

-- +goose Up
-- +goose StatementBegin
DO $do$
DECLARE
    c name;
    tries int;
    saved text := current_setting('lock_timeout');
BEGIN
    FOR c IN SELECT conname FROM pg_constraint
             WHERE conrelid = '{holders}'::regclass AND contype = 'c'
               AND pg_get_constraintdef(oid) LIKE '%mode%'
    LOOP
        tries := 0;
        LOOP
            BEGIN
                PERFORM set_config('lock_timeout', '200ms', true);
                EXECUTE format('ALTER TABLE {holders} DROP CONSTRAINT %I', c);
                EXIT;
            EXCEPTION WHEN lock_not_available THEN
                tries := tries + 1;
                IF tries >= 200 THEN
                    RAISE EXCEPTION 'sqlease: migration 00008 could not lock table {holders} within 200 ms in % tries (about a minute): a transaction kept it locked (a fenced transaction holds a holder row until it ends); nothing was changed, run the migration again', tries
                        USING ERRCODE = 'lock_not_available';
                END IF;
                PERFORM pg_sleep(0.1 + random() * 0.1);
            END;
        END LOOP;
    END LOOP;
    PERFORM set_config('lock_timeout', saved, true);
END
$do$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION {wake}(p_key text, p_lease_id text, p_channel text) RETURNS text
LANGUAGE plpgsql VOLATILE
SET enable_bitmapscan = off
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $fn$
DECLARE
    v_marked text;
BEGIN
    -- Releases of one watched key decide whom to wake one at a time, each
    -- after the one before it committed: of two shared leases released at
    -- once, each alone would see the other's row still live and neither
    -- would notify, leaving the waiters to their polls. The lock is the
    -- transaction's (the release's own), on a hash of the key seeded with
    -- the watches table, so it is not the acquire functions' per-key lock.
    PERFORM pg_advisory_xact_lock(hashtextextended(p_key, '{watches}'::regclass::oid::bigint));
    -- Another live holder of the key remains (a shared lease): nothing
    -- waiting could be granted now, so no one is woken and the watch stays.
    IF EXISTS (SELECT 1 FROM {holders} h
               WHERE h.lock_key = p_key AND h.lease_id <> p_lease_id AND h.expires_at > clock_timestamp()) THEN
        RETURN NULL;
    END IF;
    -- A marked writer is woken alone (SPEC W1): the payload names it, and
    -- the watch stays for the waiters not woken. Otherwise the watch is
    -- consumed: the woken waiters that stay blocked renew it on their
    -- attempt.
    SELECT m.waiter_id INTO v_marked
    FROM {markers} m WHERE m.lock_key = p_key AND m.expires_at > clock_timestamp();
    IF v_marked IS NULL THEN
        DELETE FROM {watches} w WHERE w.lock_key = p_key;
    END IF;
    -- Sent at commit, only if the release commits.
    PERFORM pg_notify(p_channel, coalesce(chr(30) || v_marked || chr(30), '') || p_key);
    RETURN p_key;
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $do$
DECLARE
    g record;
BEGIN
    -- NULL proacl: the default, EXECUTE for PUBLIC, which {wake} has too.
    IF (SELECT proacl FROM pg_proc WHERE oid = '{acquire}(text, text, text, text, bigint, bigint, bigint)'::regprocedure) IS NOT NULL THEN
        REVOKE EXECUTE ON FUNCTION {wake}(text, text, text) FROM PUBLIC;
        FOR g IN SELECT a.grantee, a.is_grantable FROM pg_proc p, aclexplode(p.proacl) a
                 WHERE p.oid = '{acquire}(text, text, text, text, bigint, bigint, bigint)'::regprocedure
                   AND a.privilege_type = 'EXECUTE'
        LOOP
            -- PUBLIC (grantee 0) cannot hold a grant option.
            EXECUTE format('GRANT EXECUTE ON FUNCTION {wake}(text, text, text) TO %s%s',
                           CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE g.grantee::regrole::text END,
                           CASE WHEN g.is_grantable AND g.grantee <> 0 THEN ' WITH GRANT OPTION' ELSE '' END);
        END LOOP;
    END IF;
END
$do$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION {wake}(text, text, text);
-- +goose StatementBegin
DO $do$
DECLARE
    tries int := 0;
    saved text := current_setting('lock_timeout');
BEGIN
    LOOP
        BEGIN
            PERFORM set_config('lock_timeout', '200ms', true);
            ALTER TABLE {holders} ADD CHECK (mode IN ('x', 's'));
            EXIT;
        EXCEPTION WHEN lock_not_available THEN
            tries := tries + 1;
            IF tries >= 200 THEN
                RAISE EXCEPTION 'sqlease: reverting migration 00008 could not lock table {holders} within 200 ms in % tries (about a minute); nothing was changed, run it again', tries
                    USING ERRCODE = 'lock_not_available';
            END IF;
            PERFORM pg_sleep(0.1 + random() * 0.1);
        END;
    END LOOP;
    PERFORM set_config('lock_timeout', saved, true);
END
$do$;
-- +goose StatementEnd
