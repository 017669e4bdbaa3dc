-- sqlease: a shorter acquire and release for MySQL 8 and MariaDB 10.11+
-- (docs/performance.md, "MySQL and MariaDB"). Measured before this
-- migration: each CALL ran every statement of the procedure whatever the
-- key's state (an acquire of a free key 22 statements inside the CALL, a
-- release 8), and every grant of every key took the token lock, a named lock
-- of the whole table (migration 00002), so concurrent grants of different
-- keys queued on it. Nothing the engine sees changes: the same parameters,
-- result rows and errors. {name} markers are rendered by the migrate
-- package; do not run this file as is.
--
-- Acquire ({acquire_limit}): after the per-key lock, a read of the key's
-- holder rows and marker tells whether the key has any (then one more reads
-- the clock and the failover pause, SPEC S2, S7). A free key, the common
-- case, is granted at once: no takeover cursor, marker statements or
-- lock-wait settings, none of which can find anything to do on a key
-- without rows (grants and markers of a key are only written under its
-- per-key lock, which this call holds). A key with rows takes the path of
-- migration 00004, statement for statement. The grant row is returned from
-- the procedure's variables instead of being read back.
--
-- That first read must see every row committed before this call took the
-- per-key lock, so it is a plain single-table SELECT ... LOCK IN SHARE
-- MODE: a locking read takes the latest committed version of each row and
-- waits for uncommitted ones, whatever read view the transaction has. A
-- first version of this migration read it with one tableless SELECT of
-- EXISTS subqueries (EXISTS (holders) OR EXISTS (markers), the pause and
-- the clock INTO variables) as the first statement of the transaction, and
-- on MariaDB 10.11 that statement now and then found no row of a key whose
-- holder had committed before the per-key lock changed hands: the S1
-- stress cases (S1_StressMixedModesAcrossProcesses,
-- S1_StressWithCrashedHolders and the S6 variants) then logged overlapping
-- grants in about half of their runs, e.g. a holder committed at t, the
-- next caller took the per-key lock at t + 0.33 ms and read the key empty
-- while that holder's row stayed live 42 ms longer. The same procedure
-- with the probe as single-table SELECTs ran without an overlap (plain
-- reads 14 runs, locking reads 8 runs, then the runs in the commit that
-- landed this); the locking read is kept because it does not depend on
-- read views at all. In RC it locks no gap, so a free key locks nothing;
-- on a key with rows it holds one holder row in share mode until COMMIT,
-- which renewals and fences share and a release of that lease waits for.

-- Tokens (SPEC S3, S7) are still GREATEST(AUTO_INCREMENT counter, clock),
-- drawn by the same INSERT and UPDATE, but without the token lock and with
-- a plain index on the token instead of a UNIQUE one. The token lock kept
-- two grants of different keys in the same microsecond from picking the same
-- clock value, which the UNIQUE index refused; S3 asks for tokens
-- strictly increasing per key only (PostgreSQL's tokens of different keys
-- may be equal too). Per key they still strictly increase: grants of a key
-- are serialized by its per-key lock, and InnoDB raises the counter past
-- a token at once when the UPDATE writes it (migration 00002), so the next
-- grant of the key draws a counter value above it even if the clock
-- stepped back.
--
-- Release ({release}): on MariaDB (10.5+) one DELETE ... RETURNING in a READ
-- COMMITTED transaction, its lock wait bounded to 5 s by SET STATEMENT,
-- instead of a SELECT ... FOR UPDATE, a DELETE, a SELECT and two SET
-- SESSION statements; the same locks (the holder row, then the expiry row
-- by the cascade). MySQL 8 has neither DELETE ... RETURNING nor SET
-- STATEMENT: it runs the body of migration 00001 (the MariaDB statements
-- are in /*M!100500 */ comments, which MySQL skips; the MySQL ones in
-- /*!80000 */, which MariaDB 10.11 skips; see migration 00006).
--
-- A later migration that must act on each release (say, wake the key's
-- waiters) replaces {release} and adds its statement right before COMMIT
-- in both bodies, where the holder row is deleted and still locked; on
-- MariaDB it finds the lease by p_lease_id only (the key goes to the
-- client in the RETURNING row: a hook that needs it selects lock_key
-- into a variable before the DELETE, as the MySQL 8 body does).
--
-- Down puts back the procedures of migrations 00004 and 00001 and the
-- UNIQUE index; it fails, changing nothing, while two live leases of
-- different keys share a token (release one of them first).

-- +goose Up
ALTER TABLE {holders} DROP INDEX token, ADD INDEX token (token);

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
    -- where 00004 checked it). FORCE INDEX: on a small table the optimizer
    -- may scan every holder row, and a locking scan then waits on other
    -- keys' rows (a takeover queued behind a fenced transaction), which
    -- S5 forbids; through the lock_key index, READ COMMITTED locks only
    -- this key's rows.
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

-- +goose Down
ALTER TABLE {holders} DROP INDEX token, ADD UNIQUE KEY token (token);

/*!80000 DROP PROCEDURE IF EXISTS {release} */ /*M!100103 DO 0 */;
-- +goose StatementBegin
CREATE /*M!100103 OR REPLACE */ PROCEDURE {release}(IN p_lease_id VARBINARY(64), IN p_token BIGINT)
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
