-- sqlease: semaphores (SPEC W7). A shared acquire may carry a limit n
-- (lock.Limit): it is granted only while the key has fewer than n holder
-- rows. The acquire procedure gains a last parameter, p_limit (0: no
-- limit). A procedure's parameters cannot change in place, and MySQL has no
-- parameter defaults, so the procedure of this version is {acquire_limit};
-- {acquire} keeps its seven parameters and calls it with p_limit 0, so
-- builds without this migration's statement still work on this version
-- (their service account then needs EXECUTE on {acquire_limit} too).
--
-- The count is race-free: every grant of a key runs under the key's named
-- lock (GET_LOCK), and the count, like every other check of the procedure,
-- is of every holder row of the key left after the takeover of expired
-- ones, read in READ COMMITTED after the lock was granted. Requests without
-- a limit evaluate p_limit > 0 and nothing else. Nothing else of the
-- procedure changes (its text is that of migration 00003 otherwise).
-- {name} markers are rendered by the migrate package; do not run this file
-- as is.

-- +goose Up
DROP PROCEDURE IF EXISTS {acquire};
-- +goose StatementBegin
CREATE PROCEDURE {acquire_limit}(
    IN p_key VARBINARY(512), IN p_mode VARCHAR(1), IN p_lease_id VARBINARY(64),
    IN p_owner VARCHAR(256) CHARACTER SET utf8mb4,
    IN p_ttl_us BIGINT, IN p_marker_us BIGINT, IN p_watch_us BIGINT, IN p_limit BIGINT)
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
    DECLARE v_done INT DEFAULT 0;
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

    -- Takeover of expired holders. Each candidate row is locked first: that
    -- waits for fenced transactions holding it in share mode (SPEC F1) and
    -- for renewals in flight (they hold it in share mode too); the expiry
    -- is then re-checked with the clock read after the wait.
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

    -- Every holder row still present blocks, even one that expired a moment
    -- ago: a renewal of it may be committing right now. A semaphore request
    -- (p_limit > 0) is refused while the key has p_limit rows, counted
    -- under the per-key lock, so two requests never both see a free slot.
    SELECT EXISTS (SELECT 1 FROM {holders} h WHERE h.lock_key = p_key AND (h.mode = 'x' OR p_mode = 'x' OR p_limit > 0 AND p_limit <= (SELECT COUNT(*) FROM {holders} c WHERE c.lock_key = p_key)))
        OR EXISTS (SELECT 1 FROM {markers} m WHERE m.lock_key = p_key AND m.waiter_id <> p_lease_id)
    INTO v_blocked;

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
        IF p_mode = 'x' THEN
            DELETE FROM {markers} WHERE lock_key = p_key AND waiter_id = p_lease_id;
        END IF;
        -- The failover pause (SPEC S7; see the top of this file): on a
        -- server the {epoch} row does not name, or inside its pause, refuse
        -- before the token is drawn. The exit handler rolls back what this
        -- call wrote (takeovers, markers) and releases the per-key lock.
        IF EXISTS (SELECT 1 FROM {epoch} WHERE id = 1 AND pause_us > 0 AND (
                server <> CONCAT(@@server_id, '/' /*M!100000 , @@hostname, ':', @@port */ /*!80000 , @@server_uuid */)
                OR since_us + pause_us > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)))) THEN
            SIGNAL SQLSTATE 'SL002' SET MESSAGE_TEXT = 'sqlease: failover pause: this primary grants nothing until the pause after it was first seen ends';
        END IF;
        -- The token (SPEC S3, S7): GREATEST(counter, clock), drawn under
        -- the per-key lock and the token lock (see the top of this file).
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

-- +goose StatementBegin
CREATE PROCEDURE {acquire}(
    IN p_key VARBINARY(512), IN p_mode VARCHAR(1), IN p_lease_id VARBINARY(64),
    IN p_owner VARCHAR(256) CHARACTER SET utf8mb4,
    IN p_ttl_us BIGINT, IN p_marker_us BIGINT, IN p_watch_us BIGINT)
MODIFIES SQL DATA
SQL SECURITY INVOKER
BEGIN
    CALL {acquire_limit}(p_key, p_mode, p_lease_id, p_owner, p_ttl_us, p_marker_us, p_watch_us, 0);
END;
-- +goose StatementEnd

-- +goose Down
DROP PROCEDURE IF EXISTS {acquire};
DROP PROCEDURE IF EXISTS {acquire_limit};
-- +goose StatementBegin
CREATE PROCEDURE {acquire}(
    IN p_key VARBINARY(512), IN p_mode VARCHAR(1), IN p_lease_id VARBINARY(64),
    IN p_owner VARCHAR(256) CHARACTER SET utf8mb4,
    IN p_ttl_us BIGINT, IN p_marker_us BIGINT, IN p_watch_us BIGINT)
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
    DECLARE v_done INT DEFAULT 0;
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

    -- Takeover of expired holders. Each candidate row is locked first: that
    -- waits for fenced transactions holding it in share mode (SPEC F1) and
    -- for renewals in flight (they hold it in share mode too); the expiry
    -- is then re-checked with the clock read after the wait.
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

    -- Every holder row still present blocks, even one that expired a moment
    -- ago: a renewal of it may be committing right now.
    SELECT EXISTS (SELECT 1 FROM {holders} h WHERE h.lock_key = p_key AND (h.mode = 'x' OR p_mode = 'x'))
        OR EXISTS (SELECT 1 FROM {markers} m WHERE m.lock_key = p_key AND m.waiter_id <> p_lease_id)
    INTO v_blocked;

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
        WHERE h.lock_key = p_key AND (h.mode = 'x' OR p_mode = 'x')
        UNION ALL
        SELECT 0, m.waiter_id, 'w', m.owner, 0, m.expires_us,
               TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))
        FROM {markers} m WHERE m.lock_key = p_key;
    ELSE
        IF p_mode = 'x' THEN
            DELETE FROM {markers} WHERE lock_key = p_key AND waiter_id = p_lease_id;
        END IF;
        -- The failover pause (SPEC S7; see the top of this file): on a
        -- server the {epoch} row does not name, or inside its pause, refuse
        -- before the token is drawn. The exit handler rolls back what this
        -- call wrote (takeovers, markers) and releases the per-key lock.
        IF EXISTS (SELECT 1 FROM {epoch} WHERE id = 1 AND pause_us > 0 AND (
                server <> CONCAT(@@server_id, '/' /*M!100000 , @@hostname, ':', @@port */ /*!80000 , @@server_uuid */)
                OR since_us + pause_us > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)))) THEN
            SIGNAL SQLSTATE 'SL002' SET MESSAGE_TEXT = 'sqlease: failover pause: this primary grants nothing until the pause after it was first seen ends';
        END IF;
        -- The token (SPEC S3, S7): GREATEST(counter, clock), drawn under
        -- the per-key lock and the token lock (see the top of this file).
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
