-- sqlease: {to_us} (a timestamptz as microseconds since the epoch) is
-- declared STABLE instead of IMMUTABLE, so that PostgreSQL inlines it.
-- Its body, extract(epoch FROM timestamptz), is STABLE; an IMMUTABLE SQL
-- function whose body is less than immutable is never inlined, so every
-- call ran the function through the SQL-function executor, planning its
-- body again for each statement. The acquire function's result and the
-- renewal's RETURNING call it twice each: about 0.02 ms of server time per
-- statement (pgbench, synchronous_commit off; docs/performance.md). The
-- result is the same. {name} markers are rendered by the migrate package;
-- do not run this file as is.

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION {to_us}(ts timestamptz) RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE
AS $fn$ SELECT (extract(epoch FROM ts) * 1000000)::bigint $fn$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION {to_us}(ts timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $fn$ SELECT (extract(epoch FROM ts) * 1000000)::bigint $fn$;
-- +goose StatementEnd
