-- sqlease: semaphores (SPEC W7). A shared acquire may carry a limit n
-- (lock.Limit): it is granted only while the key has fewer than n holder
-- rows. The acquire functions take it as a last parameter, p_limit bigint
-- DEFAULT 0 (0: no limit), so a build without this migration's statements
-- still calls them with seven (nine) arguments and gets what it got before.
--
-- The count is race-free because grants of a key are already serialized by
-- the per-key transaction advisory lock: the fast path inserts only when it
-- got that lock at once, and the full path takes it before its checks; each
-- statement after it sees every grant committed before (READ COMMITTED).
-- The count is of every holder row of the key, expired or not, as the other
-- checks under the lock are (a renewal of a row that expired a moment ago
-- may be committing); the full path has taken expired rows over first. A
-- semaphore acquire skips the read-only pass, whose checks look only at
-- live rows and which never takes a crashed holder's row over: every such
-- call decides under the per-key lock (it still writes nothing when it is
-- refused and has no marker, watch or ticket to write). Requests without a
-- limit evaluate p_limit = 0 and nothing else: the count is a subquery the
-- executor runs only when p_limit > 0.
--
-- With FIFO (SPEC W6), every ticket ahead of a semaphore waiter's blocks
-- it, so semaphore waiters are admitted in arrival order; a shared ticket
-- without a limit still waits only for exclusive tickets ahead.
--
-- The functions are edited from their own definitions (pg_get_functiondef,
-- which keeps their settings: lock_timeout and the planner settings of
-- 00004 and 00007), each edit checked to apply exactly as often as
-- expected, or the migration fails, changing nothing. A function's
-- signature cannot change in place, so each is dropped and created again
-- with its EXECUTE grants (grant options included) as they were.
--
-- {name} markers are rendered by the migrate package; do not run this file
-- as is.

-- +goose Up
-- +goose StatementBegin
DO $do$
DECLARE
    v_full constant text := 'p_limit > 0 AND p_limit <= (SELECT count(*) FROM {holders} c WHERE c.lock_key = p_key)';
    fns  constant text[] := ARRAY['{acquire}(text, text, text, text, bigint, bigint, bigint)',
                                  '{acquire_fifo}(text, text, text, text, bigint, bigint, bigint, text, bigint)'];
    -- Per function: (text, replacement, expected count) triples.
    edits text[][];
    f    regprocedure;
    def  text;
    acl  aclitem[];
    e    text[];
    n    int;
    g    record;
    v_ns oid;
    v_nm name;
BEGIN
    FOR i IN 1 .. 2 LOOP
        f := fns[i]::regprocedure;
        IF i = 1 THEN
            edits := ARRAY[
                ARRAY['p_watch_us bigint)', 'p_watch_us bigint, p_limit bigint DEFAULT 0)', '1'],
                ARRAY['(o.mode = ''x'' OR p_mode = ''x'')', '(o.mode = ''x'' OR p_mode = ''x'' OR ' || v_full || ')', '1'],
                ARRAY['(h.mode = ''x'' OR p_mode = ''x'')', '(h.mode = ''x'' OR p_mode = ''x'' OR ' || v_full || ')', '4'],
                ARRAY['IF p_marker_us = 0', 'IF p_limit = 0 AND p_marker_us = 0', '1']];
        ELSE
            edits := ARRAY[
                ARRAY['p_ticket_us bigint)', 'p_ticket_us bigint, p_limit bigint DEFAULT 0)', '1'],
                ARRAY['(h.mode = ''x'' OR p_mode = ''x'')', '(h.mode = ''x'' OR p_mode = ''x'' OR ' || v_full || ')', '4'],
                ARRAY['(t.mode = ''x'' OR p_mode = ''x'')', '(t.mode = ''x'' OR p_mode = ''x'' OR p_limit > 0)', '4'],
                ARRAY['IF p_ticket_us = 0 AND p_marker_us = 0', 'IF p_limit = 0 AND p_ticket_us = 0 AND p_marker_us = 0', '1']];
        END IF;
        def := pg_get_functiondef(f);
        FOREACH e SLICE 1 IN ARRAY edits LOOP
            n := (length(def) - length(replace(def, e[1], ''))) / length(e[1]);
            IF n <> e[3]::int THEN
                RAISE EXCEPTION 'sqlease: migration 00011: function % has % occurrences of "%", want %; nothing was changed', f, n, e[1], e[3];
            END IF;
            def := replace(def, e[1], e[2]);
        END LOOP;
        SELECT proacl, pronamespace, proname INTO acl, v_ns, v_nm FROM pg_proc WHERE oid = f;
        EXECUTE format('DROP FUNCTION %s', f);
        EXECUTE def;
        SELECT oid INTO f FROM pg_proc WHERE pronamespace = v_ns AND proname = v_nm;
        -- NULL proacl: the default, EXECUTE for PUBLIC, which the new
        -- function has too.
        IF acl IS NOT NULL THEN
            EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
            FOR g IN SELECT a.grantee, a.is_grantable FROM aclexplode(acl) a WHERE a.privilege_type = 'EXECUTE' LOOP
                -- PUBLIC (grantee 0) cannot hold a grant option.
                EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s%s', f,
                               CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE g.grantee::regrole::text END,
                               CASE WHEN g.is_grantable AND g.grantee <> 0 THEN ' WITH GRANT OPTION' ELSE '' END);
            END LOOP;
        END IF;
    END LOOP;
END
$do$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $do$
DECLARE
    v_full constant text := 'p_limit > 0 AND p_limit <= (SELECT count(*) FROM {holders} c WHERE c.lock_key = p_key)';
    fns  constant text[] := ARRAY['{acquire}(text, text, text, text, bigint, bigint, bigint, bigint)',
                                  '{acquire_fifo}(text, text, text, text, bigint, bigint, bigint, text, bigint, bigint)'];
    edits text[][];
    f    regprocedure;
    def  text;
    acl  aclitem[];
    e    text[];
    n    int;
    g    record;
    v_ns oid;
    v_nm name;
BEGIN
    FOR i IN 1 .. 2 LOOP
        f := fns[i]::regprocedure;
        IF i = 1 THEN
            edits := ARRAY[
                ARRAY['p_watch_us bigint, p_limit bigint DEFAULT 0)', 'p_watch_us bigint)', '1'],
                ARRAY['(o.mode = ''x'' OR p_mode = ''x'' OR ' || v_full || ')', '(o.mode = ''x'' OR p_mode = ''x'')', '1'],
                ARRAY['(h.mode = ''x'' OR p_mode = ''x'' OR ' || v_full || ')', '(h.mode = ''x'' OR p_mode = ''x'')', '4'],
                ARRAY['IF p_limit = 0 AND p_marker_us = 0', 'IF p_marker_us = 0', '1']];
        ELSE
            edits := ARRAY[
                ARRAY['p_ticket_us bigint, p_limit bigint DEFAULT 0)', 'p_ticket_us bigint)', '1'],
                ARRAY['(h.mode = ''x'' OR p_mode = ''x'' OR ' || v_full || ')', '(h.mode = ''x'' OR p_mode = ''x'')', '4'],
                ARRAY['(t.mode = ''x'' OR p_mode = ''x'' OR p_limit > 0)', '(t.mode = ''x'' OR p_mode = ''x'')', '4'],
                ARRAY['IF p_limit = 0 AND p_ticket_us = 0 AND p_marker_us = 0', 'IF p_ticket_us = 0 AND p_marker_us = 0', '1']];
        END IF;
        def := pg_get_functiondef(f);
        FOREACH e SLICE 1 IN ARRAY edits LOOP
            n := (length(def) - length(replace(def, e[1], ''))) / length(e[1]);
            IF n <> e[3]::int THEN
                RAISE EXCEPTION 'sqlease: reverting migration 00011: function % has % occurrences of "%", want %; nothing was changed', f, n, e[1], e[3];
            END IF;
            def := replace(def, e[1], e[2]);
        END LOOP;
        SELECT proacl, pronamespace, proname INTO acl, v_ns, v_nm FROM pg_proc WHERE oid = f;
        EXECUTE format('DROP FUNCTION %s', f);
        EXECUTE def;
        SELECT oid INTO f FROM pg_proc WHERE pronamespace = v_ns AND proname = v_nm;
        IF acl IS NOT NULL THEN
            EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
            FOR g IN SELECT a.grantee, a.is_grantable FROM aclexplode(acl) a WHERE a.privilege_type = 'EXECUTE' LOOP
                EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s%s', f,
                               CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE g.grantee::regrole::text END,
                               CASE WHEN g.is_grantable AND g.grantee <> 0 THEN ' WITH GRANT OPTION' ELSE '' END);
            END LOOP;
        END IF;
    END LOOP;
END
$do$;
-- +goose StatementEnd
