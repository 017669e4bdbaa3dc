-- sqlease: the acquire functions read the lock tables with plain index
-- scans only. A key acquired and released many times leaves a dead index
-- entry per grant until VACUUM. Plain index scans mark the entries they find
-- dead (once no transaction can still see the row: a long-running
-- transaction or a replication slot holding back the xmin horizon delays
-- it), and the index then reclaims them by itself; bitmap scans, which the
-- planner otherwise picks for these tiny lookups, never mark them, so every
-- acquire of a busy key read every dead entry again. Measured on one key:
-- 1,650 acquire+release per second fell to 1,020 within 9,000 operations;
-- with this setting it stayed at 1,750-2,040 (docs/performance.md). A later
-- CREATE OR REPLACE of these functions must repeat the setting.
-- {name} markers are rendered by the migrate package; do not run this file
-- as is.

-- +goose Up
ALTER FUNCTION {acquire}(text, text, text, text, bigint, bigint, bigint) SET enable_bitmapscan = off;
ALTER FUNCTION {acquire_fifo}(text, text, text, text, bigint, bigint, bigint, text, bigint) SET enable_bitmapscan = off;

-- +goose Down
ALTER FUNCTION {acquire_fifo}(text, text, text, text, bigint, bigint, bigint, text, bigint) RESET enable_bitmapscan;
ALTER FUNCTION {acquire}(text, text, text, text, bigint, bigint, bigint) RESET enable_bitmapscan;
