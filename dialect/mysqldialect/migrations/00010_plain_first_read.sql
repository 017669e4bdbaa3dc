-- sqlease: a cheaper first read in MySQL/MariaDB's acquire (docs/
-- performance.md, "MySQL and MariaDB"). After the per-key lock, the
-- acquire procedure of migration 00008 asked whether the key has a holder
-- row or a marker by locking reads (LOCK IN SHARE MODE). A key that is
-- granted and released over and over leaves one delete-marked entry per
-- release in the holders' lock_key index until InnoDB's purge removes it
-- (a history list of 300-1,500 in a one-key loop here), and a locking read
-- in READ COMMITTED takes and drops a record lock on each entry it steps
-- over: measured with the server's CPU time (perf stat) over 2,000 calls
-- in a loop on the server, the grant of a free key cost 595-635 µs with
-- the locking reads and 352-385 µs with plain reads, everything else the
-- same (the raw lease's INSERT ... ON DUPLICATE KEY UPDATE and DELETE
-- together: 130-142 µs).
--
-- The reads are now plain single-table SELECTs. The argument: in READ
-- COMMITTED each takes a fresh snapshot at its start, which holds every
-- transaction that committed before it began; a holder row or marker of
-- this key is only inserted by a call that held the key's per-key lock
-- (acquire_limit, acquire_fifo), and such a call commits before it
-- releases that lock, so every one of them committed before this call got
-- the lock and is seen. A row of this key being deleted (a release, a
-- sweep) is still seen: the call then takes the path with rows, whose
-- locking statements wait for it, as before. That argument is necessary,
-- not sufficient, and the evidence is empirical: a first version of
-- migration 00008 read the key with one tableless SELECT of EXISTS
-- subqueries that also read the failover pause and the clock, which the
-- same argument covers, and on MariaDB 10.11 it now and then missed a
-- holder committed before the per-key lock changed hands; why is not
-- known. The S1/S6 stress cases catch that form (it overlapped grants in 3
-- of 8 runs against this build); this form ran 46 runs of them without an
-- overlap when it landed, 40 more under load in a review, and 49,103
-- grants of one key by 8 connections without an overlap.
--
-- Per-procedure EXECUTE grants: DROP PROCEDURE revokes them (while
-- automatic_sp_privileges is on, the default), so on MariaDB the procedure
-- is re-created with CREATE OR REPLACE, which keeps them; MySQL 8 has no
-- such statement and drops it first, so grant EXECUTE on
-- sqlease_acquire_limit again there (docs/operations.md).
--
-- Nothing the engine sees changes: the same parameters, result rows and
-- errors. Down puts back the procedure of migration 00009. {name} markers
-- are rendered by the migrate package; do not run this file as is.

-- +goose Up
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
    -- marker, by plain single-table reads (see the top of this file);
    -- then the clock (SPEC S2) and whether the failover pause refuses
    -- grants here (SPEC S7; migration 00003; checked below where 00004
    -- checked it).
    SELECT 1 INTO v_busy FROM {holders} FORCE INDEX (lock_key) WHERE lock_key = p_key LIMIT 1;
    IF NOT v_busy THEN
        SELECT 1 INTO v_busy FROM {markers} WHERE lock_key = p_key;
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
