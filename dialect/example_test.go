package dialect_test

import (
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	_ "github.com/mattn/go-sqlite3"

	"github.com/sqlease/sqlease/dialect"
	_ "github.com/sqlease/sqlease/dialect/sqlitedialect" // registers "sqlite"
)

// Detect finds the registered dialect for a pool's driver; a dialect prints
// as its name.
func ExampleDetect() {
	dir, err := os.MkdirTemp("", "sqlease-dialect")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite3", "file:"+filepath.Join(dir, "app.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	d, err := dialect.Detect(db)
	fmt.Println(d, err)
	fmt.Println("schemas:", d.Capabilities().Has(dialect.CapSchemas))
	// Output:
	// sqlite <nil>
	// schemas: false
}

// Lookup finds a registered dialect by name; an unknown name is bad input
// (rule I1) and says which names are registered.
func ExampleLookup() {
	d, err := dialect.Lookup("sqlite")
	fmt.Println(d, err)
	_, err = dialect.Lookup("oracle")
	fmt.Println(errors.Is(err, dialect.ErrUnknownDialect), errors.Is(err, dialect.ErrInvalidInput))
	// Output:
	// sqlite <nil>
	// true true
}

// Validate checks a schema and prefix before any SQL is written (rules D3,
// I1); every error is an *InputError naming the value.
func ExampleNamespace_Validate() {
	d, _ := dialect.Lookup("sqlite")
	fmt.Println(dialect.Namespace{Prefix: "app_"}.Validate(d))
	err := dialect.Namespace{Prefix: "App-Locks"}.Validate(d)
	var ie *dialect.InputError
	fmt.Println(errors.As(err, &ie), ie.Field, ie.Value, errors.Is(err, dialect.ErrInvalidName))
	fmt.Println(err)
	// Output:
	// <nil>
	// true prefix "App-Locks" true
	// dialect: invalid prefix "App-Locks": only lower-case letters, digits and '_', not starting with a digit
}
