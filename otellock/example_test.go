package otellock_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	_ "modernc.org/sqlite" // database/sql driver "sqlite", pure Go: the example runs with CGO_ENABLED=0

	"github.com/sqlease/sqlease/dialect/sqlitedialect"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
	"github.com/sqlease/sqlease/otellock"
)

// An application builds one Observer on its MeterProvider and gives it to
// every Locker; acquires, renewals, losses, releases and sweeps then show up
// as the sqlease.* instruments, labelled by dialect, mode and outcome but
// never by key.
func ExampleNew() {
	ctx := context.Background()

	// In production the provider has a reader that exports, for example
	// sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exporter)); or pass
	// nil to otellock.New to use the global otel.GetMeterProvider().
	mp := sdkmetric.NewMeterProvider()
	defer mp.Shutdown(ctx)
	obs, err := otellock.New(mp)
	if err != nil {
		panic(err)
	}

	dir, _ := os.MkdirTemp("", "otellock-example")
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+"?_journal_mode=WAL&_busy_timeout=5000")
	if err != nil {
		panic(err)
	}
	defer db.Close()
	if _, err := migrate.Up(ctx, db, sqlitedialect.New()); err != nil {
		panic(err)
	}
	locker, err := lock.New(ctx, db, sqlitedialect.New(), lock.WithObserver(obs))
	if err != nil {
		panic(err)
	}
	defer locker.Close(ctx)

	err = locker.Do(ctx, "reports/nightly", lock.Exclusive, func(ctx context.Context, lease *lock.Lease) error {
		fmt.Println("holding", lease.Key(), lease.Mode())
		return nil
	})
	fmt.Println("done:", err)
	// Output:
	// holding reports/nightly exclusive
	// done: <nil>
}
