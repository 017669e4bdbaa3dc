package lock_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"
)

// TestQueueRecipesMatchDocs: the River and asynq recipes of
// docs/integrations.md show the functions example_queue_test.go compiles
// and runs, as they are there.
func TestQueueRecipesMatchDocs(t *testing.T) {
	doc, err := os.ReadFile("../docs/integrations.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("example_queue_test.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "example_queue_test.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"leadPeriodicEnqueue", "buildReport"} {
		var fn *ast.FuncDecl
		for _, d := range f.Decls {
			if d, ok := d.(*ast.FuncDecl); ok && d.Name.Name == name {
				fn = d
			}
		}
		if fn == nil {
			t.Fatalf("example_queue_test.go has no function %s", name)
		}
		text := string(src[fset.Position(fn.Pos()).Offset:fset.Position(fn.End()).Offset])
		if !strings.Contains(string(doc), text) {
			t.Errorf("docs/integrations.md does not show %s as example_queue_test.go has it:\n%s", name, text)
		}
	}
}
