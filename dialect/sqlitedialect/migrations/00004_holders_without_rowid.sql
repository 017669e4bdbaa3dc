-- sqlease holder table for SQLite, version 4. {name} markers are rendered to
-- quoted names by the migrate package; do not run this file as is.

-- +goose Up
-- The holder table is rebuilt as a WITHOUT ROWID table clustered on its
-- primary key, the lease ID, and loses its expiry index. A grant and a
-- release then change two b-trees (the table and the key index) instead of
-- four (the rowid table, the lease ID index, the key index, the expiry
-- index): in WAL mode every changed page is written to the log at each
-- commit, and those writes were most of a grant's and a release's cost
-- (docs/performance.md). Only the sweep read the expiry index; it now
-- scans the table, which holds live leases plus at most one sweep batch
-- of expired ones (SPEC D2).
--
-- Rows, tokens and the counter row are kept: the next grant's token is
-- still above every earlier one (SPEC S3). The migration runs in one
-- transaction, which holds the write lock, so no grant, renewal or release
-- sees the table half-rebuilt. Dropping the old table drops its indexes
-- and triggers; both triggers are created again on the new table.
--
-- The key index gets a new name, created before anything else changes:
-- a concurrent Up that read version 3 before this one committed fails
-- there with "already exists" (the new table's name is free again after
-- the rename, the index's is not) and reruns from version 4 (SPEC D1).
CREATE TABLE {holders_v4} (
    lease_id    TEXT PRIMARY KEY,
    lock_key    TEXT NOT NULL,
    mode        TEXT NOT NULL CHECK (mode IN ('x', 's')),
    owner       TEXT NOT NULL,
    token       INTEGER NOT NULL,
    acquired_us INTEGER NOT NULL,
    expires_us  INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX {holders_lock_key_idx} ON {holders_v4} (lock_key);
INSERT INTO {holders_v4} (lease_id, lock_key, mode, owner, token, acquired_us, expires_us)
SELECT lease_id, lock_key, mode, owner, token, acquired_us, expires_us FROM {holders};
DROP TABLE {holders};
ALTER TABLE {holders_v4} RENAME TO {holders};
-- +goose StatementBegin
CREATE TRIGGER {token_bump} AFTER INSERT ON {holders}
BEGIN
    UPDATE {counter} SET value = NEW.token WHERE id = 1 AND value < NEW.token;
END;
-- +goose StatementEnd
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
-- Back to the version-3 table: a rowid table with its lease ID, key and
-- expiry indexes and both triggers, rows kept.
CREATE TABLE {holders_v3} (
    lease_id    TEXT PRIMARY KEY,
    lock_key    TEXT NOT NULL,
    mode        TEXT NOT NULL CHECK (mode IN ('x', 's')),
    owner       TEXT NOT NULL,
    token       INTEGER NOT NULL,
    acquired_us INTEGER NOT NULL,
    expires_us  INTEGER NOT NULL
);
CREATE INDEX {holders_key_idx} ON {holders_v3} (lock_key);
CREATE INDEX {holders_expiry_idx} ON {holders_v3} (expires_us);
INSERT INTO {holders_v3} (lease_id, lock_key, mode, owner, token, acquired_us, expires_us)
SELECT lease_id, lock_key, mode, owner, token, acquired_us, expires_us FROM {holders};
DROP TABLE {holders};
ALTER TABLE {holders_v3} RENAME TO {holders};
-- +goose StatementBegin
CREATE TRIGGER {token_bump} AFTER INSERT ON {holders}
BEGIN
    UPDATE {counter} SET value = NEW.token WHERE id = 1 AND value < NEW.token;
END;
-- +goose StatementEnd
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
