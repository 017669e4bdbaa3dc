-- sqlease: a server-side bound on fenced transactions (SPEC F1). A holder
-- stopped or hung inside a fenced transaction keeps its holder row locked
-- in share mode, and a takeover waits for that lock for as long as the
-- transaction lasts. MariaDB (10.3+) ends a session whose transaction sits
-- idle longer than idle_transaction_timeout (whole seconds; the more
-- specific idle_readonly_transaction_timeout and
-- idle_write_transaction_timeout win when set), closing the connection and
-- rolling the transaction back, and with it the row lock. {fence} lowers
-- those three to the lease TTL, rounded up to whole seconds, for the
-- session (they are not transaction-scoped); {fence_end}, run by
-- lock.Lease.RunInTx on the connection once the transaction ended, puts
-- back the values {fence} found. MySQL 8 has no idle-transaction timeout:
-- there {fence} lowers wait_timeout (which bounds every idle wait of the
-- session, in a transaction or not) the same way, and {fence_end} puts it
-- back (untested here: the MariaDB statements are in /*M!100300 */
-- comments, which MySQL skips; the MySQL ones in /*!80000 */, which
-- MariaDB 10.11 skips). {name} markers are rendered by the migrate
-- package; do not run this file as is.

-- +goose Up
-- +goose StatementBegin
CREATE PROCEDURE {fence}(IN p_lease_id VARBINARY(64), IN p_token BIGINT, IN p_ttl_us BIGINT)
READS SQL DATA
SQL SECURITY INVOKER
BEGIN
    /*M!100300
    DECLARE v_s BIGINT DEFAULT GREATEST(CEIL(p_ttl_us / 1000000), 1);
    IF @sqlease_idle IS NULL THEN
        -- The values to put back: a session fenced again before {fence_end}
        -- keeps the first ones.
        SET @sqlease_idle = @@SESSION.idle_transaction_timeout,
            @sqlease_idle_ro = @@SESSION.idle_readonly_transaction_timeout,
            @sqlease_idle_w = @@SESSION.idle_write_transaction_timeout;
    END IF;
    IF @@SESSION.idle_transaction_timeout = 0 OR @@SESSION.idle_transaction_timeout > v_s THEN
        SET SESSION idle_transaction_timeout = v_s;
    END IF;
    IF @@SESSION.idle_readonly_transaction_timeout > v_s THEN
        SET SESSION idle_readonly_transaction_timeout = v_s;
    END IF;
    IF @@SESSION.idle_write_transaction_timeout > v_s THEN
        SET SESSION idle_write_transaction_timeout = v_s;
    END IF;
    */
    /*!80000
    DECLARE v_s8 BIGINT DEFAULT GREATEST(CEIL(p_ttl_us / 1000000), 1);
    IF @sqlease_wait IS NULL THEN
        SET @sqlease_wait = @@SESSION.wait_timeout;
    END IF;
    IF @@SESSION.wait_timeout > v_s8 THEN
        SET SESSION wait_timeout = v_s8;
    END IF;
    */
    SELECT (SELECT e.expires_us FROM {expiry} e WHERE e.lease_id = h.lease_id) AS expires_us,
           TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) AS now_us
    FROM {holders} h
    WHERE h.lease_id = p_lease_id AND h.token = p_token
      AND (SELECT e.expires_us FROM {expiry} e WHERE e.lease_id = h.lease_id)
          > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))
    LOCK IN SHARE MODE;
END;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE PROCEDURE {fence_end}()
NO SQL
SQL SECURITY INVOKER
BEGIN
    /*M!100300
    IF @sqlease_idle IS NOT NULL THEN
        SET SESSION idle_transaction_timeout = @sqlease_idle,
            SESSION idle_readonly_transaction_timeout = @sqlease_idle_ro,
            SESSION idle_write_transaction_timeout = @sqlease_idle_w;
        SET @sqlease_idle = NULL, @sqlease_idle_ro = NULL, @sqlease_idle_w = NULL;
    END IF;
    */
    /*!80000
    IF @sqlease_wait IS NOT NULL THEN
        SET SESSION wait_timeout = @sqlease_wait;
        SET @sqlease_wait = NULL;
    END IF;
    */
    DO 0;
END;
-- +goose StatementEnd

-- +goose Down
DROP PROCEDURE IF EXISTS {fence_end};
DROP PROCEDURE IF EXISTS {fence};
