package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// The docs mode (-docs, -docs-check) writes the figures the documentation
// quotes from the bench's results file, so that no figure of a run is
// copied by hand. In README.md and docs/*.md a generated block is
//
//	<!-- bench:NAME -->
//	…written by the docs mode…
//	<!-- /bench:NAME -->
//
// where NAME is a layout of docLayouts (docs_layouts.go): "run", the
// paragraph that says which run the figures come from (its command line,
// date, machine, servers, repeats and admission checks), or a table of
// figures from that run's rows, with the spread of the runs behind them.
// -docs rewrites what lies between the markers; -docs-check fails, naming
// the file, line and block, when it differs from what results.json gives.
// Both refuse, before writing anything, a block whose rows results.json
// lacks, a results file whose admission checks failed, and a file with a
// generated table but no run block.
//
// A table of measurements that do not come from results.json (another
// run, another tool) is wrapped in <!-- bench:external --> and
// <!-- /bench:external -->, which the mode leaves as it is: the block must
// hold the command that measured them (in backticks) and its date
// (YYYY-MM-DD). Outside a block, a table row that quotes a ratio (0.95×) or
// a spread (±12%) is an error: a figure of a run is generated or external,
// never copied. Markers in fenced code blocks are text.

// docsResults is the results file the docs quote, from the repository's
// root: the one `-out ../../docs/bench` writes.
const docsResults = "docs/bench/results.json"

// externalBlock is the marker name of figures the mode does not write.
const externalBlock = "external"

var (
	docMarker = regexp.MustCompile(`^<!-- (/?)bench:([a-z0-9-]+) -->$`)
	// quotedFigure finds a ratio or a spread in a table row.
	quotedFigure = regexp.MustCompile(`[0-9]×|±[0-9]+%`)
	isoDate      = regexp.MustCompile(`\b20[0-9]{2}-[01][0-9]-[0-3][0-9]\b`)
	codeSpan     = regexp.MustCompile("`[^`]+`")
)

// runDocs writes (check false) or checks (check true) the generated blocks
// of the Markdown files of the repository at root from its results file.
// It writes nothing unless every block of every file can be written.
func runDocs(root string, check bool, w io.Writer) error {
	rep, err := readResults(filepath.Join(root, filepath.FromSlash(docsResults)))
	if err != nil {
		return err
	}
	files, err := docFiles(root)
	if err != nil {
		return err
	}
	var problems, stale []string
	rewritten := map[string]string{}
	for _, name := range files {
		data, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(name)))
		if err != nil {
			return err
		}
		out, diffs, errs := rewriteDoc(name, string(data), rep)
		problems = append(problems, errs...)
		stale = append(stale, diffs...)
		if len(errs) == 0 && out != string(data) {
			rewritten[name] = out
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s (from %s; nothing written):\n  %s", plural(len(problems), "problem"), docsResults, strings.Join(problems, "\n  "))
	}
	if check {
		if len(stale) > 0 {
			return fmt.Errorf("%s differ from %s:\n  %s\nwrite them with: (cd cmd/txlimit-bench && go run . -docs ../..)",
				plural(len(stale), "bench block"), docsResults, strings.Join(stale, "\n  "))
		}
		fmt.Fprintf(w, "the bench blocks of %s match %s (the run of %s)\n", plural(len(files), "file"), docsResults, runDate(rep))
		return nil
	}
	for _, name := range slices.Sorted(maps.Keys(rewritten)) {
		if err := os.WriteFile(filepath.Join(root, filepath.FromSlash(name)), []byte(rewritten[name]), 0o644); err != nil {
			return err
		}
		fmt.Fprintf(w, "wrote %s\n", name)
	}
	fmt.Fprintf(w, "%s, %s rewritten, from %s (the run of %s)\n", plural(len(stale), "bench block"), plural(len(rewritten), "file"), docsResults, runDate(rep))
	return nil
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// readResults reads a results file the docs may quote: one whose admission
// checks all passed.
func readResults(file string) (*Report, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("the docs quote %s: %w", docsResults, err)
	}
	var rep Report
	if err := json.Unmarshal(data, &rep); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if len(rep.Rows) == 0 {
		return nil, fmt.Errorf("%s holds no rows", file)
	}
	var failed []check
	for _, c := range rep.Checks {
		if !c.OK {
			failed = append(failed, c)
		}
	}
	if len(failed) > 0 {
		return nil, fmt.Errorf("%s: %d of %d admission checks failed (first: %s: %s); the docs quote only a run whose checks pass",
			file, len(failed), len(rep.Checks), failed[0].Name, failed[0].Detail)
	}
	return &rep, nil
}

// docFiles are the Markdown files that may quote the bench, relative to
// root with forward slashes: README.md and the others at the root, and
// docs/*.md (not docs/bench/, which the bench and its tools write).
func docFiles(root string) ([]string, error) {
	var out []string
	for _, dir := range []string{".", "docs"} {
		entries, err := os.ReadDir(filepath.Join(root, dir))
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			if e.Type().IsRegular() && strings.HasSuffix(e.Name(), ".md") {
				out = append(out, path.Join(dir, e.Name()))
			}
		}
	}
	if !slices.Contains(out, "README.md") {
		return nil, fmt.Errorf("no README.md in %s: -docs and -docs-check take the repository's root (../.. from cmd/txlimit-bench)", root)
	}
	return out, nil
}

// rewriteDoc returns text with every generated block written from rep,
// the blocks whose text changed ("file:line: bench:NAME …", for
// -docs-check), and what prevents writing the file.
func rewriteDoc(name, text string, rep *Report) (out string, stale, problems []string) {
	lines := strings.SplitAfter(text, "\n")
	var b strings.Builder
	open, openLine := "", 0 // the block being read, and its marker's line
	var body []string       // its lines
	hasRun, tableLine := false, 0
	flagged := false // in a table already reported as quoting figures
	fence := ""      // the fence of the code block being read, whose lines are text
	for i, line := range lines {
		n := i + 1
		if open == "" {
			trimmed := strings.TrimSpace(line)
			switch {
			case fence != "":
				if strings.HasPrefix(trimmed, fence) && strings.Trim(trimmed, fence[:1]) == "" {
					fence = ""
				}
				b.WriteString(line)
				continue
			case strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~"):
				fence = trimmed[:len(trimmed)-len(strings.TrimLeft(trimmed, trimmed[:1]))]
				b.WriteString(line)
				continue
			}
		}
		m := docMarker.FindStringSubmatch(strings.TrimRight(line, "\r\n"))
		switch {
		case m == nil && open == "":
			row := strings.HasPrefix(strings.TrimSpace(line), "|")
			if row && quotedFigure.MatchString(line) && !flagged {
				flagged = true // once a table
				problems = append(problems, fmt.Sprintf("%s:%d: a table quotes a ratio or spread outside a bench block: "+
					"generate it (<!-- bench:NAME -->, a layout in cmd/txlimit-bench/docs_layouts.go) or wrap it in "+
					"<!-- bench:external --> with its command and date", name, n))
			}
			flagged = flagged && row
			b.WriteString(line)
		case m == nil:
			body = append(body, line)
		case m[1] == "" && open != "":
			problems = append(problems, fmt.Sprintf("%s:%d: <!-- bench:%s --> inside bench:%s (opened at line %d), which is not closed", name, n, m[2], open, openLine))
			return text, nil, problems
		case m[1] == "":
			open, openLine, body = m[2], n, nil
			b.WriteString(line)
		case m[2] != open:
			problems = append(problems, fmt.Sprintf("%s:%d: <!-- /bench:%s --> closes no open block%s", name, n, m[2], openedAt(open, openLine)))
			return text, nil, problems
		default:
			old := strings.Join(body, "")
			var now string
			switch {
			case open == externalBlock:
				now = old
				if !isoDate.MatchString(old) || !codeSpan.MatchString(old) {
					problems = append(problems, fmt.Sprintf("%s:%d: bench:external holds figures of another run: give its command (in backticks) and its date (YYYY-MM-DD) inside the block", name, openLine))
				}
			case docLayouts[open] == nil:
				problems = append(problems, fmt.Sprintf("%s:%d: no layout %q; the layouts are %s (cmd/txlimit-bench/docs_layouts.go), and external", name, openLine, open, strings.Join(layoutNames(), ", ")))
				now = old
			default:
				l := docLayouts[open]
				if l.table != nil {
					tableLine = openLine
				} else {
					hasRun = true
				}
				var err error
				now, err = l.render(rep, resultsLink(name))
				if err != nil {
					problems = append(problems, fmt.Sprintf("%s:%d: bench:%s: %v", name, openLine, open, err))
					now = old
				}
			}
			if now != old {
				stale = append(stale, fmt.Sprintf("%s:%d: bench:%s%s", name, openLine, open, firstDifference(old, now, openLine)))
			}
			b.WriteString(now)
			b.WriteString(line)
			open, body = "", nil
		}
	}
	if open != "" {
		problems = append(problems, fmt.Sprintf("%s:%d: <!-- bench:%s --> is never closed (<!-- /bench:%s -->)", name, openLine, open, open))
		return text, nil, problems
	}
	if tableLine > 0 && !hasRun {
		problems = append(problems, fmt.Sprintf("%s:%d: a bench table, but no <!-- bench:run --> block in the file to say which run it comes from", name, tableLine))
	}
	return b.String(), stale, problems
}

func openedAt(open string, line int) string {
	if open == "" {
		return ""
	}
	return fmt.Sprintf(" (bench:%s is open, from line %d)", open, line)
}

// firstDifference describes the first line where a block's text (which
// starts after the marker at line marker) differs from what it should be.
func firstDifference(old, now string, marker int) string {
	a, b := strings.Split(old, "\n"), strings.Split(now, "\n")
	for i := 0; i < max(len(a), len(b)); i++ {
		var x, y string
		if i < len(a) {
			x = a[i]
		}
		if i < len(b) {
			y = b[i]
		}
		if x != y {
			return fmt.Sprintf(", first at line %d:\n      has:  %s\n      want: %s", marker+1+i, clip(x), clip(y))
		}
	}
	return ""
}

func clip(s string) string {
	if r := []rune(s); len(r) > 160 {
		return string(r[:160]) + "…"
	}
	return s
}

// resultsLink is the link from the file name (relative to the
// repository's root) to the run's whole output, results.md.
func resultsLink(name string) string {
	target := path.Join(path.Dir(docsResults), "results.md")
	rel, err := filepath.Rel(filepath.FromSlash(path.Dir(name)), filepath.FromSlash(target))
	if err != nil {
		return target
	}
	return filepath.ToSlash(rel)
}

// docsMode runs -docs or -docs-check.
func docsMode(cfg config, w io.Writer) error {
	switch {
	case cfg.Docs != "" && cfg.DocsCheck != "":
		return errors.New("-docs writes and -docs-check checks: pass one of them")
	case cfg.Docs != "":
		return runDocs(cfg.Docs, false, w)
	}
	return runDocs(cfg.DocsCheck, true, w)
}
