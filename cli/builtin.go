package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sqlease/sqlease/conformance"
	"github.com/sqlease/sqlease/conformance/conftest" // registers the built-in dialects and drivers
)

// The built-in backends: PostgreSQL (pgx), SQLite (modernc.org/sqlite, pure Go: no C compiler; the
// embedded default of check) and MySQL/MariaDB (go-sql-driver/mysql). They
// are registered like any third-party backend.
func init() {
	RegisterBackend(Backend{
		Dialect: "postgres",
		Driver:  "pgx",
		Forms:   "postgres://... or postgresql://...",
		Match: func(dsn string) bool {
			return hasPrefixFold(dsn, "postgres://") || hasPrefixFold(dsn, "postgresql://")
		},
		DSN: func(dsn string) (string, string, error) {
			// Match takes the scheme in any case, as URLs do; pgx only
			// takes it in lower case.
			for _, scheme := range []string{"postgresql://", "postgres://"} {
				if rest, ok := cutPrefixFold(dsn, scheme); ok {
					dsn = scheme + rest
					break
				}
			}
			return dsn, "", parsePostgresDSN(dsn)
		},
		Check: func(ctx context.Context, dsn, _ string) (conformance.Config, func() error, error) {
			return conftest.Postgres(dsn), nil, nil
		},
	})
	RegisterBackend(Backend{
		Dialect:  "sqlite",
		Driver:   "sqlite",
		Forms:    "file:PATH, sqlite:PATH or a path ending in .db, .sqlite or .sqlite3",
		Embedded: true,
		Match: func(dsn string) bool {
			// ":memory:" is claimed so that migrate and the others can
			// say why they refuse it (see InMemory).
			if hasPrefixFold(dsn, "file:") || hasPrefixFold(dsn, "sqlite:") || strings.HasPrefix(dsn, ":memory:") {
				return true
			}
			path, _, _ := strings.Cut(strings.ToLower(dsn), "?")
			for _, ext := range []string{".db", ".sqlite", ".sqlite3"} {
				if strings.HasSuffix(path, ext) {
					return true
				}
			}
			return false
		},
		DSN: func(dsn string) (string, string, error) {
			d, path := sqliteDSN(dsn)
			return d, path, nil
		},
		InMemory: func(dsn string) bool {
			_, path := sqliteDSN(dsn)
			return path == ""
		},
		// Cases never touch the DSN's file: each gets a new file in a
		// temporary directory next to it (to check that filesystem), or
		// in the system's temporary directory.
		Check: func(ctx context.Context, _, file string) (conformance.Config, func() error, error) {
			parent := ""
			if file != "" {
				parent = filepath.Dir(file)
			}
			dir, err := os.MkdirTemp(parent, "sqlease-check-")
			if err != nil {
				return conformance.Config{}, nil, fmt.Errorf("SQLite: cannot create a directory for the check databases: %w", err)
			}
			return conftest.SQLite(dir), func() error { return os.RemoveAll(dir) }, nil
		},
	})
	RegisterBackend(Backend{
		Dialect: "mysql",
		Driver:  "mysql",
		Forms:   "mysql://user:pass@host:3306/db or a go-sql-driver DSN user:pass@tcp(host:3306)/db",
		Match: func(dsn string) bool {
			if hasPrefixFold(dsn, "mysql://") || hasPrefixFold(dsn, "mariadb://") {
				return true
			}
			return strings.Contains(dsn, "@tcp(") || strings.Contains(dsn, "@unix(")
		},
		DSN: func(dsn string) (string, string, error) {
			d, err := mysqlDSN(dsn)
			return d, "", err
		},
		Check: func(ctx context.Context, dsn, _ string) (conformance.Config, func() error, error) {
			return conftest.MySQL(dsn), nil, nil
		},
	})
}

// parsePostgresDSN parses dsn as pgx's database/sql driver will when it
// connects (pgx.ParseConfig: a URL or keyword/value DSN, plus the PG*
// environment variables), so that a malformed DSN is reported as such
// instead of as an unreachable database. The error is the parser's reason
// without the DSN.
func parsePostgresDSN(dsn string) error {
	_, err := pgx.ParseConfig(dsn)
	var pe *pgconn.ParseConfigError
	if !errors.As(err, &pe) {
		return err
	}
	// ParseConfigError reads "cannot parse `DSN`: reason"; with the DSN
	// left out (a copy without ConnString), the reason remains.
	reason := *pe
	reason.ConnString = ""
	return errors.New(strings.TrimPrefix(reason.Error(), "cannot parse ``: "))
}

// sqliteBusyTimeoutMS is added to SQLite DSNs that set no busy timeout, so
// the tool waits for the application's writers instead of failing with
// SQLITE_BUSY.
const sqliteBusyTimeoutMS = 5000

// sqliteDSN turns a sqlite:PATH or sqlite://PATH DSN into one
// modernc.org/sqlite (and mattn/go-sqlite3) accept, adds a busy timeout when none is set, and
// returns the database file's path: "" for a database that lives only
// as long as its connection (":memory:", mode=memory, vfs=memdb, or no
// path at all, which SQLite takes for a temporary database).
func sqliteDSN(dsn string) (string, string) {
	if rest, ok := cutPrefixFold(dsn, "sqlite://"); ok {
		dsn = rest
	} else if rest, ok := cutPrefixFold(dsn, "sqlite:"); ok {
		dsn = rest
	}
	path, query, hasQuery := strings.Cut(dsn, "?")
	if !strings.Contains(query, "_busy_timeout=") && !strings.Contains(query, "_timeout=") {
		sep := "?"
		if hasQuery {
			sep = "&"
		}
		dsn += fmt.Sprintf("%s_busy_timeout=%d", sep, sqliteBusyTimeoutMS)
	}
	if rest, ok := cutPrefixFold(path, "file:"); ok {
		path = rest
		if strings.HasPrefix(path, "//") {
			path = strings.TrimPrefix(path, "//")
		}
	}
	if path == "" || path == ":memory:" || sqliteMemoryParams(query) {
		path = ""
	}
	return dsn, path
}

// sqliteMemoryParams reports whether the query parameters of a SQLite URI
// make the database live in memory: mode=memory (SQLite's URI parameter)
// or vfs=memdb (modernc.org/sqlite's in-memory VFS). A parameter that only
// ends in "mode", such as _journal_mode=MEMORY, keeps a file database.
func sqliteMemoryParams(query string) bool {
	for _, kv := range strings.Split(query, "&") {
		k, v, _ := strings.Cut(kv, "=")
		if (k == "mode" && v == "memory") || (k == "vfs" && v == "memdb") {
			return true
		}
	}
	return false
}

// mysqlDSN turns mysql://user:pass@host:port/db?param=v (or mariadb://)
// into the go-sql-driver/mysql DSN user:pass@tcp(host:port)/db?param=v,
// adding no option (sqlease needs none). A DSN already in the driver's form
// is only checked.
func mysqlDSN(dsn string) (string, error) {
	if hasPrefixFold(dsn, "mysql://") || hasPrefixFold(dsn, "mariadb://") {
		u, err := url.Parse(dsn)
		if err != nil {
			// A *url.Error quotes the whole URL, password included: keep
			// the reason only.
			var ue *url.Error
			if errors.As(err, &ue) {
				err = ue.Err
			}
			return "", err
		}
		cfg := mysql.NewConfig()
		if u.User != nil {
			cfg.User = u.User.Username()
			cfg.Passwd, _ = u.User.Password()
		}
		cfg.Net = "tcp"
		cfg.Addr = u.Host
		if u.Port() == "" {
			cfg.Addr = u.Host + ":3306"
		}
		cfg.DBName = strings.TrimPrefix(u.Path, "/")
		// Let the driver parse the query parameters.
		parsed, err := mysql.ParseDSN("/?" + u.RawQuery)
		if err != nil {
			return "", err
		}
		parsed.User, parsed.Passwd, parsed.Net, parsed.Addr, parsed.DBName = cfg.User, cfg.Passwd, cfg.Net, cfg.Addr, cfg.DBName
		if err := checkMySQLAddr(parsed); err != nil {
			return "", err
		}
		return parsed.FormatDSN(), nil
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return "", err
	}
	if err := checkMySQLAddr(cfg); err != nil {
		return "", err
	}
	return cfg.FormatDSN(), nil
}

// checkMySQLAddr rejects a TCP address whose port is not a number from 1
// to 65535, which the driver's parser lets through (the dial then fails
// as if the server were down).
func checkMySQLAddr(cfg *mysql.Config) error {
	if cfg.Net != "tcp" || cfg.Addr == "" {
		return nil
	}
	_, port, err := net.SplitHostPort(cfg.Addr)
	if err != nil {
		reason := err.Error()
		if ae := (*net.AddrError)(nil); errors.As(err, &ae) {
			reason = ae.Err
		}
		return fmt.Errorf("invalid address %q: %s (an IPv6 host with a port is written [::1]:3306)", cfg.Addr, reason)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("invalid port %q in address %q (want 1-65535)", port, cfg.Addr)
	}
	return nil
}

func hasPrefixFold(s, prefix string) bool {
	_, ok := cutPrefixFold(s, prefix)
	return ok
}

func cutPrefixFold(s, prefix string) (string, bool) {
	if len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix) {
		return s[len(prefix):], true
	}
	return s, false
}

// refusal recognises, in the error of a ping, a server that answered but
// refused the connection: the role (wrong user or password) or the
// database (it does not exist), as the built-in drivers report them
// (pgconn.PgError: SQLSTATE 28000, 28P01, 3D000; mysql.MySQLError: 1045,
// 1049). It returns the usage error saying which, naming the role or
// database and the DSN without its password.
func refusal(t target, err error) (error, bool) {
	var role, database, reason string
	var badRole, badDB bool
	var pe *pgconn.PgError
	var me *mysql.MySQLError
	switch {
	case errors.As(err, &pe):
		reason = pe.Message
		switch pe.Code {
		case "28000", "28P01": // invalid_authorization_specification, invalid_password
			badRole = true
		case "3D000": // invalid_catalog_name
			badDB = true
		}
		if cfg, perr := pgx.ParseConfig(t.dsn); perr == nil {
			role, database = cfg.User, cfg.Database
		}
	case errors.As(err, &me):
		reason = me.Message
		switch me.Number {
		case 1045: // ER_ACCESS_DENIED_ERROR
			badRole = true
		case 1049: // ER_BAD_DB_ERROR
			badDB = true
		}
		if cfg, perr := mysql.ParseDSN(t.dsn); perr == nil {
			role, database = cfg.User, cfg.DBName
		}
	}
	reason = scrubSecrets(reason, t.dsn)
	switch {
	case badRole:
		return usageErr("role %q was refused by the %s database %s: %s; check the user and password of the DSN",
			role, t.dialect.Name(), t.where(), reason), true
	case badDB:
		return usageErr("database %q does not exist on the %s server %s; create it, or name an existing database in the DSN",
			database, t.dialect.Name(), t.where()), true
	}
	return nil, false
}
