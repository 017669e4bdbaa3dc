-- Lock tables of the example dialect. {name} markers become quoted names
-- in the configured namespace (migrate renders them).

-- +goose Up
-- The column contract of the conformance suite: {holders} has lease_id and
-- token; deleting a row ends its lease.
CREATE TABLE {holders} (
    lease_id   TEXT PRIMARY KEY,
    lock_key   TEXT NOT NULL,
    mode       TEXT NOT NULL CHECK (mode IN ('x', 's')),
    owner      TEXT NOT NULL,
    token      INTEGER NOT NULL,
    expires_us INTEGER NOT NULL
);
CREATE INDEX {holders_by_key} ON {holders} (lock_key);

-- Pending writers, one per key at most.
CREATE TABLE {waiters} (
    lock_key   TEXT PRIMARY KEY,
    waiter_id  TEXT NOT NULL,
    owner      TEXT NOT NULL,
    expires_us INTEGER NOT NULL
);

-- The last token granted: SQLite has one writer at a time, so one row
-- costs no concurrency, and it survives every deletion of holder rows.
CREATE TABLE {tokens} (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    last INTEGER NOT NULL
);
INSERT INTO {tokens} (id, last) VALUES (1, 0);

-- +goose Down
DROP TABLE {tokens};
DROP TABLE {waiters};
DROP TABLE {holders};
