-- sqlease FIFO tickets for PostgreSQL (SPEC W6). {name} markers are rendered
-- to quoted, schema-qualified names by the migrate package; do not run this
-- file as is.

-- +goose Up
-- Ticket sequence numbers: drawn under the per-key lock, so per key they
-- increase in arrival (commit) order.
CREATE SEQUENCE {ticket_seq} AS bigint;

-- One row per FIFO waiter while it waits; it expires like a pending-writer
-- marker unless its waiter refreshes it, and is deleted when the waiter is
-- granted or gives up.
CREATE TABLE {tickets} (
    ticket_id  text PRIMARY KEY,
    lock_key   text NOT NULL,
    mode       text NOT NULL CHECK (mode IN ('x', 's')),
    owner      text NOT NULL,
    seq        bigint NOT NULL,
    queued_at  timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX ON {tickets} (lock_key, seq);

-- Acquire for FIFO waiters (SPEC W6, on top of S1, S2, S3, W1): as
-- {acquire}, plus the caller's ticket, and a grant only when no live ticket
-- ahead of it conflicts with the request.
-- +goose StatementBegin
CREATE FUNCTION {acquire_fifo}(p_key text, p_mode text, p_lease_id text, p_owner text, p_ttl_us bigint, p_marker_us bigint, p_watch_us bigint, p_ticket_id text, p_ticket_us bigint)
RETURNS TABLE (granted boolean, lease_id text, mode text, owner text, token bigint, expires_us bigint, now_us bigint)
LANGUAGE plpgsql VOLATILE
SET lock_timeout = '2s'
AS $fn$
#variable_conflict use_column
DECLARE
    v_seq     bigint;
    v_ahead   boolean;
    v_blocked boolean;
BEGIN
    -- Like {acquire}, the checks below need a fresh snapshot per statement
    -- (READ COMMITTED; SPEC S6): refuse any other level before doing
    -- anything, and the engine runs the call in an explicit READ COMMITTED
    -- transaction.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'sqlease: acquire needs READ COMMITTED, the transaction runs at %', current_setting('transaction_isolation')
            USING ERRCODE = 'SL001';
    END IF;

    IF p_mode NOT IN ('x', 's') THEN
        RAISE EXCEPTION 'sqlease: mode % is not x or s', p_mode USING ERRCODE = '22023';
    END IF;

    -- Read-only pass: a refused poll with nothing to write (no ticket
    -- refresh, marker or watch) writes nothing.
    IF p_ticket_us = 0 AND p_marker_us = 0
       AND (p_watch_us = 0 OR EXISTS (
            SELECT 1 FROM {watches} w
            WHERE w.lock_key = p_key AND w.expires_at > clock_timestamp() + (p_watch_us / 2) * interval '1 microsecond')) THEN
        SELECT t.seq INTO v_seq FROM {tickets} t
        WHERE t.ticket_id = p_ticket_id AND t.expires_at > clock_timestamp();
        IF EXISTS (SELECT 1 FROM {holders} h
                   WHERE h.lock_key = p_key AND h.expires_at > clock_timestamp()
                     AND (h.mode = 'x' OR p_mode = 'x'))
           OR EXISTS (SELECT 1 FROM {markers} m
                      WHERE m.lock_key = p_key AND m.expires_at > clock_timestamp()
                        AND m.waiter_id <> p_lease_id)
           OR EXISTS (SELECT 1 FROM {tickets} t
                      WHERE t.lock_key = p_key AND t.expires_at > clock_timestamp()
                        AND t.ticket_id <> p_ticket_id AND (v_seq IS NULL OR t.seq < v_seq)
                        AND (t.mode = 'x' OR p_mode = 'x')) THEN
            RETURN QUERY
                SELECT false, h.lease_id, h.mode, h.owner, h.token, {to_us}(h.expires_at), {to_us}(clock_timestamp())
                FROM {holders} h
                WHERE h.lock_key = p_key AND h.expires_at > clock_timestamp() AND (h.mode = 'x' OR p_mode = 'x')
                UNION ALL
                SELECT false, m.waiter_id, 'w', m.owner, 0::bigint, {to_us}(m.expires_at), {to_us}(clock_timestamp())
                FROM {markers} m
                WHERE m.lock_key = p_key AND m.expires_at > clock_timestamp()
                UNION ALL
                SELECT false, t.ticket_id, 'q', t.owner, t.seq, {to_us}(t.expires_at), {to_us}(clock_timestamp())
                FROM {tickets} t
                WHERE t.lock_key = p_key AND t.expires_at > clock_timestamp()
                  AND t.ticket_id <> p_ticket_id AND (v_seq IS NULL OR t.seq < v_seq)
                  AND (t.mode = 'x' OR p_mode = 'x');
            IF FOUND THEN
                RETURN;
            END IF;
        END IF;
    END IF;

    -- The same per-key lock as {acquire}: FIFO and default acquires of a
    -- key are serialized together (SPEC S5).
    PERFORM pg_advisory_xact_lock(hashtextextended(p_key, '{holders}'::regclass::oid::bigint));

    DELETE FROM {holders} h WHERE h.lock_key = p_key AND h.expires_at <= clock_timestamp();
    DELETE FROM {markers} m WHERE m.lock_key = p_key AND m.expires_at <= clock_timestamp();
    DELETE FROM {tickets} t WHERE t.lock_key = p_key AND t.expires_at <= clock_timestamp();

    IF p_ticket_us > 0 THEN
        INSERT INTO {tickets} AS t (ticket_id, lock_key, mode, owner, seq, queued_at, expires_at)
        SELECT p_ticket_id, p_key, p_mode, p_owner, nextval('{ticket_seq}'), clock_timestamp(),
               clock_timestamp() + p_ticket_us * interval '1 microsecond'
        WHERE NOT EXISTS (SELECT 1 FROM {tickets} o WHERE o.ticket_id = p_ticket_id);
        IF NOT FOUND THEN
            UPDATE {tickets} t SET expires_at = clock_timestamp() + p_ticket_us * interval '1 microsecond'
            WHERE t.ticket_id = p_ticket_id;
        END IF;
    END IF;
    SELECT t.seq INTO v_seq FROM {tickets} t WHERE t.ticket_id = p_ticket_id;

    v_ahead := EXISTS (SELECT 1 FROM {tickets} t
                       WHERE t.lock_key = p_key AND t.ticket_id <> p_ticket_id
                         AND (v_seq IS NULL OR t.seq < v_seq) AND (t.mode = 'x' OR p_mode = 'x'));
    -- Every holder row still present blocks, even one that expired a moment
    -- ago: a renewal of it may be committing right now.
    SELECT v_ahead
        OR EXISTS (SELECT 1 FROM {holders} h WHERE h.lock_key = p_key AND (h.mode = 'x' OR p_mode = 'x'))
        OR EXISTS (SELECT 1 FROM {markers} m WHERE m.lock_key = p_key AND m.waiter_id <> p_lease_id)
    INTO v_blocked;

    IF v_blocked THEN
        IF p_watch_us > 0 THEN
            INSERT INTO {watches} AS w (lock_key, expires_at)
            VALUES (p_key, clock_timestamp() + p_watch_us * interval '1 microsecond')
            ON CONFLICT (lock_key) DO UPDATE SET expires_at = EXCLUDED.expires_at
            WHERE w.expires_at < clock_timestamp() + (p_watch_us / 2) * interval '1 microsecond';
        END IF;
        -- Only the head of the queue claims the key against readers that do
        -- not queue (for an exclusive request every ticket ahead conflicts).
        IF p_mode = 'x' AND p_marker_us > 0 AND NOT v_ahead THEN
            INSERT INTO {markers} AS m (lock_key, waiter_id, owner, expires_at)
            VALUES (p_key, p_lease_id, p_owner, clock_timestamp() + p_marker_us * interval '1 microsecond')
            ON CONFLICT (lock_key) DO UPDATE SET expires_at = EXCLUDED.expires_at
            WHERE m.waiter_id = EXCLUDED.waiter_id;
        END IF;
        RETURN QUERY
            SELECT false, h.lease_id, h.mode, h.owner, h.token, {to_us}(h.expires_at), {to_us}(clock_timestamp())
            FROM {holders} h
            WHERE h.lock_key = p_key AND (h.mode = 'x' OR p_mode = 'x')
            UNION ALL
            SELECT false, m.waiter_id, 'w', m.owner, 0::bigint, {to_us}(m.expires_at), {to_us}(clock_timestamp())
            FROM {markers} m
            WHERE m.lock_key = p_key
            UNION ALL
            SELECT false, t.ticket_id, 'q', t.owner, t.seq, {to_us}(t.expires_at), {to_us}(clock_timestamp())
            FROM {tickets} t
            WHERE t.lock_key = p_key AND t.ticket_id <> p_ticket_id
              AND (v_seq IS NULL OR t.seq < v_seq) AND (t.mode = 'x' OR p_mode = 'x');
        RETURN;
    END IF;

    IF p_mode = 'x' THEN
        DELETE FROM {markers} m WHERE m.lock_key = p_key AND m.waiter_id = p_lease_id;
    END IF;
    DELETE FROM {tickets} t WHERE t.ticket_id = p_ticket_id;

    RETURN QUERY
        INSERT INTO {holders} AS h (lease_id, lock_key, mode, owner, token, acquired_at, expires_at)
        VALUES (p_lease_id, p_key, p_mode, p_owner, nextval('{token_seq}'),
                clock_timestamp(), clock_timestamp() + p_ttl_us * interval '1 microsecond')
        RETURNING true, h.lease_id, h.mode, h.owner, h.token, {to_us}(h.expires_at), {to_us}(clock_timestamp());
END
$fn$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION {acquire_fifo}(text, text, text, text, bigint, bigint, bigint, text, bigint);
DROP TABLE {tickets};
DROP SEQUENCE {ticket_seq};
