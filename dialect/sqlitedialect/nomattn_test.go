//go:build !cgo

package sqlitedialect_test

// mattnAvailable: this test binary has mattn/go-sqlite3 (a cgo build).
const mattnAvailable = false
