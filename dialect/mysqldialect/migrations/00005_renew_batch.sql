-- sqlease: batch renewal for MySQL 8 and MariaDB 10.11+ (SPEC H2, S4): one
-- CALL renews every listed live lease, so a Locker holding 10,000 leases
-- sends a handful of statements per renewal interval instead of one CALL
-- per lease. {name} markers are rendered by the migrate package; do not run
-- this file as is. JSON_TABLE needs MySQL 8.0.4 or MariaDB 10.6.

-- +goose Up
-- Renew a batch (dialect.Statements.RenewBatch): p_leases is a JSON array
-- of "leaseID:token" strings. Like {renew}, one lease at a time: the holder
-- rows of the listed leases whose token matches are locked in share mode
-- (compatible with a fence, excluded by a takeover or a release in
-- progress), the clock is read after those lock waits (SPEC S2), and every
-- expiry still in the future is moved to now + p_ttl_us.
--
-- The rows returned are exactly the leases renewed: after the UPDATE this
-- transaction holds every row it changed (expiry rows exclusively, holder
-- rows in share mode) until COMMIT, so the SELECT reads each of them with
-- the expiry it set, and no release or takeover can delete one in between.
-- A listed lease the UPDATE skipped had expired (its expiry is at most
-- v_now) or is gone, so no row of it has v_now + p_ttl_us.
-- +goose StatementBegin
CREATE PROCEDURE {renew_batch}(IN p_leases LONGTEXT, IN p_ttl_us BIGINT)
MODIFIES SQL DATA
SQL SECURITY INVOKER
BEGIN
    DECLARE v_wait BIGINT DEFAULT @@SESSION.innodb_lock_wait_timeout;
    DECLARE v_n BIGINT;
    DECLARE v_now BIGINT;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION
    BEGIN
        ROLLBACK;
        SET SESSION innodb_lock_wait_timeout = v_wait;
        RESIGNAL;
    END;
    SET SESSION innodb_lock_wait_timeout = 2;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    START TRANSACTION;
    SELECT COUNT(*) INTO v_n
    FROM (SELECT CAST(SUBSTRING_INDEX(j.v, ':', 1) AS BINARY) AS lease_id,
                 CAST(SUBSTRING_INDEX(j.v, ':', -1) AS SIGNED) AS token
          FROM JSON_TABLE(p_leases, '$[*]' COLUMNS (v VARCHAR(200) PATH '$')) AS j) AS u
    JOIN {holders} h ON h.lease_id = u.lease_id AND h.token = u.token
    LOCK IN SHARE MODE;
    SET v_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6));
    UPDATE (SELECT CAST(SUBSTRING_INDEX(j.v, ':', 1) AS BINARY) AS lease_id,
                   CAST(SUBSTRING_INDEX(j.v, ':', -1) AS SIGNED) AS token
            FROM JSON_TABLE(p_leases, '$[*]' COLUMNS (v VARCHAR(200) PATH '$')) AS j) AS u
    JOIN {holders} h ON h.lease_id = u.lease_id AND h.token = u.token
    JOIN {expiry} e ON e.lease_id = h.lease_id
    SET e.expires_us = v_now + p_ttl_us
    WHERE e.expires_us > v_now;
    SELECT h.lease_id, e.expires_us, v_now AS now_us
    FROM (SELECT CAST(SUBSTRING_INDEX(j.v, ':', 1) AS BINARY) AS lease_id,
                 CAST(SUBSTRING_INDEX(j.v, ':', -1) AS SIGNED) AS token
          FROM JSON_TABLE(p_leases, '$[*]' COLUMNS (v VARCHAR(200) PATH '$')) AS j) AS u
    JOIN {holders} h ON h.lease_id = u.lease_id AND h.token = u.token
    JOIN {expiry} e ON e.lease_id = h.lease_id
    WHERE e.expires_us = v_now + p_ttl_us;
    COMMIT;
    SET SESSION innodb_lock_wait_timeout = v_wait;
END;
-- +goose StatementEnd

-- +goose Down
DROP PROCEDURE IF EXISTS {renew_batch};
