package conformance_test

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/sqlease/sqlease/conformance"
)

// TestContractListsEveryCase: docs/contract.md names every
// case of the suite, and no case that does not exist.
func TestContractListsEveryCase(t *testing.T) {
	b, err := os.ReadFile("../docs/contract.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	// Cases run once per isolation level are listed once, as S6_<Level>_...
	level := regexp.MustCompile(`^(S6)_(ReadCommitted|RepeatableRead|Serializable)_`)
	known := map[string]bool{}
	for _, c := range conformance.Cases() {
		known[c.Name] = true
		listed := level.ReplaceAllString(c.Name, "${1}_<Level>_")
		if !strings.Contains(doc, "`"+listed+"`") {
			t.Errorf("case %s (rule %s) is not listed in docs/contract.md", c.Name, c.Rule)
		}
	}
	for _, m := range regexp.MustCompile("`([SHWFDI][0-9]+_[A-Za-z0-9]+)`").FindAllStringSubmatch(doc, -1) {
		if !known[m[1]] {
			t.Errorf("docs/contract.md lists %s, which is not a case of the suite", m[1])
		}
	}
}
