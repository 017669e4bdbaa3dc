-- sqlease: strict FIFO waiters (SPEC W6) for MySQL 8 and MariaDB 10.11+.
-- A blocking acquire with lock.FIFO() keeps a ticket row while it waits,
-- and is granted only when no live ticket ahead of its own conflicts with
-- it. {name} markers are rendered by the migrate package; do not run this
-- file as is.
--
-- Tickets are drawn under the per-key named lock (GET_LOCK) of the acquire
-- procedures, the same lock and the same name as {acquire_limit}'s, so FIFO
-- and default acquires of a key are serialized together (SPEC S1, S5) and
-- the AUTO_INCREMENT sequence numbers of a key's tickets increase in arrival
-- order. A migration that changes how {acquire_limit} serializes a key must
-- change {acquire_fifo} with it (W6_StressMixedFIFOAndDefaultAcrossProcesses
-- runs both on one key).
--
-- Nothing that existed before changes: the procedures below are new, and
-- {sweep_fifo} deletes expired tickets, then calls {sweep}.

-- +goose Up
-- One row per FIFO waiter while it waits; it expires like a pending-writer
-- marker unless its waiter refreshes it, and is deleted when the waiter is
-- granted or gives up. seq is the waiter's place in the queue of its key.
CREATE TABLE {tickets} (
    ticket_id  VARBINARY(64) NOT NULL PRIMARY KEY,
    lock_key   VARBINARY(512) NOT NULL,
    mode       CHAR(1) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    owner      VARCHAR(256) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    seq        BIGINT NOT NULL AUTO_INCREMENT,
    queued_us  BIGINT NOT NULL,
    expires_us BIGINT NOT NULL,
    UNIQUE KEY (seq),
    KEY (lock_key, seq)
) ENGINE = InnoDB;

-- Acquire for FIFO waiters (dialect.Statements.AcquireFIFO; SPEC W6 on top
-- of S1, S2, S3, W1, W7): {acquire_limit} plus the caller's ticket. Under
-- the per-key lock, after the takeover of expired holders, markers and
-- tickets of the key: when p_ticket_us > 0 the caller's ticket is inserted
-- at the end of the queue, or its expiry moved to now + p_ticket_us when it
-- exists; a caller without a live ticket (a try) is behind every ticket.
-- The request is refused while a ticket ahead of the caller's conflicts
-- with it (an exclusive one for a shared request; any for an exclusive or
-- a semaphore request), on top of {acquire_limit}'s checks, and the refusal
-- rows list those tickets with mode 'q' and token = seq. Only the head of
-- the queue sets the pending-writer marker. A grant deletes the caller's
-- ticket. p_watch_us is unused (no notifications).
-- +goose StatementBegin
CREATE PROCEDURE {acquire_fifo}(
    IN p_key VARBINARY(512), IN p_mode VARCHAR(1), IN p_lease_id VARBINARY(64),
    IN p_owner VARCHAR(256) CHARACTER SET utf8mb4,
    IN p_ttl_us BIGINT, IN p_marker_us BIGINT, IN p_watch_us BIGINT,
    IN p_ticket_id VARBINARY(64), IN p_ticket_us BIGINT, IN p_limit BIGINT)
MODIFIES SQL DATA
SQL SECURITY INVOKER
BEGIN
    DECLARE v_lock VARCHAR(64) DEFAULT CONCAT('sqlease:', SHA1(CONCAT('{holders}', ':', p_key)));
    DECLARE v_wait BIGINT DEFAULT @@SESSION.innodb_lock_wait_timeout;
    DECLARE v_got INT DEFAULT NULL;
    DECLARE v_tlock VARCHAR(64) DEFAULT CONCAT('sqlease:t:', SHA1('{holders}'));
    DECLARE v_tgot INT DEFAULT NULL;
    DECLARE v_token BIGINT;
    DECLARE v_now BIGINT;
    DECLARE v_id VARBINARY(64);
    DECLARE v_seq BIGINT DEFAULT NULL;
    DECLARE v_done INT DEFAULT 0;
    DECLARE v_ahead INT DEFAULT 0;
    DECLARE v_blocked INT DEFAULT 0;
    DECLARE c_expired CURSOR FOR
        SELECT h.lease_id FROM {holders} h JOIN {expiry} e ON e.lease_id = h.lease_id
        WHERE h.lock_key = p_key AND e.expires_us <= v_now;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = 1;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION
    BEGIN
        ROLLBACK;
        IF v_tgot = 1 THEN
            DO RELEASE_LOCK(v_tlock);
        END IF;
        IF v_got = 1 THEN
            DO RELEASE_LOCK(v_lock);
        END IF;
        SET SESSION innodb_lock_wait_timeout = v_wait;
        RESIGNAL;
    END;

    IF p_mode IS NULL OR p_mode NOT IN ('x', 's') THEN
        SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = 'sqlease: mode is not x or s';
    END IF;
    SET SESSION innodb_lock_wait_timeout = 2;
    SET v_got = GET_LOCK(v_lock, 2);
    IF v_got IS NULL OR v_got <> 1 THEN
        SET v_got = NULL;
        SIGNAL SQLSTATE 'HY000' SET MYSQL_ERRNO = 1205, MESSAGE_TEXT = 'sqlease: timed out waiting for the per-key lock';
    END IF;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    START TRANSACTION;

    -- Takeover of expired holders, as in {acquire_limit}: each candidate
    -- row is locked first (waiting for fences and renewals), then its
    -- expiry is re-checked with the clock read after the wait.
    SET v_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6));
    OPEN c_expired;
    takeover: LOOP
        FETCH c_expired INTO v_id;
        IF v_done = 1 THEN
            LEAVE takeover;
        END IF;
        SELECT lease_id INTO v_id FROM {holders} WHERE lease_id = v_id FOR UPDATE;
        SET v_done = 0;
        DELETE FROM {holders} WHERE lease_id = v_id AND EXISTS (
            SELECT 1 FROM {expiry} e WHERE e.lease_id = v_id
              AND e.expires_us <= TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)));
    END LOOP;
    CLOSE c_expired;
    DELETE FROM {markers} WHERE lock_key = p_key
      AND expires_us <= TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6));
    DELETE FROM {tickets} WHERE lock_key = p_key
      AND expires_us <= TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6));

    -- The caller's place: its live ticket, a new one at the end of the
    -- queue, or none (a try, or a waiter whose ticket expired and that
    -- writes none on this attempt).
    SELECT seq INTO v_seq FROM {tickets} WHERE ticket_id = p_ticket_id;
    IF p_ticket_us > 0 THEN
        SET v_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6));
        IF v_seq IS NULL THEN
            INSERT INTO {tickets} (ticket_id, lock_key, mode, owner, queued_us, expires_us)
            VALUES (p_ticket_id, p_key, p_mode, p_owner, v_now, v_now + p_ticket_us);
            SET v_seq = LAST_INSERT_ID();
        ELSE
            UPDATE {tickets} SET expires_us = v_now + p_ticket_us WHERE ticket_id = p_ticket_id;
        END IF;
    END IF;

    SELECT EXISTS (SELECT 1 FROM {tickets} t
                   WHERE t.lock_key = p_key AND t.ticket_id <> p_ticket_id
                     AND (v_seq IS NULL OR t.seq < v_seq)
                     AND (t.mode = 'x' OR p_mode = 'x' OR p_limit > 0))
    INTO v_ahead;
    -- Every holder row still present blocks, even one that expired a moment
    -- ago: a renewal of it may be committing right now. A semaphore request
    -- counts the key's rows under the per-key lock, as {acquire_limit}.
    SELECT v_ahead
        OR EXISTS (SELECT 1 FROM {holders} h WHERE h.lock_key = p_key AND (h.mode = 'x' OR p_mode = 'x' OR p_limit > 0 AND p_limit <= (SELECT COUNT(*) FROM {holders} c WHERE c.lock_key = p_key)))
        OR EXISTS (SELECT 1 FROM {markers} m WHERE m.lock_key = p_key AND m.waiter_id <> p_lease_id)
    INTO v_blocked;

    IF v_blocked THEN
        -- Only the head of the queue claims the key against readers that
        -- do not queue (for an exclusive request every ticket ahead
        -- conflicts).
        IF p_mode = 'x' AND p_marker_us > 0 AND NOT v_ahead THEN
            INSERT INTO {markers} (lock_key, waiter_id, owner, expires_us)
            VALUES (p_key, p_lease_id, p_owner,
                    TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) + p_marker_us)
            ON DUPLICATE KEY UPDATE expires_us = IF(waiter_id = VALUES(waiter_id), VALUES(expires_us), expires_us);
        END IF;
        SELECT 0 AS granted, h.lease_id, h.mode, h.owner, h.token, e.expires_us,
               TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) AS now_us
        FROM {holders} h JOIN {expiry} e ON e.lease_id = h.lease_id
        WHERE h.lock_key = p_key AND (h.mode = 'x' OR p_mode = 'x' OR p_limit > 0 AND p_limit <= (SELECT COUNT(*) FROM {holders} c WHERE c.lock_key = p_key))
        UNION ALL
        SELECT 0, m.waiter_id, 'w', m.owner, 0, m.expires_us,
               TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))
        FROM {markers} m WHERE m.lock_key = p_key
        UNION ALL
        SELECT 0, t.ticket_id, 'q', t.owner, t.seq, t.expires_us,
               TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))
        FROM {tickets} t
        WHERE t.lock_key = p_key AND t.ticket_id <> p_ticket_id
          AND (v_seq IS NULL OR t.seq < v_seq)
          AND (t.mode = 'x' OR p_mode = 'x' OR p_limit > 0);
    ELSE
        IF p_mode = 'x' THEN
            DELETE FROM {markers} WHERE lock_key = p_key AND waiter_id = p_lease_id;
        END IF;
        DELETE FROM {tickets} WHERE ticket_id = p_ticket_id;
        -- The failover pause and the token draw, as in {acquire_limit}
        -- (SPEC S3, S7; migrations 00002 and 00003).
        IF EXISTS (SELECT 1 FROM {epoch} WHERE id = 1 AND pause_us > 0 AND (
                server <> CONCAT(@@server_id, '/' /*M!100000 , @@hostname, ':', @@port */ /*!80000 , @@server_uuid */)
                OR since_us + pause_us > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)))) THEN
            SIGNAL SQLSTATE 'SL002' SET MESSAGE_TEXT = 'sqlease: failover pause: this primary grants nothing until the pause after it was first seen ends';
        END IF;
        SET v_tgot = GET_LOCK(v_tlock, 2);
        IF v_tgot IS NULL OR v_tgot <> 1 THEN
            SET v_tgot = NULL;
            SIGNAL SQLSTATE 'HY000' SET MYSQL_ERRNO = 1205, MESSAGE_TEXT = 'sqlease: timed out waiting for the token lock';
        END IF;
        SET v_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6));
        INSERT INTO {holders} (lease_id, lock_key, mode, owner, acquired_us)
        VALUES (p_lease_id, p_key, p_mode, p_owner, v_now);
        SET v_token = LAST_INSERT_ID();
        IF v_token < v_now THEN
            UPDATE {holders} SET token = v_now WHERE lease_id = p_lease_id;
        END IF;
        DO RELEASE_LOCK(v_tlock);
        SET v_tgot = NULL;
        INSERT INTO {expiry} (lease_id, expires_us) VALUES (p_lease_id, v_now + p_ttl_us);
        SELECT 1 AS granted, h.lease_id, h.mode, h.owner, h.token, v_now + p_ttl_us AS expires_us, v_now AS now_us
        FROM {holders} h WHERE h.lease_id = p_lease_id;
    END IF;
    COMMIT;
    DO RELEASE_LOCK(v_lock);
    SET SESSION innodb_lock_wait_timeout = v_wait;
END;
-- +goose StatementEnd

-- A FIFO waiter that gives up deletes its ticket (dialect.Statements.Dequeue;
-- SPEC W6). READ COMMITTED, as {clear_marker}: a DELETE that finds no row
-- takes no gap lock another waiter's insert could wait for.
-- +goose StatementBegin
CREATE PROCEDURE {dequeue}(IN p_ticket_id VARBINARY(64))
MODIFIES SQL DATA
SQL SECURITY INVOKER
BEGIN
    DECLARE EXIT HANDLER FOR SQLEXCEPTION
    BEGIN
        ROLLBACK;
        RESIGNAL;
    END;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    START TRANSACTION;
    DELETE FROM {tickets} WHERE ticket_id = p_ticket_id;
    COMMIT;
END;
-- +goose StatementEnd

-- The sweep of this version (SPEC D2): deletes at most p_limit expired
-- tickets in a short READ COMMITTED transaction of its own, then calls
-- {sweep}, whose one row (the number of holder rows deleted) is the
-- result. Like {sweep}'s holders, one ticket at a time, skipping tickets
-- another transaction holds (SKIP LOCKED): a FIFO acquire deleting its
-- key's expired tickets never waits for the sweep while the sweep waits for
-- it (the two would lock one key's tickets in different index orders).
-- +goose StatementBegin
CREATE PROCEDURE {sweep_fifo}(IN p_limit BIGINT)
MODIFIES SQL DATA
SQL SECURITY INVOKER
BEGIN
    DECLARE v_n BIGINT DEFAULT 0;
    DECLARE v_last VARBINARY(64) DEFAULT '';
    DECLARE v_id VARBINARY(64);
    DECLARE CONTINUE HANDLER FOR NOT FOUND BEGIN END;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION
    BEGIN
        ROLLBACK;
        RESIGNAL;
    END;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    START TRANSACTION;
    sweep: WHILE v_n < p_limit DO
        SET v_id = NULL;
        SELECT ticket_id INTO v_id FROM {tickets}
        WHERE ticket_id > v_last
          AND expires_us <= TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))
        ORDER BY ticket_id LIMIT 1
        FOR UPDATE SKIP LOCKED;
        IF v_id IS NULL THEN
            LEAVE sweep;
        END IF;
        SET v_last = v_id;
        DELETE FROM {tickets} WHERE ticket_id = v_id;
        SET v_n = v_n + 1;
    END WHILE;
    COMMIT;
    CALL {sweep}(p_limit);
END;
-- +goose StatementEnd

-- +goose Down
DROP PROCEDURE IF EXISTS {sweep_fifo};
DROP PROCEDURE IF EXISTS {dequeue};
DROP PROCEDURE IF EXISTS {acquire_fifo};
DROP TABLE IF EXISTS {tickets};
