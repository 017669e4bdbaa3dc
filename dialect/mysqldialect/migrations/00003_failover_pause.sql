-- sqlease: the failover pause (SPEC S7). After the promotion of an
-- asynchronous replica, a holder whose grant the replica never received
-- still trusts its lease until its trusted window ends, while the new
-- primary has no row and could grant the key at once. With the pause on
-- (lock.WithFailoverPause, which sets {epoch}.pause_us to the longest TTL
-- of the namespace), a server that is not the one the {epoch} row names
-- grants nothing until pause_us after it was first seen: every lost grant
-- was made before the old primary died, so its holder's window has ended
-- by then. Renewals of the rows that survived are not paused. {name}
-- markers are rendered by the migrate package; do not run this file as is.
--
-- A server is named CONCAT(@@server_id, '/', X), X being @@server_uuid on
-- MySQL 8 and @@hostname:@@port on MariaDB (written twice in version
-- comments: MariaDB runs /*M!100000 ... */, which MySQL skips; MySQL 8 runs
-- /*!80000 ... */, which MariaDB 10.11 skips, see primaryQuery in
-- mysqldialect.go). A promoted replica never shares @@server_id with its
-- old primary (replication requires distinct IDs: a replica ignores the
-- events carrying its own). A dump restored into another server shares
-- neither @@server_uuid (MySQL 8 makes one per data directory, in
-- auto.cnf) nor, on MariaDB, which has no such UUID, @@hostname:@@port
-- (@@server_id alone would not do: it defaults to 1 everywhere). The old
-- primary restarted after a crash keeps its name: it lost no acknowledged
-- commit, so it needs no pause. A MariaDB server whose host name or port
-- changes (a container moved) pauses once for nothing: safe, at the cost
-- of one pause. Names are server properties, not addresses: a virtual IP
-- or proxy moved to another server does not hide the change.
--
-- The acquire procedure, about to draw a grant's token, refuses with
-- SQLSTATE SL002 while the server differs from {epoch}.server or the pause
-- since the change runs; its exit handler rolls back the whole grant
-- (nothing of it is written) and releases its named locks, as on every
-- error. The engine then calls {primary_seen}(0), which records the new
-- server and the moment it was first seen (once: later calls leave it),
-- and reports the key locked until the pause ends. Without the row, or with
-- pause_us 0 (the option never used), the grant only reads the one-row
-- table. Only the acquire procedure changes; it keeps SQL SECURITY INVOKER,
-- so the service account needs SELECT on {epoch}, and for {primary_seen}
-- (also SQL SECURITY INVOKER) INSERT and UPDATE on it and EXECUTE.

-- +goose Up
CREATE TABLE {epoch} (
    id       TINYINT NOT NULL PRIMARY KEY CHECK (id = 1),
    server   VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    since_us BIGINT NOT NULL,
    -- At most lock.MaxTTL (24 h): since_us + pause_us cannot overflow.
    pause_us BIGINT NOT NULL CHECK (pause_us BETWEEN 0 AND 86400000000)
) ENGINE = InnoDB;

-- {primary_seen}(p_pause_us): records this server in the {epoch} row (with
-- since_us = now when it differs from the one recorded; 0 when the row is
-- new, so the server the pause is turned on at is not paused), raises
-- pause_us to p_pause_us when larger, and returns one row (until_us,
-- now_us): since_us + pause_us and the database clock.
-- +goose StatementBegin
CREATE PROCEDURE {primary_seen}(IN p_pause_us BIGINT)
MODIFIES SQL DATA
SQL SECURITY INVOKER
BEGIN
    DECLARE v_server VARCHAR(255) CHARACTER SET utf8mb4 DEFAULT
        CONCAT(@@server_id, '/' /*M!100000 , @@hostname, ':', @@port */ /*!80000 , @@server_uuid */);
    DECLARE v_now BIGINT;
    DECLARE v_until BIGINT;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION
    BEGIN
        ROLLBACK;
        RESIGNAL;
    END;

    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    START TRANSACTION;
    SET v_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6));
    INSERT INTO {epoch} (id, server, since_us, pause_us)
    VALUES (1, v_server, 0, GREATEST(COALESCE(p_pause_us, 0), 0))
    ON DUPLICATE KEY UPDATE
        -- Assignments run left to right: since_us compares the old server.
        since_us = IF(server = VALUES(server), since_us, v_now),
        server = VALUES(server),
        pause_us = GREATEST(pause_us, VALUES(pause_us));
    SELECT since_us + pause_us INTO v_until FROM {epoch} WHERE id = 1;
    COMMIT;
    SELECT v_until AS until_us, v_now AS now_us;
END;
-- +goose StatementEnd

DROP PROCEDURE IF EXISTS {acquire};
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

-- +goose Down
DROP PROCEDURE IF EXISTS {primary_seen};
DROP PROCEDURE IF EXISTS {acquire};
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

DROP TABLE {epoch};
