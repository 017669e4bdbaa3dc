//go:build cgo

package chaos_test

// The SQLite runs of the chaos tests use mattn/go-sqlite3 where cgo is
// available: under the race detector modernc.org/sqlite (compiled Go) is too
// slow for the suite's timing bounds. The sqlease command's runs use
// modernc.org/sqlite.
import _ "github.com/mattn/go-sqlite3"
