//go:build !cgo

package main

import (
	"database/sql"

	"github.com/mattn/go-sqlite3"
)

// Without cgo mattn/go-sqlite3 is a stub whose Open says that cgo is
// needed; registering it keeps that message for the bench's SQLite mode.
func init() { sql.Register(sqliteDriver, &sqlite3.SQLiteDriver{}) }
