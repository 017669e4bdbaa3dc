// Package adaptertest holds the tests that use more than one adapter: a
// bun application and a sqlx application sharing one database's lock
// tables. It is a module of its own, so that neither adapter's module
// requires the other (a bun application's module graph does not include
// sqlx, nor a sqlx application's bun); it has no code of its own.
package adaptertest
