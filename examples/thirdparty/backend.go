package thirdparty

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"

	_ "github.com/mattn/go-sqlite3" // database/sql driver "sqlite3"

	"github.com/sqlease/sqlease/cli"
	"github.com/sqlease/sqlease/conformance"
)

// DSN is the go-sqlite3 DSN of a database file: WAL journal, 5 s busy
// timeout.
func DSN(path string) string { return "file:" + path + "?_journal_mode=WAL&_busy_timeout=5000" }

// Config is the conformance configuration of the example dialect: every
// case gets a new database file in dir, removed after the case.
func Config(dir string) conformance.Config {
	return conformance.Config{
		Dialect:    Dialect{},
		DriverName: "sqlite3",
		NewDatabase: func(ctx context.Context, name string) (conformance.Database, error) {
			b := make([]byte, 4)
			_, _ = rand.Read(b)
			path := filepath.Join(dir, strings.NewReplacer("/", "_", " ", "_").Replace(name)+"-"+hex.EncodeToString(b)+".db")
			return conformance.Database{DSN: DSN(path), Cleanup: func() {
				for _, suffix := range []string{"", "-wal", "-shm"} {
					_ = os.Remove(path + suffix)
				}
			}}, nil
		},
	}
}

// RegisterBackend makes the example dialect available to the sqlease tool
// (package cli): DSNs ending in .tpdb, or any path with --dialect
// thirdparty; check runs every case on a new file in a temporary directory
// next to the DSN's file.
func RegisterBackend() {
	cli.RegisterBackend(cli.Backend{
		Dialect: Name,
		Driver:  "sqlite3",
		Forms:   "a path ending in .tpdb",
		Match:   func(dsn string) bool { return strings.HasSuffix(dsn, ".tpdb") },
		DSN: func(dsn string) (string, string, error) {
			path := strings.TrimPrefix(dsn, "file:")
			path, _, _ = strings.Cut(path, "?")
			return DSN(path), path, nil
		},
		Check: func(ctx context.Context, _, file string) (conformance.Config, func() error, error) {
			dir, err := os.MkdirTemp(filepath.Dir(file), "thirdparty-check-")
			if err != nil {
				return conformance.Config{}, nil, err
			}
			return Config(dir), func() error { return os.RemoveAll(dir) }, nil
		},
	})
}
