-- +goose Up
ALTER TABLE example_users ADD COLUMN email TEXT;

-- +goose Down
ALTER TABLE example_users DROP COLUMN email;
