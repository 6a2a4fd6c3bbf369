package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDocsMatchResults is CI's docs check from the tests: the bench blocks
// of the repository's README.md and docs/*.md are what docs/bench/results.json
// gives.
func TestDocsMatchResults(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, runDocs(filepath.Join("..", ".."), true, &out), "rewrite them: (cd cmd/txlimit-bench && go run . -docs ../..)")
}

// TestDocLayoutsRender renders every layout from the committed results, so
// that a layout no document uses yet still names rows a full run has.
func TestDocLayoutsRender(t *testing.T) {
	rep := committedResults(t)
	for _, name := range layoutNames() {
		out, err := docLayouts[name].render(rep, "bench/results.md")
		require.NoError(t, err, name)
		require.NotContains(t, out, "| |\n", name)
	}
}

// TestDocLayoutsFindTheirRows: every row a table quotes is a cell that a
// full run of this code measures (the documented command: -mysql, Redis,
// the default -clients, -shards and -sqlite-clients), so that the rewrite
// after a new run finds it.
func TestDocLayoutsFindTheirRows(t *testing.T) {
	cfg, err := parseFlags([]string{"-dsn", "postgres://localhost/test", "-mysql", "root:@tcp(127.0.0.1:3306)/"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, cfg.Clients, pgClients, "the tables' columns are the default -clients")
	require.Equal(t, cfg.SQLiteClients, sqliteClients, "SQLite's lines are the default -sqlite-clients")
	type at struct {
		docRef
		clients int
	}
	measured := map[at]bool{}
	add := func(cells []cell) {
		for _, c := range cells {
			measured[at{docRef{c.db, c.scenario.name, c.impl}, c.clients}] = true
		}
	}
	for _, n := range cfg.Clients {
		add(cellsOf("postgres", pgScenarios(cfg.Shards), pgImpls(true), n))
	}
	for _, n := range cfg.SQLiteClients {
		// The scenarios of (*bench).sqlite.
		add(cellsOf("sqlite", []scenario{{name: "distinct", shards: 1}, {name: "hot", hot: true, shards: 1}}, sqliteImpls(), n))
	}
	for _, n := range cfg.MySQLClients {
		add(cellsOf("mysql", mysqlScenarios(), mysqlImpls(), n))
	}
	for _, name := range layoutNames() {
		tbl := docLayouts[name].table
		if tbl == nil {
			continue
		}
		for _, l := range tbl.lines {
			for _, n := range tbl.clients {
				if l.only != nil && !slices.Contains(l.only, n) {
					continue
				}
				for _, c := range l.cells {
					for _, ref := range []docRef{c.a, c.b} {
						if ref != (docRef{}) {
							require.True(t, measured[at{ref, n}], "bench:%s, %q: a full run has no cell %v at %d clients", name, l.label, ref, n)
						}
					}
				}
			}
		}
	}
}

func committedResults(t *testing.T) *Report {
	t.Helper()
	rep, err := readResults(filepath.Join("..", "..", filepath.FromSlash(docsResults)))
	require.NoError(t, err)
	return rep
}

// docsRepo writes a repository root holding readme as README.md, a
// docs/guide.md, and rep as docs/bench/results.json.
func docsRepo(t *testing.T, readme, guide string, rep *Report) string {
	t.Helper()
	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, "docs", "bench"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "README.md"), []byte(readme), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(root, "docs", "guide.md"), []byte(guide), 0o644))
	writeResults(t, root, rep)
	return root
}

func writeResults(t *testing.T, root string, rep *Report) {
	t.Helper()
	data, err := json.Marshal(rep)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(root, "docs", "bench", "results.json"), data, 0o644))
}

func readDoc(t *testing.T, root, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(name)))
	require.NoError(t, err)
	return string(data)
}

const staleReadme = "# x\n\nBefore.\n\n<!-- bench:run -->\nan old run\n<!-- /bench:run -->\n\n" +
	"<!-- bench:readme -->\n| old | table |\n<!-- /bench:readme -->\n\nAfter.\n"

const staleGuide = "# Guide\n\n<!-- bench:run -->\n<!-- /bench:run -->\n\n<!-- bench:shards -->\n<!-- /bench:shards -->\n"

func TestDocsRewriteThenCheck(t *testing.T) {
	rep := committedResults(t)
	root := docsRepo(t, staleReadme, staleGuide, rep)

	err := runDocs(root, true, &bytes.Buffer{})
	require.ErrorContains(t, err, "README.md:5: bench:run, first at line 6:")
	require.ErrorContains(t, err, "README.md:9: bench:readme")
	require.ErrorContains(t, err, "docs/guide.md:6: bench:shards")
	require.ErrorContains(t, err, "go run . -docs ../..")

	var out bytes.Buffer
	require.NoError(t, runDocs(root, false, &out))
	require.Contains(t, out.String(), "wrote README.md\nwrote docs/guide.md\n")
	readme := readDoc(t, root, "README.md")
	require.True(t, strings.HasPrefix(readme, "# x\n\nBefore.\n\n<!-- bench:run -->\nThe bench's figures here come from one run of\n"), readme)
	require.True(t, strings.HasSuffix(readme, "<!-- /bench:readme -->\n\nAfter.\n"), readme)
	require.Contains(t, readme, "`cd cmd/txlimit-bench && go run . -dsn … -mysql 'root:@tcp(127.0.0.1:3306)/' -out ../../docs/bench`")
	require.Contains(t, readme, "on "+runDate(rep)+":")
	require.Contains(t, readme, "[docs/bench/results.md](docs/bench/results.md)")
	require.Contains(t, readDoc(t, root, "docs/guide.md"), "[bench/results.md](bench/results.md)")
	require.Contains(t, readme, "| distinct keys: txlimit ÷ hand-written")
	require.NotContains(t, readme, "old")

	require.NoError(t, runDocs(root, true, &bytes.Buffer{}), "a rewritten file passes the check")
	out.Reset()
	require.NoError(t, runDocs(root, false, &out))
	require.Contains(t, out.String(), "0 bench blocks, 0 files rewritten", "a second rewrite changes nothing")

	// A new run with other figures: the check names the block and its line.
	rep.Rows[slices.IndexFunc(rep.Rows, func(r Row) bool {
		return r.DB == "postgres" && r.Scenario == "hot-shards16" && r.Impl == implTxlimit && r.Clients == 8
	})].OpsPerSec *= 2
	writeResults(t, root, rep)
	err = runDocs(root, true, &bytes.Buffer{})
	require.ErrorContains(t, err, "2 bench blocks differ")
	// The figures are the committed run's: the 8-client ratio doubles, the
	// others stay.
	line := regexp.MustCompile("README.md:15: bench:readme, first at line 19:\n      has:  \\| one hot key, `Shards: 16` ÷ hand-written SQL on one row \\| (\\S+)× \\| (\\S+)× \\| (\\S+)× \\|\n" +
		"      want: \\| one hot key, `Shards: 16` ÷ hand-written SQL on one row \\| (\\S+)× \\| (\\S+)× \\| (\\S+)× \\|").FindStringSubmatch(err.Error())
	require.NotNil(t, line, err.Error())
	fig := func(i int) float64 {
		f, perr := strconv.ParseFloat(line[i], 64)
		require.NoError(t, perr)
		return f
	}
	require.Equal(t, line[1], line[4], "1 client")
	require.InDelta(t, 2*fig(2), fig(5), 0.016, "8 clients: twice the figure, each rounded to 0.01")
	require.Equal(t, line[3], line[6], "32 clients")
	require.ErrorContains(t, err, "docs/guide.md:12: bench:shards, first at line 17:")
}

// TestDocsNewRowsChangeNothing: a run that measured more (new subjects or
// scenarios) writes the same blocks.
func TestDocsNewRowsChangeNothing(t *testing.T) {
	rep := committedResults(t)
	root := docsRepo(t, staleReadme, staleGuide, rep)
	require.NoError(t, runDocs(root, false, &bytes.Buffer{}))
	before := readDoc(t, root, "README.md") + readDoc(t, root, "docs/guide.md")

	rep.Rows = append(rep.Rows,
		Row{DB: "postgres", Scenario: "tpcb", Impl: implTxlimit, Clients: 8, OpsPerSec: 900, Runs: []float64{800, 900, 1000}},
		Row{DB: "postgres", Scenario: "business-hot", Impl: implShards16, Clients: 32, OpsPerSec: 900})
	writeResults(t, root, rep)
	require.NoError(t, runDocs(root, true, &bytes.Buffer{}))
	require.Equal(t, before, readDoc(t, root, "README.md")+readDoc(t, root, "docs/guide.md"))
}

// TestDocsMissingRow: a run that left a subject out fails, naming the row,
// and writes nothing.
func TestDocsMissingRow(t *testing.T) {
	rep := committedResults(t)
	rep.Rows = slices.DeleteFunc(rep.Rows, func(r Row) bool {
		return r.DB == "postgres" && r.Scenario == "business-hot" && r.Impl == implRedisRate && r.Clients == 32
	})
	root := docsRepo(t, staleReadme, staleGuide, rep)
	err := runDocs(root, false, &bytes.Buffer{})
	require.ErrorContains(t, err, "nothing written")
	require.ErrorContains(t, err, "README.md:9: bench:readme: docs/bench/results.json has no row postgres business-hot redis_rate at 32 clients: measure them")
	require.Equal(t, staleReadme, readDoc(t, root, "README.md"))
	require.Equal(t, staleGuide, readDoc(t, root, "docs/guide.md"), "no file is written, not even one whose blocks could be")
}

func TestDocsRefusesFailedChecks(t *testing.T) {
	rep := committedResults(t)
	rep.Checks = append(rep.Checks, check{Name: "postgres hot txlimit exact", Detail: "admitted 101 of 100"})
	root := docsRepo(t, staleReadme, staleGuide, rep)
	require.ErrorContains(t, runDocs(root, false, &bytes.Buffer{}),
		fmt.Sprintf("1 of %d admission checks failed (first: postgres hot txlimit exact: admitted 101 of 100)", len(rep.Checks)))
}

func TestDocsProblems(t *testing.T) {
	rep := committedResults(t)
	for _, tc := range []struct{ name, guide, want string }{
		{"a table copied by hand", "# G\n\n| a | b |\n| --- | --- |\n| x | 1.20× |\n| y | 2,000 ±3% |\n",
			"docs/guide.md:5: a table quotes a ratio or spread outside a bench block"},
		{"external without its date", "<!-- bench:external -->\n`go run .`\n\n| x | 1.20× |\n<!-- /bench:external -->\n",
			"docs/guide.md:1: bench:external holds figures of another run: give its command (in backticks) and its date"},
		{"an unknown layout", "<!-- bench:run -->\n<!-- /bench:run -->\n<!-- bench:nosuch -->\n<!-- /bench:nosuch -->\n",
			`docs/guide.md:3: no layout "nosuch"`},
		{"a block never closed", "<!-- bench:shards -->\n| x |\n", "docs/guide.md:1: <!-- bench:shards --> is never closed"},
		{"a block closed by another", "<!-- bench:shards -->\n<!-- /bench:run -->\n", "docs/guide.md:2: <!-- /bench:run --> closes no open block (bench:shards is open, from line 1)"},
		{"a block in a block", "<!-- bench:shards -->\n<!-- bench:run -->\n", "docs/guide.md:2: <!-- bench:run --> inside bench:shards"},
		{"a table but no run", "<!-- bench:shards -->\n<!-- /bench:shards -->\n", "docs/guide.md:1: a bench table, but no <!-- bench:run --> block"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := docsRepo(t, staleReadme, tc.guide, rep)
			require.ErrorContains(t, runDocs(root, true, &bytes.Buffer{}), tc.want)
			require.ErrorContains(t, runDocs(root, false, &bytes.Buffer{}), tc.want)
			require.Equal(t, staleReadme, readDoc(t, root, "README.md"))
		})
	}

	fenced := "```markdown\n<!-- bench:shards -->\n| x | 1.20× |\n```\n\n~~~~\n<!-- /bench:run -->\n~~~\n~~~~~\n"
	root := docsRepo(t, staleReadme, fenced, rep)
	require.NoError(t, runDocs(root, false, &bytes.Buffer{}), "markers and tables in code blocks are text")
	require.Equal(t, fenced, readDoc(t, root, "docs/guide.md"))

	external := "**Run A, 2026-11-28**: `go run . -subjects floor`\n\n| x | 1 client |\n| --- | ---: |\n| y | 1.20× |\n"
	root = docsRepo(t, staleReadme, "<!-- bench:external -->\n"+external+"<!-- /bench:external -->\n", rep)
	require.NoError(t, runDocs(root, false, &bytes.Buffer{}))
	require.Equal(t, "<!-- bench:external -->\n"+external+"<!-- /bench:external -->\n", readDoc(t, root, "docs/guide.md"), "left as it is")
}

func TestBenchCommand(t *testing.T) {
	require.Equal(t, "cd cmd/txlimit-bench && go run . -dsn … -mysql 'root:@tcp(127.0.0.1:3306)/' -out ../../docs/bench",
		benchCommand("txlimit-bench -dsn … -mysql root:@tcp(127.0.0.1:3306)/ -out ../../docs/bench"))
	require.Equal(t, "cd cmd/txlimit-bench && go run . -subjects floor,txlimit -shards '' -sqlite=false",
		benchCommand("txlimit-bench -subjects floor,txlimit -shards  -sqlite=false"), "an empty argument")
	require.Equal(t, "cd cmd/txlimit-bench && go run .", benchCommand("txlimit-bench "))
}

func TestWrap(t *testing.T) {
	long := strings.Repeat("word ", 30) + "`a code span that must not break` end"
	for _, line := range strings.Split(strings.TrimSuffix(wrap(long), "\n"), "\n") {
		require.LessOrEqual(t, len([]rune(line)), docsWidth, line)
		require.Equal(t, 0, strings.Count(line, "`")%2, "a code span split: %q", line)
	}
}
