package cli

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/internal/advice"
	"github.com/sqlease/sqlease/lock"
)

// dsnEnv is the environment variable read when --dsn is not given.
const dsnEnv = "SQLEASE_DSN"

// pingTimeout bounds the reachability check before a command runs.
const pingTimeout = 10 * time.Second

// dbFlags are the connection flags every command shares.
type dbFlags struct {
	dsn, dialect string
}

func (f *dbFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.dsn, "dsn", "", "database `DSN` (default $"+dsnEnv+")")
	fs.StringVar(&f.dialect, "dialect", "", "dialect `NAME` ("+backendNames()+"); default: inferred from the DSN")
}

// nsFlags place the lock tables.
type nsFlags struct {
	schema, prefix string
}

func (f *nsFlags) register(fs *flag.FlagSet) {
	// An empty --schema (an unset shell variable, say) would silently mean
	// the connection's schema, whatever it is: refused (SPEC I1). An empty
	// --prefix means the default prefix, as lock.WithTablePrefix("") and
	// migrate.WithNamespace do: the namespace it names is fixed and every
	// message and confirmation names it.
	fs.Func("schema", "`SCHEMA` holding the lock tables (dialects with schemas: PostgreSQL, MySQL database; default: the connection's)", func(v string) error {
		if v == "" {
			return errors.New("empty; omit --schema for the connection's default schema, or name one")
		}
		f.schema = v
		return nil
	})
	fs.Func("prefix", "table name `PREFIX` of the lock tables (default \""+dialect.DefaultPrefix+"\", which an empty --prefix also means)", func(v string) error {
		f.prefix = v
		return nil
	})
}

func (f *nsFlags) namespace() dialect.Namespace {
	return dialect.Namespace{Schema: f.schema, Prefix: f.prefix}
}

// connAdvice returns the connection flags to repeat in advice to run
// another command: --dialect as given, and "--dsn DSN" (a placeholder: the
// advice never prints the DSN) unless the DSN came from $SQLEASE_DSN.
func (f *dbFlags) connAdvice() string {
	var parts []string
	if f.dialect != "" {
		parts = append(parts, "--dialect "+f.dialect)
	}
	if f.dsn != "" {
		parts = append(parts, "--dsn DSN")
	}
	return strings.Join(parts, " ")
}

// dsnValue returns --dsn, else $SQLEASE_DSN.
func (f *dbFlags) dsnValue() string {
	if f.dsn != "" {
		return f.dsn
	}
	return os.Getenv(dsnEnv)
}

// target is a resolved database: what to open and with which dialect.
type target struct {
	dsn     string // passed to sql.Open
	driver  string
	dialect dialect.Dialect
	backend Backend
	// file is the database file of a file-based database ("" otherwise,
	// for an in-memory database or a path that could not be parsed).
	file string
}

// resolve picks the dialect and driver for dsn: --dialect when given, else
// the registered Backend whose Match claims the DSN. Errors are usage
// errors (exit 2).
func resolve(dsn, dialectName string) (target, error) {
	var b Backend
	if dialectName != "" {
		var err error
		if b, err = dialectBackend(dialectName); err != nil {
			return target{}, err
		}
	}
	if dsn == "" {
		return target{}, usageErr("no database: pass --dsn DSN or set $%s", dsnEnv)
	}
	if dialectName == "" {
		var ok bool
		var err error
		if b, ok, err = matchBackend(dsn); err != nil {
			return target{}, usageErr("%v", err)
		} else if !ok {
			return target{}, usageErr("cannot tell the dialect of DSN %q: it has none of the forms %s; pass --dialect NAME (the CLI knows: %s)", redactDSN(dsn), dsnForms(), backendNames())
		}
	}
	d, err := dialect.Lookup(b.Dialect)
	if err != nil {
		return target{}, usageErr("%v", err)
	}
	t := target{dsn: dsn, driver: b.Driver, dialect: d, backend: b}
	if b.DSN != nil {
		if t.dsn, t.file, err = b.DSN(dsn); err != nil {
			return target{}, malformedDSN(b.Dialect, dsn, err)
		}
	}
	return t, nil
}

// dialectBackend returns the backend of the dialect named by --dialect.
// A name the CLI has no backend for is a usage error naming it and listing
// the names it has (the registered backends): the library's advice to
// import a dialect package is no help to someone running the tool.
func dialectBackend(name string) (Backend, error) {
	if b, ok := backendFor(name); ok {
		return b, nil
	}
	if _, err := dialect.Lookup(name); err == nil {
		// A dialect linked into this program without a Backend: a
		// mistake of whoever built it.
		return Backend{}, usageErr("dialect %q has no database/sql driver in this program (the CLI knows: %s; see cli.RegisterBackend)", name, backendNames())
	}
	return Backend{}, usageErr("unknown dialect %q for --dialect; the CLI knows: %s", name, backendNames())
}

// open resolves the flags, opens the database and pings it. With mustExist,
// a SQLite file that does not exist is an error instead of being created.
// Unreachable databases are usage errors (exit 2).
func open(ctx context.Context, f *dbFlags, mustExist bool) (*sql.DB, target, error) {
	t, err := resolve(f.dsnValue(), f.dialect)
	if err != nil {
		return nil, t, err
	}
	if mustExist && t.file != "" {
		if _, err := os.Stat(t.file); err != nil {
			return nil, t, usageErr("%s database %s: %v", t.dialect.Name(), t.file, errors.Unwrap(err))
		}
	}
	db, err := sql.Open(t.driver, t.dsn)
	if err != nil {
		if slices.Contains(sql.Drivers(), t.driver) {
			// The driver parses the DSN at sql.Open (driver.DriverContext).
			return nil, t, malformedDSN(t.dialect.Name(), f.dsnValue(), err)
		}
		return nil, t, usageErr("open %s database: %v", t.dialect.Name(), err)
	}
	pctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		db.Close()
		return nil, t, pingErr(t, err)
	}
	// A replica would take grants the primary never sees (SPEC S7).
	if err := dialect.CheckPrimary(pctx, db, t.dialect, ""); err != nil {
		db.Close()
		return nil, t, usageErr("%s (--dsn %s)", scrubSecrets(err.Error(), t.dsn), t.where())
	}
	return db, t, nil
}

// pingErr is the usage error (exit 2) for a database that did not answer
// the ping: a server that refused the role or has no such database says
// so (the driver's error types tell them apart); anything else is
// "cannot reach". Each names the DSN without its password.
func pingErr(t target, err error) error {
	if e, ok := refusal(t, err); ok {
		return e
	}
	return usageErr("cannot reach the %s database %s: %s", t.dialect.Name(), t.where(), scrubSecrets(err.Error(), t.dsn))
}

// where names the database for a message: its file, or its DSN without
// the user information.
func (t target) where() string {
	if t.file != "" {
		return t.file
	}
	return redactDSN(t.dsn)
}

// dbCmd is the flag and database prologue the database commands share:
// the connection flags, the namespace flags and --json, then opening the
// database and checking the namespace.
type dbCmd struct {
	db     dbFlags
	ns     nsFlags
	asJSON bool
}

// register adds --dsn, --dialect, --schema, --prefix and, when jsonHelp is
// not empty, --json to fs.
func (c *dbCmd) register(fs *flag.FlagSet, jsonHelp string) {
	c.db.register(fs)
	c.ns.register(fs)
	if jsonHelp != "" {
		fs.BoolVar(&c.asJSON, "json", false, jsonHelp)
	}
}

// open opens the database (see open) and checks the namespace flags
// against its dialect and backend: a bad or reserved schema or prefix is a
// usage error (exit 2). The caller closes the database.
func (c *dbCmd) open(ctx context.Context, mustExist bool) (*sql.DB, target, dialect.Namespace, error) {
	ns := c.ns.namespace()
	// Check what needs no database first: a bad name is reported the same
	// way whether or not the database is reachable.
	if t, err := resolve(c.db.dsnValue(), c.db.dialect); err == nil {
		if err := checkNamespace(t, ns); err != nil {
			return nil, t, ns, err
		}
		if t.backend.InMemory != nil && t.backend.InMemory(c.db.dsnValue()) {
			return nil, t, ns, usageErr("DSN %q names an in-memory %s database: it vanishes when this command exits, so nothing done to it would last, and it holds no other process's lock tables; name a database file instead, such as --dsn locks.db",
				redactDSN(c.db.dsnValue()), t.dialect.Name())
		}
	}
	db, t, err := open(ctx, &c.db, mustExist)
	if err != nil {
		return nil, t, ns, err
	}
	if err := checkNamespace(t, ns); err != nil {
		db.Close()
		return nil, t, ns, err
	}
	return db, t, ns, nil
}

// locker opens the database and builds a Locker on it (see newLocker);
// closeAll closes both.
func (c *dbCmd) locker(ctx context.Context) (l *lock.Locker, closeAll func(), err error) {
	db, t, ns, err := c.open(ctx, true)
	if err != nil {
		return nil, nil, err
	}
	if l, err = newLocker(ctx, db, t, ns, advice.MigrateUpWith(ns, c.db.connAdvice())); err != nil {
		db.Close()
		return nil, nil, err
	}
	return l, func() {
		l.Close(context.WithoutCancel(ctx))
		db.Close()
	}, nil
}

// checkNamespace validates the schema and prefix for the target's dialect
// and rejects a schema its backend reserves (a system schema such as
// PostgreSQL's pg_catalog). Errors are usage errors naming the flag.
func checkNamespace(t target, ns dialect.Namespace) error {
	if ns.Schema != "" && !t.dialect.Capabilities().Has(dialect.CapSchemas) {
		// Validate's reason names the capability, which means nothing to
		// someone running the tool.
		return usageErr("invalid --schema %q: %s databases have no schemas; omit --schema and keep lock tables apart with --prefix (such as --prefix %s)",
			ns.Schema, t.dialect.Name(), prefixExample(ns.Schema))
	}
	if err := ns.Validate(t.dialect); err != nil {
		return inputUsageErr(err)
	}
	return nil
}

// prefixExample suggests a --prefix in place of a schema name: the name
// and "_" when that is a valid prefix, else "app_".
func prefixExample(schema string) string {
	if p := schema + "_"; (dialect.Namespace{Prefix: p}).Validate(nil) == nil {
		return p
	}
	return "app_"
}

// inputUsageErr turns an input error of lock, migrate or dialect into a
// usage error (exit 2) that names the flag it came from instead of the
// package: "invalid --schema "X": ...". Other errors become usage errors
// as they are.
func inputUsageErr(err error) error {
	var ie *dialect.InputError
	if !errors.As(err, &ie) {
		return usageErr("%v", err)
	}
	field := ie.Field
	switch field {
	case "schema", "prefix":
		field = "--" + field
	case "key prefix":
		field = "--key"
	}
	return usageErr("invalid %s %s: %s", field, ie.Value, ie.Allowed)
}

// noArgs rejects positional arguments of a command that takes none.
func noArgs(args []string) error {
	if len(args) > 0 {
		return argErr("unexpected argument %q", args[0])
	}
	return nil
}

// newLocker builds a Locker on db for the operator commands. Lock tables
// that are missing or old are a usage error (exit 2) giving migrateAdvice;
// missing ones, after naming the lock tables found under another prefix or
// schema (lockTablesElsewhere).
func newLocker(ctx context.Context, db *sql.DB, t target, ns dialect.Namespace, migrateAdvice string) (*lock.Locker, error) {
	l, err := lock.New(ctx, db, t.dialect,
		lock.WithSchema(ns.Schema), lock.WithTablePrefix(ns.Prefix),
		lock.WithLogger(slog.New(slog.DiscardHandler)))
	var se *lock.SchemaError
	switch {
	case errors.As(err, &se):
		if se.Current == 0 {
			// A forgotten --prefix or --schema: migrating would make a
			// second, disjoint set of lock tables.
			if elsewhere := lockTablesElsewhere(ctx, db, t.dialect, ns); elsewhere != "" {
				return nil, usageErr("the lock tables are not migrated (%s is at version 0, need %d): %s If not, %s%s",
					se.Table, se.Want, elsewhere, migrateAdvice, advice.Caution(se.Namespace, true))
			}
			return nil, usageErr("the lock tables are not migrated (%s is at version 0, need %d): %s%s",
				se.Table, se.Want, migrateAdvice, advice.NamespaceCaution(se.Namespace))
		}
		return nil, usageErr("the lock tables are at version %d (%s), this build needs %d: %s (`sqlease migrate status` lists what is pending)",
			se.Current, se.Table, se.Want, migrateAdvice)
	case errors.Is(err, lock.ErrInvalidInput), errors.Is(err, dialect.ErrInvalidName):
		return nil, inputUsageErr(err)
	case err != nil:
		return nil, err
	}
	return l, nil
}
