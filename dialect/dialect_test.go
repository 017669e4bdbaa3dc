package dialect_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/pgdialect"
	"github.com/sqlease/sqlease/dialect/sqlitedialect"
)

func TestNamespaceValidate(t *testing.T) {
	pg, lite := pgdialect.New(), sqlitedialect.New()
	for _, tc := range []struct {
		d     dialect.Dialect
		ns    dialect.Namespace
		wants []string // nil: valid
	}{
		{pg, dialect.Namespace{Schema: "locks", Prefix: "app_"}, nil},
		{lite, dialect.Namespace{Prefix: "app_"}, nil},
		{pg, dialect.Namespace{Schema: "pg-catalog"}, []string{`schema "pg-catalog"`, "lower-case letters"}},
		{pg, dialect.Namespace{Prefix: "9lives"}, []string{`prefix "9lives"`, "not starting with a digit"}},
		{pg, dialect.Namespace{Schema: strings.Repeat("s", 41)}, []string{"41 bytes", "at most 40"}},
		{lite, dialect.Namespace{Schema: "locks"}, []string{`schema "locks"`, `dialect "sqlite" has no schemas`}},
		{pg, dialect.Namespace{Schema: "information_schema"}, []string{`schema "information_schema"`, "reserved"}},
		{pg, dialect.Namespace{Schema: "pg_catalog"}, []string{`schema "pg_catalog"`, "reserved"}},
		{pg, dialect.Namespace{Schema: "pg_temp"}, []string{`schema "pg_temp"`, "reserved"}},
		{pg, dialect.Namespace{Schema: "mysql"}, []string{`schema "mysql"`, "reserved"}},
		{pg, dialect.Namespace{Schema: "sys"}, []string{`schema "sys"`, "reserved"}},
		{pg, dialect.Namespace{Schema: "performance_schema"}, []string{`schema "performance_schema"`, "reserved"}},
		{lite, dialect.Namespace{Schema: "information_schema"}, []string{`schema "information_schema"`, "reserved"}},
		{pg, dialect.Namespace{Schema: "pgx_locks"}, nil},
	} {
		err := tc.ns.Validate(tc.d)
		if tc.wants == nil {
			if err != nil {
				t.Errorf("%+v on %v: %v", tc.ns, tc.d, err)
			}
			continue
		}
		if !errors.Is(err, dialect.ErrInvalidName) || !errors.Is(err, dialect.ErrInvalidInput) {
			t.Errorf("%+v on %v: %v does not match ErrInvalidName and ErrInvalidInput", tc.ns, tc.d, err)
			continue
		}
		var ie *dialect.InputError
		if !errors.As(err, &ie) || ie.Pkg != "dialect" {
			t.Errorf("%v: want a *dialect.InputError from package dialect", err)
		}
		for _, w := range tc.wants {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("message %q: want it to mention %q", err, w)
			}
		}
	}
}

func TestLookupUnknown(t *testing.T) {
	_, err := dialect.Lookup("oracle")
	if !errors.Is(err, dialect.ErrUnknownDialect) || !errors.Is(err, dialect.ErrInvalidInput) {
		t.Fatalf("Lookup(oracle) = %v; want ErrUnknownDialect and ErrInvalidInput", err)
	}
	for _, w := range []string{`dialect: invalid dialect name "oracle"`, "postgres, sqlite"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("message %q: want it to mention %q", err, w)
		}
	}
	if _, err := dialect.Detect(nil); !errors.Is(err, dialect.ErrInvalidInput) {
		t.Errorf("Detect(nil) = %v; want ErrInvalidInput", err)
	}
}

func TestRelabel(t *testing.T) {
	err := dialect.Namespace{Prefix: "X"}.Validate(nil)
	re := dialect.Relabel(err, "migrate")
	if !strings.HasPrefix(re.Error(), "migrate: invalid prefix") || !errors.Is(re, dialect.ErrInvalidName) {
		t.Errorf("Relabel = %v", re)
	}
	if !strings.HasPrefix(err.Error(), "dialect: ") {
		t.Errorf("Relabel changed the original: %v", err)
	}
	other := errors.New("boom")
	if dialect.Relabel(other, "lock") != other {
		t.Error("Relabel changed a non-input error")
	}
}
