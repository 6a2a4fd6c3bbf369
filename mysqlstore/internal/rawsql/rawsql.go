// Package rawsql holds mysqlstore's statements that sqlc's MySQL engine
// cannot compile (JSON_TABLE, user variables, UTC_TIMESTAMP(6), SHOW), in
// the .sql files beside it, each under a "-- name: X" header as sqlc's are,
// read by name when the store's packages are initialized. Comment lines are
// left out of what is sent: the server would lex them on every call.
//
// A statement names its arguments :like_this (repeated where it reads one
// twice) or, when it has one argument, takes it as ?.
package rawsql

import (
	"embed"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strings"
)

//go:embed *.sql
var files embed.FS

// Stmt is one statement of the files.
type Stmt struct {
	// SQL is the statement with ? for each argument.
	SQL string
	// params are its :names, in the order of the ?s.
	params []string
}

var (
	param = regexp.MustCompile(`:([a-z_]+)`)
	all   = load()
	used  = map[string]bool{}
)

func load() map[string]Stmt {
	out := map[string]Stmt{}
	paths, _ := fs.Glob(files, "*.sql") // embedded: no error to read
	for _, path := range paths {
		text, _ := files.ReadFile(path)
		// What precedes the first header is the file's own comment.
		for _, part := range strings.Split(string(text), "-- name: ")[1:] {
			name, body, _ := strings.Cut(part, "\n")
			var lines []string
			for line := range strings.Lines(body) {
				if !strings.HasPrefix(strings.TrimSpace(line), "--") {
					lines = append(lines, line)
				}
			}
			var st Stmt
			st.SQL = param.ReplaceAllStringFunc(strings.TrimSpace(strings.Join(lines, "")), func(p string) string {
				st.params = append(st.params, p[1:])
				return "?"
			})
			if _, dup := out[name]; dup {
				panic(fmt.Sprintf("rawsql: two statements named %s in mysqlstore/internal/rawsql/*.sql; rename one", name))
			}
			out[name] = st
		}
	}
	return out
}

// Get returns the statement name. The store's packages look their
// statements up in variables initialized with the package, so a name that
// is not in the files fails every test at once.
func Get(name string) Stmt {
	st, ok := all[name]
	if !ok {
		panic(fmt.Sprintf("rawsql: no statement %q in mysqlstore/internal/rawsql/*.sql; add it under a \"-- name: %s\" header", name, name))
	}
	used[name] = true
	return st
}

// Unused returns the names of the statements Get was never asked for.
func Unused() []string {
	var out []string
	for name := range all {
		if !used[name] {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// Args returns the statement's arguments in the order of its ?s, each read
// from values by its name.
func (s Stmt) Args(values map[string]any) []any {
	args := make([]any, len(s.params))
	for i, p := range s.params {
		v, ok := values[p]
		if !ok {
			panic(fmt.Sprintf("rawsql: no value for :%s; add it to the values passed to Args", p))
		}
		args[i] = v
	}
	return args
}
