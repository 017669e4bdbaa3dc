-- sqlease: the acquire functions plan their statements once per
-- connection, with index scans only. PL/pgSQL keeps a plan per statement
-- and connection, and by default plans each statement again with the
-- call's values for its first five runs on a connection before it settles
-- on the generic plan. The statements past the fast path (takeover,
-- marker, watch) run only when a key is contended, so on a pool of many
-- connections most of their runs were among a connection's first five:
-- about 0.4 ms of planning per call (0.55-0.75 ms against 0.2-0.35 ms with
-- this setting, for the call that grants a key to its marked waiter;
-- docs/performance.md). A kept plan is made from the table statistics of
-- its time: on tables analyzed while empty the planner picks sequential
-- scans, and a connection kept them after the tables grew, until the next
-- ANALYZE (20,000 rows of other keys: 5.6 ms per blocked call instead of
-- 0.1 ms; before this migration the same from a connection's sixth call).
-- Every statement of the functions looks rows up by key, lease ID or
-- ticket through an index, so enable_seqscan = off keeps them on index
-- scans whatever the statistics said. A later CREATE OR REPLACE of these
-- functions must repeat both settings, as it must repeat
-- enable_bitmapscan = off (00004). {name} markers are rendered by the
-- migrate package; do not run this file as is.

-- +goose Up
ALTER FUNCTION {acquire}(text, text, text, text, bigint, bigint, bigint) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION {acquire}(text, text, text, text, bigint, bigint, bigint) SET enable_seqscan = off;
ALTER FUNCTION {acquire_fifo}(text, text, text, text, bigint, bigint, bigint, text, bigint) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION {acquire_fifo}(text, text, text, text, bigint, bigint, bigint, text, bigint) SET enable_seqscan = off;

-- +goose Down
ALTER FUNCTION {acquire_fifo}(text, text, text, text, bigint, bigint, bigint, text, bigint) RESET enable_seqscan;
ALTER FUNCTION {acquire_fifo}(text, text, text, text, bigint, bigint, bigint, text, bigint) RESET plan_cache_mode;
ALTER FUNCTION {acquire}(text, text, text, text, bigint, bigint, bigint) RESET enable_seqscan;
ALTER FUNCTION {acquire}(text, text, text, text, bigint, bigint, bigint) RESET plan_cache_mode;
