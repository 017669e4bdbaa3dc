-- sqlease FIFO tickets for SQLite (SPEC W6). {name} markers are rendered to
-- quoted names by the migrate package; do not run this file as is.

-- +goose Up
-- One row per FIFO waiter while it waits; it expires like a pending-writer
-- marker unless its waiter refreshes it, and is deleted when the waiter is
-- granted or gives up. seq (AUTOINCREMENT: never reused) is the arrival
-- order: SQLite serializes writers, so it increases in commit order.
CREATE TABLE {tickets} (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    ticket_id  TEXT NOT NULL UNIQUE,
    lock_key   TEXT NOT NULL,
    mode       TEXT NOT NULL CHECK (mode IN ('x', 's')),
    owner      TEXT NOT NULL,
    queued_us  INTEGER NOT NULL,
    expires_us INTEGER NOT NULL
);
CREATE INDEX {tickets_key_idx} ON {tickets} (lock_key, seq);

-- +goose Down
DROP TABLE {tickets};
