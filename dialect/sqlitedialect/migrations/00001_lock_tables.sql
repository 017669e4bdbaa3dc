-- sqlease lock tables for SQLite. {name} markers are rendered to quoted names
-- by the migrate package; do not run this file as is. Times are integer
-- microseconds since the Unix epoch from the database's clock.

-- +goose Up
CREATE TABLE {holders} (
    lease_id    TEXT PRIMARY KEY,
    lock_key    TEXT NOT NULL,
    mode        TEXT NOT NULL CHECK (mode IN ('x', 's')),
    owner       TEXT NOT NULL,
    token       INTEGER NOT NULL,
    acquired_us INTEGER NOT NULL,
    expires_us  INTEGER NOT NULL
);
CREATE INDEX {holders_key_idx} ON {holders} (lock_key);
CREATE INDEX {holders_expiry_idx} ON {holders} (expires_us);

-- Pending-writer markers, one per key at most (SPEC W1).
CREATE TABLE {markers} (
    lock_key   TEXT PRIMARY KEY,
    waiter_id  TEXT NOT NULL,
    owner      TEXT NOT NULL,
    expires_us INTEGER NOT NULL
);
CREATE INDEX {markers_expiry_idx} ON {markers} (expires_us);

-- The fencing-token counter row: the last token granted (SPEC S3). SQLite
-- serializes writers, so one row costs no concurrency.
CREATE TABLE {counter} (
    id    INTEGER PRIMARY KEY CHECK (id = 1),
    value INTEGER NOT NULL
);
INSERT INTO {counter} (id, value) VALUES (1, 0);

-- +goose StatementBegin
CREATE TRIGGER {token_bump} AFTER INSERT ON {holders}
BEGIN
    UPDATE {counter} SET value = NEW.token WHERE id = 1 AND value < NEW.token;
END;
-- +goose StatementEnd

-- +goose Down
DROP TRIGGER {token_bump};
DROP TABLE {counter};
DROP TABLE {markers};
DROP TABLE {holders};
