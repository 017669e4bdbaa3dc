-- +goose Up
CREATE TABLE example_users (id INTEGER PRIMARY KEY, name TEXT NOT NULL);

-- +goose Down
DROP TABLE example_users;
