//go:build cgo

package main

import (
	"database/sql"

	"github.com/mattn/go-sqlite3"
)

func init() {
	sql.Register(sqliteDriver, &sqlite3.SQLiteDriver{ConnectHook: func(c *sqlite3.SQLiteConn) error {
		_, err := c.Exec("PRAGMA journal_size_limit = 4194304", nil)
		return err
	}})
}
