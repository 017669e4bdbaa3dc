// Command mysql is the README's quick start on MySQL 8 or MariaDB: one
// exclusive lease guards a nightly report, whose write is fenced by the
// lease and guarded by its token. Run it with
//
//	DSN='user:pass@tcp(host:3306)/db' go run ./examples/quickstart/mysql
//
// ($SQLEASE_MYSQL_DSN is used when $DSN is unset).
package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	_ "github.com/go-sql-driver/mysql" // database/sql driver "mysql"

	"github.com/sqlease/sqlease/dialect/mysqldialect"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

func main() {
	ctx := context.Background()
	dsn := os.Getenv("DSN")
	if dsn == "" {
		dsn = os.Getenv("SQLEASE_MYSQL_DSN")
	}
	if dsn == "" {
		log.Fatal("set DSN to a go-sql-driver DSN, e.g. root@tcp(127.0.0.1:3306)/test")
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	d := mysqldialect.New()
	// The lock tables, once per database; safe when replicas start at once.
	if _, err := migrate.Up(ctx, db, d); err != nil {
		log.Fatal(err)
	}
	locker, err := lock.New(ctx, db, d, lock.WithTTL(30*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close(ctx)

	// The application's own table, created under a lease so that replicas
	// starting at once do not race on it.
	err = locker.Do(ctx, "app/schema", lock.Exclusive, func(ctx context.Context, _ *lock.Lease) error {
		_, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS report (id INT PRIMARY KEY, body TEXT, token BIGINT NOT NULL)`)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}

	err = locker.Do(ctx, "reports/nightly", lock.Exclusive, func(ctx context.Context, lease *lock.Lease) error {
		// The lease renews itself; ctx ends with cause lock.ErrLeaseLost if it is lost.
		return lease.RunInTx(ctx, db, nil, func(ctx context.Context, tx *sql.Tx) error {
			// RunInTx fenced this transaction: it commits only while the lease is ours.
			// The token also guards storage the lock cannot see: refuse older writers.
			// MySQL has no WHERE on its upsert: each column keeps its value
			// unless the new token is greater (body first: MySQL assigns left
			// to right, so token must change last).
			_, err := tx.ExecContext(ctx, `INSERT INTO report (id, body, token) VALUES (1, ?, ?)
				ON DUPLICATE KEY UPDATE
					body = IF(token < VALUES(token), VALUES(body), body),
					token = GREATEST(token, VALUES(token))`, "done", lease.Token())
			return err
		})
	}, lock.WaitTimeout(time.Minute))
	switch {
	case errors.Is(err, lock.ErrLocked): // still held by another process after a minute
		log.Print("nightly report: another replica has it")
	case errors.Is(err, lock.ErrLeaseLost): // lost mid-way; the fenced transaction did not commit
		log.Print("nightly report: lease lost, will retry")
	case err != nil:
		log.Fatal(err)
	default:
		var body string
		if err := db.QueryRowContext(ctx, `SELECT body FROM report WHERE id = 1`).Scan(&body); err != nil {
			log.Fatal(err)
		}
		fmt.Println("nightly report:", body)
	}
}
