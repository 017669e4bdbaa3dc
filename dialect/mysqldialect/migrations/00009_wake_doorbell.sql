-- sqlease: push wake-ups for MariaDB 10.11+ (SPEC W2), which has no
-- LISTEN/NOTIFY: a doorbell. On MySQL 8 the tables and procedures are
-- installed, nothing listens, and nothing is rung. {name} markers are rendered by the
-- migrate package; do not run this file as is.
--
-- Each process with blocked waiters keeps one listening session per pool
-- and namespace (mysqldialect.Listen). The session takes a named lock,
-- GET_LOCK('sqlease:listener:' + a random tag), which it holds until it
-- ends, registers its CONNECTION_ID() and the tag in {listeners}, then
-- loops on CALL {listen}: the {wakes} rows after the last one it saw,
-- after waiting (up to a few seconds) when there are none yet. A blocked
-- waiter's refused attempt (p_watch_us > 0, sent only by blocking
-- acquires) upserts a {watches} row for its key ({watch}), in the
-- attempt's transaction. A release that deleted a lease of a watched key
-- then calls {wake} after its COMMIT: it appends a {wakes} row (the
-- dialect.Wake payload: the key, framed with the key's live marked waiter
-- when there is one) and sends KILL QUERY to every registered session that
-- still holds its named lock (IS_USED_LOCK names the holder's connection
-- ID: a stale registration, after the listener's session ended or the
-- server restarted and reused the ID, never interrupts another session).
-- The interrupted CALL fails, and the listener calls again and reads the
-- new rows. No wake-up is lost for longer than the wait: the wake row
-- commits before the KILL; {listen} waits only when a statement that began
-- after its start found no new row, and a KILL that arrives while the
-- listener runs no statement is covered by the next CALL's check.
--
-- {listen} waits in MASTER_GTID_WAIT on a position no server reaches
-- (MariaDB; on MySQL 8 the wait is compiled out and Listen refuses).
-- SLEEP would do, but MariaDB 10.11's KILL QUERY of a session in SLEEP
-- sometimes waits 2 s for SLEEP's server-wide mutex, in the releaser's
-- CALL. No table is locked while it waits: each statement of a procedure
-- in autocommit releases its metadata locks, so DDL and DROP DATABASE do
-- not wait for a listener.
--
-- Wake-ups are hints: {wake} swallows every error (a release that
-- committed never fails because of it), and a missed wake-up costs the
-- waiter one poll. The acquire hot path is unchanged: {watch} runs only in
-- a refused attempt of a blocking acquire. A release of an unwatched key
-- costs one primary-key lookup in {watches} (no nested CALL).
--
-- The hooks (the only changes to the procedures below, whose text is
-- otherwise that of migration 00008 for {acquire_limit} and {release} and
-- 00007 for {acquire_fifo}; each hook line ends with "-- 00009"):
--   {acquire_limit}, {acquire_fifo}: first line of the IF v_blocked branch:
--       CALL {watch}(p_key, p_watch_us);
--   {release}, MariaDB: the key released goes to a user variable, reset
--   first (SET @sqlease_released = NULL; ... RETURNING
--   (@sqlease_released := lock_key) AS lock_key), and after COMMIT:
--       IF EXISTS (SELECT 1 FROM {watches} WHERE lock_key = @sqlease_released) THEN CALL {wake}(@sqlease_released); END IF;
--   {release}, MySQL: last line, after the lock wait timeout reset:
--       IF EXISTS (SELECT 1 FROM {watches} WHERE lock_key = v_key) THEN CALL {wake}(v_key); END IF;

-- +goose Up
-- One row per listening session; expires_us is refreshed by the listener
-- while it runs. A row whose session ended is never rung (its named lock is
-- gone; a session takes it before it registers) and is deleted by the
-- next ring ({wake}), or once expired by a listener ({listen_start}).
CREATE TABLE {listeners} (
    conn_id    BIGINT UNSIGNED NOT NULL PRIMARY KEY,
    tag        VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    expires_us BIGINT NOT NULL
) ENGINE = InnoDB;

-- Keys with a blocked waiter in a listening process, until expires_us
-- (refreshed by each refused attempt; expired rows are deleted by
-- listeners).
CREATE TABLE {watches} (
    lock_key   VARBINARY(512) NOT NULL PRIMARY KEY,
    expires_us BIGINT NOT NULL
) ENGINE = InnoDB;

-- Releases of watched keys, with increasing sequence numbers: a listener
-- reads every row after the last it saw. Each {wake} deletes the row 1,024
-- before its own; listeners delete older rows left by gaps in the
-- sequence. A MEMORY table: a wake row is a hint written after the
-- release committed, so it needs no log flush of its own (InnoDB would
-- add one per handoff), and it is visible as soon as it is written. A
-- server restart empties it and ends every listening session, which
-- starts again from the new last row.
CREATE TABLE {wakes} (
    seq     BIGINT NOT NULL AUTO_INCREMENT,
    payload VARBINARY(600) NOT NULL,
    PRIMARY KEY USING BTREE (seq)
) ENGINE = MEMORY;

-- A refused waiter's interest in the key (p_watch_us > 0), in the caller's
-- transaction, when any process listens (none does on MySQL 8, see
-- mysqldialect.Listen).
-- +goose StatementBegin
CREATE PROCEDURE {watch}(IN p_key VARBINARY(512), IN p_watch_us BIGINT)
MODIFIES SQL DATA
SQL SECURITY INVOKER
BEGIN
    IF p_watch_us > 0 AND EXISTS (SELECT 1 FROM {listeners}) THEN
        INSERT INTO {watches} (lock_key, expires_us)
        VALUES (p_key, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) + p_watch_us)
        ON DUPLICATE KEY UPDATE expires_us = VALUES(expires_us);
    END IF;
END;
-- +goose StatementEnd

-- A listening session's registration (at its start, then every third of
-- p_ttl_us): its connection ID and tag until now + p_ttl_us, then a
-- cleanup of expired registrations and watches and of wake rows far
-- behind the last one (those a gap in the sequence left; {wake} deletes
-- the others), a few thousand at a time. Returns the last wake row's
-- sequence number (last_seq).
-- +goose StatementBegin
CREATE PROCEDURE {listen_start}(IN p_tag VARCHAR(64), IN p_ttl_us BIGINT)
MODIFIES SQL DATA
SQL SECURITY INVOKER
BEGIN
    DECLARE v_last BIGINT DEFAULT 0;
    SELECT COALESCE(MAX(seq), 0) INTO v_last FROM {wakes};
    INSERT INTO {listeners} (conn_id, tag, expires_us)
    VALUES (CONNECTION_ID(), p_tag, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) + p_ttl_us)
    ON DUPLICATE KEY UPDATE tag = VALUES(tag), expires_us = VALUES(expires_us);
    DELETE FROM {listeners} WHERE expires_us < TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) LIMIT 100;
    DELETE FROM {watches} WHERE expires_us < TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) LIMIT 5000;
    DELETE FROM {wakes} WHERE seq <= v_last - 2048 LIMIT 1000;
    SELECT v_last AS last_seq;
END;
-- +goose StatementEnd

-- One turn of a listening session: the wake rows after p_last, waiting up
-- to p_wait_s seconds first when there are none (see the top of this
-- file). The wait is MariaDB's (an executable comment); MySQL compiles
-- DO 0.
-- +goose StatementBegin
CREATE PROCEDURE {listen}(IN p_last BIGINT, IN p_wait_s INT)
READS SQL DATA
SQL SECURITY INVOKER
BEGIN
    IF NOT EXISTS (SELECT 1 FROM {wakes} WHERE seq > p_last) THEN
        DO 0 /*M!100000 + MASTER_GTID_WAIT('4294967295-4294967295-18446744073709551615', p_wait_s) */;
    END IF;
    SELECT seq, payload FROM {wakes} WHERE seq > p_last ORDER BY seq;
END;
-- +goose StatementEnd

-- The doorbell, after a release committed (see the top of this file).
-- Every error ends it quietly. KILL QUERY needs no privilege for sessions
-- of the same user; for others' it needs CONNECTION ADMIN or SUPER, and
-- without it their waiters poll.
-- +goose StatementBegin
CREATE PROCEDURE {wake}(IN p_key VARBINARY(512))
MODIFIES SQL DATA
SQL SECURITY INVOKER
wake: BEGIN
    DECLARE v_now BIGINT DEFAULT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6));
    DECLARE v_wait BIGINT DEFAULT @@SESSION.innodb_lock_wait_timeout;
    DECLARE v_target VARBINARY(64) DEFAULT NULL;
    DECLARE v_seq BIGINT;
    DECLARE v_id BIGINT UNSIGNED;
    DECLARE v_done INT DEFAULT 0;
    DECLARE c_listeners CURSOR FOR
        SELECT conn_id FROM {listeners}
        WHERE IS_USED_LOCK(CONCAT('sqlease:listener:', tag)) = conn_id;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = 1;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION SET SESSION innodb_lock_wait_timeout = v_wait;
    IF p_key IS NULL OR NOT EXISTS (SELECT 1 FROM {watches} WHERE lock_key = p_key AND expires_us > v_now) THEN
        LEAVE wake;
    END IF;
    SELECT waiter_id INTO v_target FROM {markers} WHERE lock_key = p_key AND expires_us > v_now;
    INSERT INTO {wakes} (payload)
    VALUES (IF(v_target IS NULL, p_key, CONCAT(CHAR(30), v_target, CHAR(30), p_key)));
    SET v_seq = LAST_INSERT_ID();
    DELETE FROM {wakes} WHERE seq = v_seq - 1024;
    SET v_done = 0;
    OPEN c_listeners;
    ring: LOOP
        FETCH c_listeners INTO v_id;
        IF v_done = 1 THEN
            LEAVE ring;
        END IF;
        BEGIN
            DECLARE CONTINUE HANDLER FOR SQLEXCEPTION BEGIN END;
            KILL QUERY v_id;
        END;
    END LOOP;
    CLOSE c_listeners;
    -- Registrations of ended sessions, after the ring.
    SET SESSION innodb_lock_wait_timeout = 1;
    DELETE FROM {listeners} WHERE IS_USED_LOCK(CONCAT('sqlease:listener:', tag)) IS NULL LIMIT 100;
    SET SESSION innodb_lock_wait_timeout = v_wait;
END;
-- +goose StatementEnd

/*!80000 DROP PROCEDURE IF EXISTS {acquire_limit} */ /*M!100103 DO 0 */;
-- +goose StatementBegin
CREATE /*M!100103 OR REPLACE */ PROCEDURE {acquire_limit}(
    IN p_key VARBINARY(512), IN p_mode VARCHAR(1), IN p_lease_id VARBINARY(64),
    IN p_owner VARCHAR(256) CHARACTER SET utf8mb4,
    IN p_ttl_us BIGINT, IN p_marker_us BIGINT, IN p_watch_us BIGINT, IN p_limit BIGINT)
MODIFIES SQL DATA
SQL SECURITY INVOKER
BEGIN
    DECLARE v_lock VARCHAR(64) DEFAULT CONCAT('sqlease:', SHA1(CONCAT('{holders}', ':', p_key)));
    DECLARE v_wait BIGINT DEFAULT @@SESSION.innodb_lock_wait_timeout;
    DECLARE v_got INT DEFAULT NULL;
    DECLARE v_busy INT DEFAULT 0;
    DECLARE v_paused INT DEFAULT 0;
    DECLARE v_token BIGINT;
    DECLARE v_now BIGINT;
    DECLARE v_id VARBINARY(64);
    DECLARE v_done INT DEFAULT 0;
    DECLARE v_blocked INT DEFAULT 0;
    DECLARE c_expired CURSOR FOR
        SELECT h.lease_id FROM {holders} h JOIN {expiry} e ON e.lease_id = h.lease_id
        WHERE h.lock_key = p_key AND e.expires_us <= v_now;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = 1;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION
    BEGIN
        ROLLBACK;
        IF v_got = 1 THEN
            DO RELEASE_LOCK(v_lock);
        END IF;
        IF v_busy THEN
            SET SESSION innodb_lock_wait_timeout = v_wait;
        END IF;
        RESIGNAL;
    END;

    IF p_mode IS NULL OR p_mode NOT IN ('x', 's') THEN
        SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = 'sqlease: mode is not x or s';
    END IF;
    SET v_got = GET_LOCK(v_lock, 2);
    IF v_got IS NULL OR v_got <> 1 THEN
        SET v_got = NULL;
        SIGNAL SQLSTATE 'HY000' SET MYSQL_ERRNO = 1205, MESSAGE_TEXT = 'sqlease: timed out waiting for the per-key lock';
    END IF;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    START TRANSACTION;

    -- After the per-key lock: whether the key has a holder row or a
    -- marker, by locking reads (see the top of this file: a consistent
    -- read here missed a holder committed just before this call took the
    -- per-key lock); then the clock (SPEC S2) and whether the failover
    -- pause refuses grants here (SPEC S7; migration 00003; checked below
    -- where 00004 checked it).
    SELECT 1 INTO v_busy FROM {holders} FORCE INDEX (lock_key) WHERE lock_key = p_key LIMIT 1 LOCK IN SHARE MODE;
    IF NOT v_busy THEN
        SELECT 1 INTO v_busy FROM {markers} WHERE lock_key = p_key LOCK IN SHARE MODE;
    END IF;
    SET v_done = 0;
    SELECT EXISTS (SELECT 1 FROM {epoch} WHERE id = 1 AND pause_us > 0 AND (
                server <> CONCAT(@@server_id, '/' /*M!100000 , @@hostname, ':', @@port */ /*!80000 , @@server_uuid */)
                OR since_us + pause_us > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)))),
        TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))
    INTO v_paused, v_now;

    IF v_busy THEN
        -- The key has rows: migration 00004's path. Lock waits are bounded
        -- (2 s): the procedure then fails with error 1205 and the engine
        -- polls again. Each expired candidate row is locked first: that
        -- waits for fenced transactions holding it in share mode (SPEC F1)
        -- and for renewals in flight (they hold it in share mode too); the
        -- expiry is then re-checked with the clock read after the wait.
        SET SESSION innodb_lock_wait_timeout = 2;
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

        -- Every holder row still present blocks, even one that expired a
        -- moment ago: a renewal of it may be committing right now. A
        -- semaphore request (p_limit > 0) is refused while the key has
        -- p_limit rows, counted under the per-key lock (SPEC W7).
        SELECT EXISTS (SELECT 1 FROM {holders} h WHERE h.lock_key = p_key AND (h.mode = 'x' OR p_mode = 'x' OR p_limit > 0 AND p_limit <= (SELECT COUNT(*) FROM {holders} c WHERE c.lock_key = p_key)))
            OR EXISTS (SELECT 1 FROM {markers} m WHERE m.lock_key = p_key AND m.waiter_id <> p_lease_id)
        INTO v_blocked;
    END IF;

    IF v_blocked THEN
        CALL {watch}(p_key, p_watch_us); -- 00009: push wake-ups
        IF p_mode = 'x' AND p_marker_us > 0 THEN
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
        FROM {markers} m WHERE m.lock_key = p_key;
    ELSE
        IF v_busy THEN
            IF p_mode = 'x' THEN
                DELETE FROM {markers} WHERE lock_key = p_key AND waiter_id = p_lease_id;
            END IF;
            -- The clock after the takeovers' lock waits (SPEC S2).
            SET v_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6));
        END IF;
        -- The failover pause: the exit handler rolls back what this call
        -- wrote (takeovers, markers) and releases the per-key lock.
        IF v_paused THEN
            SIGNAL SQLSTATE 'SL002' SET MESSAGE_TEXT = 'sqlease: failover pause: this primary grants nothing until the pause after it was first seen ends';
        END IF;
        -- The token (SPEC S3, S7): GREATEST(counter, clock); see the top
        -- of this file.
        INSERT INTO {holders} (lease_id, lock_key, mode, owner, acquired_us)
        VALUES (p_lease_id, p_key, p_mode, p_owner, v_now);
        SET v_token = LAST_INSERT_ID();
        IF v_token < v_now THEN
            UPDATE {holders} SET token = v_now WHERE lease_id = p_lease_id;
            SET v_token = v_now;
        END IF;
        INSERT INTO {expiry} (lease_id, expires_us) VALUES (p_lease_id, v_now + p_ttl_us);
        SELECT 1 AS granted, p_lease_id AS lease_id, p_mode AS mode, p_owner AS owner, v_token AS token,
               v_now + p_ttl_us AS expires_us, v_now AS now_us;
    END IF;
    COMMIT;
    DO RELEASE_LOCK(v_lock);
    IF v_busy THEN
        SET SESSION innodb_lock_wait_timeout = v_wait;
    END IF;
END;
-- +goose StatementEnd

/*!80000 DROP PROCEDURE IF EXISTS {acquire_fifo} */ /*M!100103 DO 0 */;
-- +goose StatementBegin
CREATE /*M!100103 OR REPLACE */ PROCEDURE {acquire_fifo}(
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
        CALL {watch}(p_key, p_watch_us); -- 00009: push wake-ups
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

/*!80000 DROP PROCEDURE IF EXISTS {release} */ /*M!100103 DO 0 */;
-- +goose StatementBegin
CREATE /*M!100103 OR REPLACE */ PROCEDURE {release}(IN p_lease_id VARBINARY(64), IN p_token BIGINT)
MODIFIES SQL DATA
SQL SECURITY INVOKER
BEGIN
    /*M!100500
    DECLARE EXIT HANDLER FOR SQLEXCEPTION
    BEGIN
        ROLLBACK;
        RESIGNAL;
    END;
    SET @sqlease_released = NULL; -- 00009: push wake-ups
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    START TRANSACTION;
    SET STATEMENT innodb_lock_wait_timeout = 5 FOR
    DELETE FROM {holders} WHERE lease_id = p_lease_id AND (token = p_token OR p_token = 0)
    RETURNING (@sqlease_released := lock_key) AS lock_key; -- 00009: push wake-ups
    COMMIT;
    IF EXISTS (SELECT 1 FROM {watches} WHERE lock_key = @sqlease_released) THEN CALL {wake}(@sqlease_released); END IF; -- 00009: push wake-ups
    */
    /*!80000
    DECLARE v_wait BIGINT DEFAULT @@SESSION.innodb_lock_wait_timeout;
    DECLARE v_key VARBINARY(512) DEFAULT NULL;
    DECLARE CONTINUE HANDLER FOR NOT FOUND BEGIN END;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION
    BEGIN
        ROLLBACK;
        SET SESSION innodb_lock_wait_timeout = v_wait;
        RESIGNAL;
    END;
    SET SESSION innodb_lock_wait_timeout = 5;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    START TRANSACTION;
    SELECT lock_key INTO v_key FROM {holders}
    WHERE lease_id = p_lease_id AND (token = p_token OR p_token = 0) FOR UPDATE;
    IF v_key IS NOT NULL THEN
        DELETE FROM {holders} WHERE lease_id = p_lease_id;
        SELECT v_key AS lock_key;
    END IF;
    COMMIT;
    SET SESSION innodb_lock_wait_timeout = v_wait;
    IF EXISTS (SELECT 1 FROM {watches} WHERE lock_key = v_key) THEN CALL {wake}(v_key); END IF; -- 00009: push wake-ups
    */
END;
-- +goose StatementEnd

-- +goose Down
/*!80000 DROP PROCEDURE IF EXISTS {acquire_limit} */ /*M!100103 DO 0 */;
-- +goose StatementBegin
CREATE /*M!100103 OR REPLACE */ PROCEDURE {acquire_limit}(
    IN p_key VARBINARY(512), IN p_mode VARCHAR(1), IN p_lease_id VARBINARY(64),
    IN p_owner VARCHAR(256) CHARACTER SET utf8mb4,
    IN p_ttl_us BIGINT, IN p_marker_us BIGINT, IN p_watch_us BIGINT, IN p_limit BIGINT)
MODIFIES SQL DATA
SQL SECURITY INVOKER
BEGIN
    DECLARE v_lock VARCHAR(64) DEFAULT CONCAT('sqlease:', SHA1(CONCAT('{holders}', ':', p_key)));
    DECLARE v_wait BIGINT DEFAULT @@SESSION.innodb_lock_wait_timeout;
    DECLARE v_got INT DEFAULT NULL;
    DECLARE v_busy INT DEFAULT 0;
    DECLARE v_paused INT DEFAULT 0;
    DECLARE v_token BIGINT;
    DECLARE v_now BIGINT;
    DECLARE v_id VARBINARY(64);
    DECLARE v_done INT DEFAULT 0;
    DECLARE v_blocked INT DEFAULT 0;
    DECLARE c_expired CURSOR FOR
        SELECT h.lease_id FROM {holders} h JOIN {expiry} e ON e.lease_id = h.lease_id
        WHERE h.lock_key = p_key AND e.expires_us <= v_now;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = 1;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION
    BEGIN
        ROLLBACK;
        IF v_got = 1 THEN
            DO RELEASE_LOCK(v_lock);
        END IF;
        IF v_busy THEN
            SET SESSION innodb_lock_wait_timeout = v_wait;
        END IF;
        RESIGNAL;
    END;

    IF p_mode IS NULL OR p_mode NOT IN ('x', 's') THEN
        SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = 'sqlease: mode is not x or s';
    END IF;
    SET v_got = GET_LOCK(v_lock, 2);
    IF v_got IS NULL OR v_got <> 1 THEN
        SET v_got = NULL;
        SIGNAL SQLSTATE 'HY000' SET MYSQL_ERRNO = 1205, MESSAGE_TEXT = 'sqlease: timed out waiting for the per-key lock';
    END IF;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    START TRANSACTION;

    -- After the per-key lock: whether the key has a holder row or a
    -- marker, by locking reads (see the top of this file: a consistent
    -- read here missed a holder committed just before this call took the
    -- per-key lock); then the clock (SPEC S2) and whether the failover
    -- pause refuses grants here (SPEC S7; migration 00003; checked below
    -- where 00004 checked it).
    SELECT 1 INTO v_busy FROM {holders} FORCE INDEX (lock_key) WHERE lock_key = p_key LIMIT 1 LOCK IN SHARE MODE;
    IF NOT v_busy THEN
        SELECT 1 INTO v_busy FROM {markers} WHERE lock_key = p_key LOCK IN SHARE MODE;
    END IF;
    SET v_done = 0;
    SELECT EXISTS (SELECT 1 FROM {epoch} WHERE id = 1 AND pause_us > 0 AND (
                server <> CONCAT(@@server_id, '/' /*M!100000 , @@hostname, ':', @@port */ /*!80000 , @@server_uuid */)
                OR since_us + pause_us > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)))),
        TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))
    INTO v_paused, v_now;

    IF v_busy THEN
        -- The key has rows: migration 00004's path. Lock waits are bounded
        -- (2 s): the procedure then fails with error 1205 and the engine
        -- polls again. Each expired candidate row is locked first: that
        -- waits for fenced transactions holding it in share mode (SPEC F1)
        -- and for renewals in flight (they hold it in share mode too); the
        -- expiry is then re-checked with the clock read after the wait.
        SET SESSION innodb_lock_wait_timeout = 2;
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

        -- Every holder row still present blocks, even one that expired a
        -- moment ago: a renewal of it may be committing right now. A
        -- semaphore request (p_limit > 0) is refused while the key has
        -- p_limit rows, counted under the per-key lock (SPEC W7).
        SELECT EXISTS (SELECT 1 FROM {holders} h WHERE h.lock_key = p_key AND (h.mode = 'x' OR p_mode = 'x' OR p_limit > 0 AND p_limit <= (SELECT COUNT(*) FROM {holders} c WHERE c.lock_key = p_key)))
            OR EXISTS (SELECT 1 FROM {markers} m WHERE m.lock_key = p_key AND m.waiter_id <> p_lease_id)
        INTO v_blocked;
    END IF;

    IF v_blocked THEN
        IF p_mode = 'x' AND p_marker_us > 0 THEN
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
        FROM {markers} m WHERE m.lock_key = p_key;
    ELSE
        IF v_busy THEN
            IF p_mode = 'x' THEN
                DELETE FROM {markers} WHERE lock_key = p_key AND waiter_id = p_lease_id;
            END IF;
            -- The clock after the takeovers' lock waits (SPEC S2).
            SET v_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6));
        END IF;
        -- The failover pause: the exit handler rolls back what this call
        -- wrote (takeovers, markers) and releases the per-key lock.
        IF v_paused THEN
            SIGNAL SQLSTATE 'SL002' SET MESSAGE_TEXT = 'sqlease: failover pause: this primary grants nothing until the pause after it was first seen ends';
        END IF;
        -- The token (SPEC S3, S7): GREATEST(counter, clock); see the top
        -- of this file.
        INSERT INTO {holders} (lease_id, lock_key, mode, owner, acquired_us)
        VALUES (p_lease_id, p_key, p_mode, p_owner, v_now);
        SET v_token = LAST_INSERT_ID();
        IF v_token < v_now THEN
            UPDATE {holders} SET token = v_now WHERE lease_id = p_lease_id;
            SET v_token = v_now;
        END IF;
        INSERT INTO {expiry} (lease_id, expires_us) VALUES (p_lease_id, v_now + p_ttl_us);
        SELECT 1 AS granted, p_lease_id AS lease_id, p_mode AS mode, p_owner AS owner, v_token AS token,
               v_now + p_ttl_us AS expires_us, v_now AS now_us;
    END IF;
    COMMIT;
    DO RELEASE_LOCK(v_lock);
    IF v_busy THEN
        SET SESSION innodb_lock_wait_timeout = v_wait;
    END IF;
END;
-- +goose StatementEnd

/*!80000 DROP PROCEDURE IF EXISTS {acquire_fifo} */ /*M!100103 DO 0 */;
-- +goose StatementBegin
CREATE /*M!100103 OR REPLACE */ PROCEDURE {acquire_fifo}(
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

/*!80000 DROP PROCEDURE IF EXISTS {release} */ /*M!100103 DO 0 */;
-- +goose StatementBegin
CREATE /*M!100103 OR REPLACE */ PROCEDURE {release}(IN p_lease_id VARBINARY(64), IN p_token BIGINT)
MODIFIES SQL DATA
SQL SECURITY INVOKER
BEGIN
    /*M!100500
    DECLARE EXIT HANDLER FOR SQLEXCEPTION
    BEGIN
        ROLLBACK;
        RESIGNAL;
    END;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    START TRANSACTION;
    SET STATEMENT innodb_lock_wait_timeout = 5 FOR
    DELETE FROM {holders} WHERE lease_id = p_lease_id AND (token = p_token OR p_token = 0)
    RETURNING lock_key;
    COMMIT;
    */
    /*!80000
    DECLARE v_wait BIGINT DEFAULT @@SESSION.innodb_lock_wait_timeout;
    DECLARE v_key VARBINARY(512) DEFAULT NULL;
    DECLARE CONTINUE HANDLER FOR NOT FOUND BEGIN END;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION
    BEGIN
        ROLLBACK;
        SET SESSION innodb_lock_wait_timeout = v_wait;
        RESIGNAL;
    END;
    SET SESSION innodb_lock_wait_timeout = 5;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    START TRANSACTION;
    SELECT lock_key INTO v_key FROM {holders}
    WHERE lease_id = p_lease_id AND (token = p_token OR p_token = 0) FOR UPDATE;
    IF v_key IS NOT NULL THEN
        DELETE FROM {holders} WHERE lease_id = p_lease_id;
        SELECT v_key AS lock_key;
    END IF;
    COMMIT;
    SET SESSION innodb_lock_wait_timeout = v_wait;
    */
END;
-- +goose StatementEnd
DROP PROCEDURE IF EXISTS {wake};
DROP PROCEDURE IF EXISTS {listen};
DROP PROCEDURE IF EXISTS {listen_start};
DROP PROCEDURE IF EXISTS {watch};
DROP TABLE IF EXISTS {wakes};
DROP TABLE IF EXISTS {watches};
DROP TABLE IF EXISTS {listeners};
