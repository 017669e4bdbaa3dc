-- sqlease takeover trigger for SQLite. {name} markers are rendered to
-- quoted names by the migrate package; do not run this file as is.

-- +goose Up
-- Every grant (an INSERT of a holder row) takes over the expired holders
-- and markers of its key and clears the grantee's own marker, in the same
-- statement: the one-statement Grant fast path needs no script around it
-- (SPEC S3, W1). SQLite fixes the time for the whole statement, triggers
-- included, so "expired" means the same as in the INSERT's own check.
-- +goose StatementBegin
CREATE TRIGGER {holders_takeover} AFTER INSERT ON {holders}
BEGIN
    DELETE FROM {holders}
    WHERE lock_key = NEW.lock_key AND expires_us <= (CAST(unixepoch('subsec') * 1000 AS INTEGER) * 1000);
    DELETE FROM {markers}
    WHERE lock_key = NEW.lock_key
      AND (expires_us <= (CAST(unixepoch('subsec') * 1000 AS INTEGER) * 1000) OR waiter_id = NEW.lease_id);
END;
-- +goose StatementEnd

-- +goose Down
DROP TRIGGER {holders_takeover};
