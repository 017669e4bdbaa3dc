-- sqlease: the acquire functions plan their statements once per
-- connection. PL/pgSQL keeps a plan per statement and connection, and by
-- default plans each statement again with the call's values for its first
-- five runs on a connection before it settles on the generic plan. The
-- statements past the fast path (takeover, marker, watch) run only when a
-- key is contended, so on a pool of many connections most of their runs
-- were among a connection's first five: about 0.4 ms of planning per call
-- (0.55-0.75 ms against 0.2-0.35 ms with this setting, for the call that
-- grants a key to its marked waiter; docs/performance.md). Every statement
-- of the functions looks rows up by key or lease ID through an index, so
-- the generic plan is the plan the values would give. A later CREATE OR
-- REPLACE of these functions must repeat the setting. {name} markers are
-- rendered by the migrate package; do not run this file as is.

-- +goose Up
ALTER FUNCTION {acquire}(text, text, text, text, bigint, bigint, bigint) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION {acquire_fifo}(text, text, text, text, bigint, bigint, bigint, text, bigint) SET plan_cache_mode = force_generic_plan;

-- +goose Down
ALTER FUNCTION {acquire_fifo}(text, text, text, text, bigint, bigint, bigint, text, bigint) RESET plan_cache_mode;
ALTER FUNCTION {acquire}(text, text, text, text, bigint, bigint, bigint) RESET plan_cache_mode;
