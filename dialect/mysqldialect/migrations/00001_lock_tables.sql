-- sqlease lock tables for MySQL 8 and MariaDB 10.11+ (InnoDB). {name} markers
-- are rendered to quoted, database-qualified names by the migrate package;
-- do not run this file as is. Times are BIGINT microseconds since the Unix
-- epoch from the database's clock:
--   TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))
-- UTC_TIMESTAMP is evaluated once per statement, when the statement starts,
-- so every procedure below reads the clock in a statement of its own after
-- each lock wait (SPEC S2). Keys and IDs are VARBINARY: byte comparison, no
-- collation folding case or trailing spaces.

-- +goose Up
-- One row per granted lease, without its expiry: a fenced transaction holds
-- this row in share mode, which blocks a takeover (it deletes the row) but
-- not a renewal (it updates only the expiry row) (SPEC F1). The token comes
-- from the AUTO_INCREMENT counter, persistent across restarts and shared
-- by no row, so it grows across releases, expiries, sweeps and row
-- deletion (SPEC S3) while grants of different keys lock nothing in common
-- (SPEC S5).
CREATE TABLE {holders} (
    lease_id    VARBINARY(64) NOT NULL PRIMARY KEY,
    lock_key    VARBINARY(512) NOT NULL,
    mode        CHAR(1) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    owner       VARCHAR(256) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    token       BIGINT NOT NULL AUTO_INCREMENT,
    acquired_us BIGINT NOT NULL,
    UNIQUE KEY (token),
    KEY (lock_key)
) ENGINE = InnoDB;

-- The expiry of each lease, deleted with it.
CREATE TABLE {expiry} (
    lease_id   VARBINARY(64) NOT NULL PRIMARY KEY,
    expires_us BIGINT NOT NULL,
    FOREIGN KEY (lease_id) REFERENCES {holders} (lease_id) ON DELETE CASCADE
) ENGINE = InnoDB;

-- Pending-writer markers, one per key at most, only while a writer waits
-- (SPEC W1).
CREATE TABLE {markers} (
    lock_key   VARBINARY(512) NOT NULL PRIMARY KEY,
    waiter_id  VARBINARY(64) NOT NULL,
    owner      VARCHAR(256) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    expires_us BIGINT NOT NULL
) ENGINE = InnoDB;

-- Acquire (SPEC S1, S2, S3, W1). Grants of one key are serialized by a
-- named lock (GET_LOCK) on a hash of the holders table's name and the key:
-- it writes nothing and no other key waits for it (SPEC S5). The work runs
-- in a READ COMMITTED transaction of its own, whatever the session's
-- default isolation (SPEC S6): every statement reads what earlier grants of
-- the key committed, and no gap lock ever blocks another key. Lock waits
-- are bounded (2 s): the procedure then fails with error 1205 and the
-- engine polls again.
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
        -- The token is drawn under the per-key lock, so it is greater than
        -- every token granted for this key before (SPEC S3).
        SET v_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6));
        INSERT INTO {holders} (lease_id, lock_key, mode, owner, acquired_us)
        VALUES (p_lease_id, p_key, p_mode, p_owner, v_now);
        INSERT INTO {expiry} (lease_id, expires_us) VALUES (p_lease_id, v_now + p_ttl_us);
        SELECT 1 AS granted, h.lease_id, h.mode, h.owner, h.token, v_now + p_ttl_us AS expires_us, v_now AS now_us
        FROM {holders} h WHERE h.lease_id = p_lease_id;
    END IF;
    COMMIT;
    DO RELEASE_LOCK(v_lock);
    SET SESSION innodb_lock_wait_timeout = v_wait;
END;
-- +goose StatementEnd

-- Renew (SPEC S4, H2): the lease row is held in share mode (compatible with
-- a fence, excluded by a takeover in progress), then its expiry is moved
-- with the clock read after that lock.
-- +goose StatementBegin
CREATE PROCEDURE {renew}(IN p_lease_id VARBINARY(64), IN p_token BIGINT, IN p_ttl_us BIGINT)
MODIFIES SQL DATA
SQL SECURITY INVOKER
BEGIN
    DECLARE v_wait BIGINT DEFAULT @@SESSION.innodb_lock_wait_timeout;
    DECLARE v_found VARBINARY(64) DEFAULT NULL;
    DECLARE v_now BIGINT;
    DECLARE CONTINUE HANDLER FOR NOT FOUND BEGIN END;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION
    BEGIN
        ROLLBACK;
        SET SESSION innodb_lock_wait_timeout = v_wait;
        RESIGNAL;
    END;
    SET SESSION innodb_lock_wait_timeout = 2;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    START TRANSACTION;
    SELECT lease_id INTO v_found FROM {holders}
    WHERE lease_id = p_lease_id AND token = p_token LOCK IN SHARE MODE;
    IF v_found IS NOT NULL THEN
        SET v_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6));
        UPDATE {expiry} SET expires_us = v_now + p_ttl_us
        WHERE lease_id = p_lease_id AND expires_us > v_now;
        IF ROW_COUNT() > 0 THEN
            SELECT v_now + p_ttl_us AS expires_us, v_now AS now_us;
        END IF;
    END IF;
    COMMIT;
    SET SESSION innodb_lock_wait_timeout = v_wait;
END;
-- +goose StatementEnd

-- Release (SPEC S4, H5, H6): deletes the lease (token 0 matches any token
-- of the lease ID) and returns its key.
-- +goose StatementBegin
CREATE PROCEDURE {release}(IN p_lease_id VARBINARY(64), IN p_token BIGINT)
MODIFIES SQL DATA
SQL SECURITY INVOKER
BEGIN
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
END;
-- +goose StatementEnd

-- A waiter that gives up clears its marker (SPEC W1). READ COMMITTED: a
-- DELETE that finds no row takes no gap lock other keys could wait for.
-- +goose StatementBegin
CREATE PROCEDURE {clear_marker}(IN p_key VARBINARY(512), IN p_waiter_id VARBINARY(64))
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
    DELETE FROM {markers} WHERE lock_key = p_key AND waiter_id = p_waiter_id;
    COMMIT;
END;
-- +goose StatementEnd

-- Sweep (SPEC D2): deletes at most p_limit expired leases, skipping rows a
-- fenced transaction or a renewal holds (SKIP LOCKED), and expired markers;
-- returns the number of leases deleted as one row.
-- +goose StatementBegin
CREATE PROCEDURE {sweep}(IN p_limit BIGINT)
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
        SELECT h.lease_id INTO v_id FROM {holders} h
        WHERE h.lease_id > v_last AND EXISTS (
            SELECT 1 FROM {expiry} e WHERE e.lease_id = h.lease_id
              AND e.expires_us <= TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)))
        ORDER BY h.lease_id LIMIT 1
        FOR UPDATE SKIP LOCKED;
        IF v_id IS NULL THEN
            LEAVE sweep;
        END IF;
        SET v_last = v_id;
        DELETE FROM {holders} WHERE lease_id = v_id AND EXISTS (
            SELECT 1 FROM {expiry} e WHERE e.lease_id = v_id
              AND e.expires_us <= TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)));
        SET v_n = v_n + ROW_COUNT();
    END WHILE;
    DELETE FROM {markers}
    WHERE expires_us <= TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))
    LIMIT p_limit;
    COMMIT;
    SELECT v_n AS removed;
END;
-- +goose StatementEnd

-- +goose Down
DROP PROCEDURE {sweep};
DROP PROCEDURE {clear_marker};
DROP PROCEDURE {release};
DROP PROCEDURE {renew};
DROP PROCEDURE {acquire};
DROP TABLE {markers};
DROP TABLE {expiry};
DROP TABLE {holders};
