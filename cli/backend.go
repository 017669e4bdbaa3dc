package cli

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/sqlease/sqlease/conformance"
)

// Backend tells the CLI how to reach one kind of database: which registered
// dialect and database/sql driver serve DSNs of which form, and how
// `sqlease check` gets isolated databases from it. The CLI has no list of
// dialects of its own: every dialect it can use comes from a Backend
// registered with RegisterBackend (the built-in ones: postgres, sqlite,
// mysql).
type Backend struct {
	// Dialect is the registered dialect name (dialect.Register), e.g.
	// "mysql". The dialect's package must be imported.
	Dialect string
	// Driver is the database/sql driver name (sql.Register), e.g. "mysql".
	// The driver's package must be imported.
	Driver string
	// Match reports whether a DSN has this backend's form (for example a
	// "mysql://" prefix), so that --dialect can be left out. Nil: the
	// backend is used only with --dialect.
	Match func(dsn string) bool
	// DSN converts the DSN the operator gave into the one the driver
	// takes, and names the database file when the database is a local file
	// (SQLite), "" otherwise. Nil: the DSN is passed as is. It should parse
	// the DSN as the driver will: an error means the DSN is malformed, and
	// the CLI reports `malformed <dialect> DSN "<DSN, password hidden>":
	// <error>` (exit 2) without trying to connect, so the error gives the
	// reason and need not quote the DSN.
	DSN func(dsn string) (driverDSN, file string, err error)
	// Check returns the conformance configuration `sqlease check` runs
	// with: every case must get a database of its own (for example a fresh
	// schema) that its Cleanup removes. driverDSN and file come from DSN;
	// both are empty when Embedded and no DSN was given. cleanup runs after
	// the cases (it may be nil). Nil: the backend cannot be checked. With
	// check --schema, cfg.NewDatabase is replaced: every case runs in that
	// schema of driverDSN under a prefix of its own (conftest.InSchema).
	Check func(ctx context.Context, driverDSN, file string) (cfg conformance.Config, cleanup func() error, err error)
	// InMemory reports whether a DSN names a database that lives only as
	// long as the connection (SQLite's ":memory:", mode=memory): migrate,
	// status, sweep and drop refuse it (exit 2), since nothing they did
	// would last and no other process can see it. Nil: no DSN is.
	InMemory func(dsn string) bool
	// Embedded: check runs on this backend when no DSN is given (an
	// embedded database in a temporary directory). At most one backend
	// should set it.
	Embedded bool
	// Forms describes the DSN forms Match claims, for the usage text, e.g.
	// "mysql://user:pass@host:3306/db".
	Forms string
}

var (
	backendsMu sync.RWMutex
	backends   = map[string]Backend{}
)

// RegisterBackend makes a backend available to the CLI under its dialect
// name. Like sql.Register it panics when the dialect or driver name is
// empty or the dialect already has a backend. Call it from an init
// function of the package that builds the CLI (see Main).
func RegisterBackend(b Backend) {
	if b.Dialect == "" || b.Driver == "" {
		panic("cli: RegisterBackend needs a Dialect and a Driver name")
	}
	backendsMu.Lock()
	defer backendsMu.Unlock()
	if _, dup := backends[b.Dialect]; dup {
		panic("cli: RegisterBackend called twice for dialect " + b.Dialect)
	}
	backends[b.Dialect] = b
}

// backendList returns the registered backends sorted by dialect name.
func backendList() []Backend {
	backendsMu.RLock()
	defer backendsMu.RUnlock()
	out := make([]Backend, 0, len(backends))
	for _, b := range backends {
		out = append(out, b)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Dialect < out[j].Dialect })
	return out
}

// backendFor returns the backend of a dialect name.
func backendFor(name string) (Backend, bool) {
	backendsMu.RLock()
	defer backendsMu.RUnlock()
	b, ok := backends[name]
	return b, ok
}

// backendNames lists the dialect names that have a backend.
func backendNames() string {
	var names []string
	for _, b := range backendList() {
		names = append(names, b.Dialect)
	}
	return strings.Join(names, ", ")
}

// matchBackend returns the backend whose Match claims dsn. Several claims
// are an error naming them.
func matchBackend(dsn string) (Backend, bool, error) {
	var found []Backend
	for _, b := range backendList() {
		if b.Match != nil && b.Match(dsn) {
			found = append(found, b)
		}
	}
	switch len(found) {
	case 0:
		return Backend{}, false, nil
	case 1:
		return found[0], true, nil
	}
	var names []string
	for _, b := range found {
		names = append(names, b.Dialect)
	}
	return Backend{}, false, fmt.Errorf("several dialects claim the DSN (%s); pass --dialect NAME", strings.Join(names, ", "))
}

// dsnHelp describes the DSN forms of the registered backends.
// dsnForms lists, on one line, the DSN forms each backend recognises.
func dsnForms() string {
	var parts []string
	for _, be := range backendList() {
		if be.Forms != "" {
			parts = append(parts, be.Dialect+": "+be.Forms)
		}
	}
	return strings.Join(parts, "; ")
}

// passwordParam matches a password given as a DSN parameter (keyword/value
// form, spaces around "=" allowed as libpq and pgx allow them, or URL query
// form). A quoted value may hold backslash-escaped characters (\' and \\,
// as libpq reads them); an unclosed quote runs to the end of the DSN.
var passwordParam = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'?|[^\s&]*)`)

// userinfoEnd returns the index of the "@" that ends the user information
// of dsn, or -1 when it has none. In a URL ("scheme://...") that is the
// last "@" of the authority (before the first "/", "?" or "#" after the
// scheme), so an "@" in the path or query is not taken for it; in the
// driver form (user:pass@tcp(host)/db?...) the last "@" before the last
// "/", as go-sql-driver/mysql reads it.
func userinfoEnd(dsn string) int {
	if i := strings.Index(dsn, "://"); i >= 0 {
		auth := dsn[i+3:]
		if end := strings.IndexAny(auth, "/?#"); end >= 0 {
			auth = auth[:end]
		}
		if at := strings.LastIndex(auth, "@"); at >= 0 {
			return i + 3 + at
		}
		return -1
	}
	end := len(dsn)
	if slash := strings.LastIndex(dsn, "/"); slash >= 0 {
		end = slash
	}
	return strings.LastIndex(dsn[:end], "@")
}

// malformedDSN is the usage error for a DSN that does not parse: it names
// the dialect, the DSN with its password hidden and the parser's reason,
// with any password the reason quotes hidden too.
func malformedDSN(dialectName, dsn string, reason error) error {
	return usageErr("malformed %s DSN %q: %s", dialectName, redactDSN(dsn), scrubSecrets(reason.Error(), dsn))
}

// scrubSecrets replaces in msg the parts of dsn that redactDSN hides (the
// user information and password=... values) when msg quotes them, as a
// parser's error may. Values shorter than four bytes are left: they are
// too likely to occur in the message by chance.
func scrubSecrets(msg, dsn string) string {
	var secrets []string
	for _, m := range passwordParam.FindAllStringSubmatch(dsn, -1) {
		v := m[2]
		if strings.HasPrefix(v, "'") {
			v = strings.TrimSuffix(v[1:], "'")
			// As written, and as the driver reads it (unescaped).
			secrets = append(secrets, v, strings.NewReplacer(`\'`, "'", `\\`, `\`).Replace(v))
			continue
		}
		secrets = append(secrets, v)
	}
	if at := userinfoEnd(dsn); at >= 0 {
		userinfo := dsn[:at]
		if i := strings.Index(userinfo, "://"); i >= 0 {
			userinfo = userinfo[i+3:]
		}
		// A user name alone is no secret: only user information with a
		// password is.
		if _, pass, ok := strings.Cut(userinfo, ":"); ok {
			secrets = append(secrets, userinfo, pass)
			// An unencoded "@" in the password: a driver that splits the
			// user information at the first "@" quotes the rest as the
			// host ("lookup topsecret@127.0.0.1").
			secrets = append(secrets, strings.Split(pass, "@")...)
		}
	}
	for _, s := range secrets {
		if len(s) >= 4 {
			msg = strings.ReplaceAll(msg, s, "***")
		}
	}
	return msg
}

// redactDSN hides the user information of dsn (see userinfoEnd; after any
// "scheme://") and any password=... parameter, so an error can quote the
// rest.
func redactDSN(dsn string) string {
	dsn = passwordParam.ReplaceAllString(dsn, "${1}***")
	at := userinfoEnd(dsn)
	if at < 0 {
		return dsn
	}
	prefix := ""
	if i := strings.Index(dsn, "://"); i >= 0 && i < at {
		prefix = dsn[:i+3]
	}
	return prefix + "***" + dsn[at:]
}

func dsnHelp() string {
	var b strings.Builder
	b.WriteString("The DSN comes from --dsn or $" + dsnEnv + ". The dialect is inferred from its form:\n")
	for _, be := range backendList() {
		forms := be.Forms
		if forms == "" {
			forms = "(only with --dialect " + be.Dialect + ")"
		}
		fmt.Fprintf(&b, "  %-9s %s (driver %s)\n", be.Dialect, forms, be.Driver)
	}
	b.WriteString("--dialect NAME overrides the guess.")
	return b.String()
}
