// Package doccheck holds the test that compiles the Go code of the
// repository's documentation, so that README.md, docs/usage.md and
// docs/http.md cannot show an API the library does not have.
package doccheck_test

import (
	"bufio"
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	// The packages the blocks use. Importing them here makes this test's
	// binary, and so go test's cached result, depend on their code: a
	// change to the API runs the test again.
	_ "github.com/txlimit/txlimit"
	_ "github.com/txlimit/txlimit/httplimit"
	_ "github.com/txlimit/txlimit/migrations"
	_ "github.com/txlimit/txlimit/mysqlstore"
	_ "github.com/txlimit/txlimit/pgsqlstore"
	_ "github.com/txlimit/txlimit/pgstore"
	_ "github.com/txlimit/txlimit/sqlitestore"

	"github.com/txlimit/txlimit/internal/testkit/testdb"
)

// documents are the files whose Go blocks are compiled, relative to the
// module's root, with the fewest whole blocks each must have: their main
// examples are whole so that this test checks them, and a count below the
// minimum means one was cut into fragments.
var documents = []struct {
	path     string
	minWhole int
}{
	{"README.md", 2},
	{"docs/usage.md", 7},
	// Beyond the brief of README and usage.md: the runnable HTTP server.
	{"docs/http.md", 1},
}

// imports maps the package names a function block may use to their import
// paths: a block that is a function, not a program, gets the imports of
// the names it uses and does not declare. Every path is in the root
// module's go.mod (modernc.org/sqlite is, for txlimittest and the
// quickstart), so the blocks compile without a new requirement.
var imports = map[string]string{
	"txlimit":     "github.com/txlimit/txlimit",
	"pgstore":     "github.com/txlimit/txlimit/pgstore",
	"pgsqlstore":  "github.com/txlimit/txlimit/pgsqlstore",
	"sqlitestore": "github.com/txlimit/txlimit/sqlitestore",
	"mysqlstore":  "github.com/txlimit/txlimit/mysqlstore",
	"migrations":  "github.com/txlimit/txlimit/migrations",
	"jitter":      "github.com/txlimit/txlimit/jitter",
	"httplimit":   "github.com/txlimit/txlimit/httplimit",
	"pgx":         "github.com/jackc/pgx/v5",
	"pgconn":      "github.com/jackc/pgx/v5/pgconn",
	"pgxpool":     "github.com/jackc/pgx/v5/pgxpool",
	"stdlib":      "github.com/jackc/pgx/v5/stdlib",
	"cmp":         "cmp",
	"context":     "context",
	"errors":      "errors",
	"fmt":         "fmt",
	"http":        "net/http",
	"log":         "log",
	"math":        "math",
	"os":          "os",
	"sql":         "database/sql",
	"strconv":     "strconv",
	"time":        "time",
}

// block is one ```go block of a document.
type block struct {
	doc  string // the document's path, relative to the module's root
	line int    // the line of the block's first line of code
	code string
}

// kind tells a whole program (package clause), a whole function (one or
// more declarations, at least one of them a func) and a fragment apart.
// For a function block it returns the file to compile: a package clause,
// the imports of the names the block uses without declaring them, and the
// block.
func (b block) kind() (kind string, file []byte, err error) {
	if f, err := parser.ParseFile(token.NewFileSet(), "", b.code, parser.PackageClauseOnly); err == nil && f.Name != nil {
		return "program", b.lined(nil), nil
	}
	f, err := parser.ParseFile(token.NewFileSet(), "", "package doc\n"+b.code, parser.AllErrors)
	if err != nil || !slices.ContainsFunc(f.Decls, func(d ast.Decl) bool { _, ok := d.(*ast.FuncDecl); return ok }) {
		return "fragment", nil, nil
	}
	have := map[string]bool{}
	for _, im := range f.Imports {
		p, _ := strconv.Unquote(im.Path.Value)
		have[p] = true
	}
	var need []string
	for _, id := range f.Unresolved {
		if p, ok := imports[id.Name]; ok && !have[p] && !slices.Contains(need, p) {
			need = append(need, p)
		}
	}
	slices.Sort(need)
	var head bytes.Buffer
	head.WriteString("package doc\n\n")
	for _, p := range need {
		fmt.Fprintf(&head, "import %q\n", p)
	}
	return "function", b.lined(head.Bytes()), nil
}

// lined is head followed by the block, with a //line directive that makes
// the compiler report positions in the block as the document's.
func (b block) lined(head []byte) []byte {
	var out bytes.Buffer
	out.Write(head)
	// The directive needs an absolute path; the test's working
	// directory is this package's.
	abs, _ := filepath.Abs(filepath.Join("..", "..", b.doc))
	fmt.Fprintf(&out, "\n//line %s:%d\n%s", abs, b.line, b.code)
	return out.Bytes()
}

var fence = regexp.MustCompile("^(\\s*)```(\\S*)")

// goBlocks returns the ```go blocks of the document at path (relative to
// the module's root), each with its first line's number.
func goBlocks(t *testing.T, doc string) []block {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", doc))
	if err != nil {
		t.Fatal(err)
	}
	var blocks []block
	var cur *block
	var indent string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		m := fence.FindStringSubmatch(line)
		switch {
		case cur == nil && m != nil && m[2] == "go":
			cur, indent = &block{doc: doc, line: n + 1}, m[1]
		case cur == nil && m != nil:
			// Another language's block: skip to its end as a unit, so
			// that a ```go inside it is not taken for a block of Go.
			cur, indent = &block{}, m[1]
		case cur != nil && m != nil && m[2] == "":
			if cur.doc != "" {
				blocks = append(blocks, *cur)
			}
			cur = nil
		case cur != nil:
			cur.code += strings.TrimPrefix(line, indent) + "\n"
		}
	}
	if cur != nil {
		t.Fatalf("%s: the block that starts at line %d has no end", doc, cur.line-1)
	}
	return blocks
}

// TestDocsCompile compiles every ```go block of the documents listed above
// that is a whole program (it starts with a package clause) or whole
// functions (declarations, at least one a func), against this module's
// code, with go vet. Fragments (statements, a config literal) are skipped
// and counted. A block that does not compile fails the test with the
// document's file and line, through a //line directive.
func TestDocsCompile(t *testing.T) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		testdb.SkipOrFail(t, fmt.Sprintf("SKIPPING the docs' Go blocks: no go command in PATH to vet them (%v); put the go command that runs the tests in PATH", err))
	}
	// The blocks become packages under a testdata directory of this
	// package, inside the module, so that they import its packages and
	// its go.mod's requirements; go ./... never matches testdata.
	if err := os.MkdirAll("testdata", 0o755); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("testdata", "blocks-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		os.RemoveAll(dir)
		os.Remove("testdata") // when no other run's blocks are in it
	})

	var pkgs []string
	for _, d := range documents {
		blocks := goBlocks(t, d.path)
		whole := 0
		for _, b := range blocks {
			kind, file, err := b.kind()
			if err != nil {
				t.Fatal(err)
			}
			if kind == "fragment" {
				continue
			}
			whole++
			pkg := filepath.Join(dir, fmt.Sprintf("%s_%d", strings.NewReplacer("/", "_", ".", "_").Replace(d.path), b.line))
			if err := os.Mkdir(pkg, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(pkg, "block.go"), file, 0o644); err != nil {
				t.Fatal(err)
			}
			pkgs = append(pkgs, "./internal/doccheck/"+filepath.ToSlash(pkg))
		}
		t.Logf("%s: %d Go blocks, %d whole (compiled), %d fragments (skipped)", d.path, len(blocks), whole, len(blocks)-whole)
		if whole < d.minWhole {
			t.Errorf("%s has %d whole Go blocks (programs or functions), fewer than %d: keep its main examples whole, so that this test compiles them",
				d.path, whole, d.minWhole)
		}
	}
	if len(pkgs) == 0 {
		return
	}
	cmd := exec.Command(goCmd, append([]string{"vet"}, pkgs...)...)
	cmd.Dir = filepath.Join("..", "..") // the module's root, so that positions read README.md:12
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("a Go block of the documentation does not compile or vet (positions are the document's):\n%s", cleanVet(out))
	}
}

// cleanVet drops go vet's package headers, which name the temporary
// packages rather than the documents.
func cleanVet(out []byte) string {
	var b strings.Builder
	for line := range strings.Lines(string(out)) {
		if strings.HasPrefix(line, "# ") {
			continue
		}
		b.WriteString(strings.TrimPrefix(line, "vet: "))
	}
	return b.String()
}
