package main

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// A docLayout is one kind of generated block (docs.go): the run paragraph,
// or a table of the run's figures (which needs a run paragraph in its
// file).
type docLayout struct {
	table *docTable // nil for the run paragraph
}

// render writes the block from a run's results; link is the path from the
// document to the run's results.md.
func (l *docLayout) render(rep *Report, link string) (string, error) {
	if l.table == nil {
		return renderRun(rep, link)
	}
	return l.table.render(rep)
}

// docLayouts are the blocks the docs may generate, by marker name. A table
// is a list of lines, each a label and, per client count, one or more
// figures of the run's rows: a ratio of two rows' transactions a second
// (over), of their limit steps' p50 latency (stepOver), or a row's
// transactions a second with the spread of its runs (opsOf).
var docLayouts = map[string]*docLayout{
	"run": {},

	// README.md, Performance.
	"readme": {table: &docTable{
		clients: pgClients,
		lines: []docLine{
			{label: "distinct keys: txlimit ÷ hand-written `SELECT … FOR UPDATE; UPDATE`, PostgreSQL / MariaDB",
				cells: []docCell{over(pg("distinct", implTxlimit), pg("distinct", implFloor)), over(my("distinct", implTxlimit), my("distinct", implFloor))}},
			{label: "one hot key, `Shards: 16` ÷ hand-written SQL on one row",
				cells: []docCell{over(pg("hot-shards16", implTxlimit), pg("hot", implFloor))}},
			{label: "business transaction: `LimitTx` ÷ `redis_rate` beside it",
				cells: []docCell{over(pg("business", implTxlimit), pg("business", implRedisRate))}},
			{label: "business transaction: `Commit` (take with the COMMIT) / `pgstore.SendBatch` ÷ `redis_rate`",
				cells: []docCell{over(pg("business", implCommit), pg("business", implRedisRate)), over(pg("business", implBatch), pg("business", implRedisRate))}},
			{label: "business transaction, one hot key: `Commit` with " + leaseLabel + " ÷ `redis_rate`",
				cells: []docCell{over(pg("business-hot", implCommitLease), pg("business-hot", implRedisRate))}},
		},
		caption: "Ratios of transactions a second, both sides measured in the run.",
	}},

	// docs/performance.md: txlimit against the SQL it replaces.
	"sql": {table: &docTable{
		corner:  "txlimit (pgstore) ÷ hand-written SQL, PostgreSQL",
		clients: pgClients,
		lines: []docLine{
			{label: "each client its own key", cells: []docCell{over(pg("distinct", implTxlimit), pg("distinct", implFloor))}},
			{label: "same, `pgsqlstore`", cells: []docCell{over(pg("distinct", implTxlimitSQL), pg("distinct", implFloor))}},
			{label: "one hot key", cells: []docCell{over(pg("hot", implTxlimit), pg("hot", implFloor))}},
			{label: "one hot key, `Shards: 16` ÷ the sharded hand-written SQL", cells: []docCell{over(pg("hot-shards16", implTxlimit), pg("hot-shards16", implFloor))}},
			{label: "one hot key, `Shards: 64` ÷ the same", cells: []docCell{over(pg("hot-shards64", implTxlimit), pg("hot-shards64", implFloor))}},
			{label: "one hot key, `Shards: 16` ÷ the hand-written SQL on one row", cells: []docCell{over(pg("hot-shards16", implTxlimit), pg("hot", implFloor))}},
		},
		caption: "Transactions a second, txlimit's over the hand-written SQL's.",
	}},

	// docs/performance.md: the take at commit.
	"commit": {table: &docTable{
		corner:  "business transaction ÷ the same with `redis_rate` beside it",
		clients: pgClients,
		lines: []docLine{
			{label: "`LimitTx` (the limit step in the transaction)", cells: []docCell{over(pg("business", implTxlimit), pg("business", implRedisRate))}},
			{label: "`Commit` (the take in one pipeline with the COMMIT)", cells: []docCell{over(pg("business", implCommit), pg("business", implRedisRate))}},
			{label: "`pgstore.SendBatch` (the take ahead of the INSERT in one batch)", cells: []docCell{over(pg("business", implBatch), pg("business", implRedisRate))}},
			{label: "`Commit` with " + leaseLabel, cells: []docCell{over(pg("business", implCommitLease), pg("business", implRedisRate))}},
			{label: "the same ÷ no limit at all", cells: []docCell{over(pg("business", implCommitLease), pg("business", implNone))}},
			{label: "**one hot key**: `Commit` with " + leaseLabel, cells: []docCell{over(pg("business-hot", implCommitLease), pg("business-hot", implRedisRate))}},
			{label: "one hot key: the same ÷ its own figure on distinct keys", cells: []docCell{over(pg("business-hot", implCommitLease), pg("business", implCommitLease))}},
			{label: "one hot key: `Commit` without a lease", cells: []docCell{over(pg("business-hot", implCommit), pg("business-hot", implRedisRate))}},
			{label: "one hot key: `pgstore.SendBatch`", cells: []docCell{over(pg("business-hot", implBatch), pg("business-hot", implRedisRate))}},
			{label: "one hot key: `LimitTx`", cells: []docCell{over(pg("business-hot", implTxlimit), pg("business-hot", implRedisRate))}},
		},
		caption: "Transactions a second, one over the other, on PostgreSQL.",
	}},

	// docs/performance.md: against Redis, the limit step alone.
	"redis": {table: &docTable{
		corner:  "business transaction, each client its own key",
		clients: pgClients,
		lines: []docLine{
			{label: "txlimit ÷ Redis `EVALSHA`, transactions a second", cells: []docCell{over(pg("business", implTxlimit), pg("business", implRedis))}},
			{label: "txlimit ÷ hand-written SQL, transactions a second", cells: []docCell{over(pg("business", implTxlimit), pg("business", implFloor))}},
			{label: "limit step p50: txlimit ÷ Redis", cells: []docCell{stepOver(pg("business", implTxlimit), pg("business", implRedis))}},
			{label: "limit step p50: txlimit ÷ hand-written SQL", cells: []docCell{stepOver(pg("business", implTxlimit), pg("business", implFloor))}},
		},
		caption: "A latency ratio below 1 is a faster step.",
	}},

	// docs/performance.md: a concurrency slot around the business
	// transaction against the Redis semaphore beside it.
	"slots": {table: &docTable{
		corner:  "a slot around the business transaction",
		clients: pgClients,
		lines: []docLine{
			{label: "each client its own key: txlimit (`LimitTx`, then `ReleaseTx` in the next transaction) ÷ the Redis semaphore (`EVALSHA`, then `ZREM`), transactions a second",
				cells: []docCell{over(pg("slots", implSlot), pg("slots", implRedisSemaphore))}},
			{label: "one hot key: the same", cells: []docCell{over(pg("slots-hot", implSlot), pg("slots-hot", implRedisSemaphore))}},
			{label: "acquire + release p50, each client its own key: txlimit ÷ the Redis semaphore",
				cells: []docCell{stepOver(pg("slots", implSlot), pg("slots", implRedisSemaphore))}},
			{label: "one hot key ÷ distinct keys: txlimit / the Redis semaphore",
				cells: []docCell{over(pg("slots-hot", implSlot), pg("slots", implSlot)), over(pg("slots-hot", implRedisSemaphore), pg("slots", implRedisSemaphore))}},
		},
		caption: "Ratios of transactions a second (and of the p50 of the acquire and the release together, where a ratio below 1 is faster), both sides measured in the run.",
	}},

	// docs/performance.md: the other stores.
	"stores": {table: &docTable{
		corner:  "transactions a second, same run",
		clients: pgClients,
		lines: []docLine{
			{label: "`pgsqlstore` ÷ `pgstore`, each client its own key", cells: []docCell{over(pg("distinct", implTxlimitSQL), pg("distinct", implTxlimit))}},
			{label: "`pgsqlstore` ÷ `pgstore`, business transaction", cells: []docCell{over(pg("business", implTxlimitSQL), pg("business", implTxlimit))}},
			{label: "`pgsqlstore` ÷ `pgstore`, one hot key over 16 shards", cells: []docCell{over(pg("hot-shards16", implTxlimitSQL), pg("hot-shards16", implTxlimit))}},
			{label: "`pgsqlstore` ÷ `pgstore`, one hot key over 64 shards", cells: []docCell{over(pg("hot-shards64", implTxlimitSQL), pg("hot-shards64", implTxlimit))}},
			{label: "SQLite: txlimit ÷ hand-written SQL, each client its own key", only: sqliteClients, cells: []docCell{over(lite("distinct", implTxlimit), lite("distinct", implFloor))}},
			{label: "SQLite: the same, one hot key", only: sqliteClients, cells: []docCell{over(lite("hot", implTxlimit), lite("hot", implFloor))}},
			{label: "MariaDB: txlimit ÷ hand-written SQL, each client its own key", cells: []docCell{over(my("distinct", implTxlimit), my("distinct", implFloor))}},
			{label: "MariaDB: the same, one hot key", cells: []docCell{over(my("hot", implTxlimit), my("hot", implFloor))}},
			{label: "MariaDB: the same, business transaction", cells: []docCell{over(my("business", implTxlimit), my("business", implFloor))}},
		},
		caption: "Transactions a second, one over the other. SQLite is measured at " + clientList(sqliteClients) + " (the bench's -sqlite-clients).",
	}},

	// docs/sharding.md, Measured.
	"shards": {table: &docTable{
		corner:  "txlimit (pgstore), one hot key",
		clients: pgClients,
		lines: []docLine{
			{label: "one row ÷ distinct keys", cells: []docCell{over(pg("hot", implTxlimit), pg("distinct", implTxlimit))}},
			{label: "`Shards: 4` ÷ the floor on one row", cells: []docCell{over(pg("hot-shards4", implTxlimit), pg("hot", implFloor))}},
			{label: "`Shards: 16` ÷ the floor on one row", cells: []docCell{over(pg("hot-shards16", implTxlimit), pg("hot", implFloor))}},
			{label: "`Shards: 64` ÷ the floor on one row", cells: []docCell{over(pg("hot-shards64", implTxlimit), pg("hot", implFloor))}},
			{label: "`Shards: 16` ÷ distinct keys", cells: []docCell{over(pg("hot-shards16", implTxlimit), pg("distinct", implTxlimit))}},
			{label: "`Shards: 64` ÷ distinct keys", cells: []docCell{over(pg("hot-shards64", implTxlimit), pg("distinct", implTxlimit))}},
			{label: "the hand-written sharded SQL, 16 rows ÷ its distinct keys", cells: []docCell{over(pg("hot-shards16", implFloor), pg("distinct", implFloor))}},
		},
		caption: "Transactions a second, one over the other.",
	}},

	// docs/hot-keys.md, Numbers.
	"hot-keys": {table: &docTable{
		corner:  "one hot key, business transaction",
		clients: pgClients,
		lines: []docLine{
			{label: "`LimitTx`, one row", cells: []docCell{opsOf(pg("business-hot", implTxlimit))}},
			{label: "`Commit`", cells: []docCell{opsOf(pg("business-hot", implCommit))}},
			{label: "`Commit` with `Lease`", cells: []docCell{opsOf(pg("business-hot", implCommitLease))}},
			{label: "`pgstore.SendBatch`", cells: []docCell{opsOf(pg("business-hot", implBatch))}},
			{label: "`redis_rate` beside the transaction", cells: []docCell{opsOf(pg("business-hot", implRedisRate))}},
			{label: "`LimitTx`, one row ÷ `redis_rate`", cells: []docCell{over(pg("business-hot", implTxlimit), pg("business-hot", implRedisRate))}},
			{label: "`Commit` with `Lease` ÷ one row (`LimitTx`)", cells: []docCell{over(pg("business-hot", implCommitLease), pg("business-hot", implTxlimit))}},
			{label: "`Commit` with `Lease` ÷ `redis_rate`", cells: []docCell{over(pg("business-hot", implCommitLease), pg("business-hot", implRedisRate))}},
			{label: "`Commit` with `Lease` ÷ its own on distinct keys", cells: []docCell{over(pg("business-hot", implCommitLease), pg("business", implCommitLease))}},
		},
		caption:       "Transactions a second with the spread of their runs (half their range over the median), then ratios of them.",
		spreadInCells: true,
	}},
}

// The client counts the layouts quote: the bench's defaults (-clients,
// -sqlite-clients).
var (
	pgClients     = []int{1, 8, 32}
	sqliteClients = []int{1, 8}
)

// leaseLabel is the lease of the bench's txlimit/commit+lease.
var leaseLabel = fmt.Sprintf("`Lease: %d, LeaseAhead: %d`", leaseSize, leaseSize/2)

func layoutNames() []string {
	var out []string
	for name := range docLayouts {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// docRef names the rows of one database, scenario and implementation.
type docRef struct{ db, scenario, impl string }

func pg(scenario, impl string) docRef   { return docRef{"postgres", scenario, impl} }
func my(scenario, impl string) docRef   { return docRef{"mysql", scenario, impl} }
func lite(scenario, impl string) docRef { return docRef{"sqlite", scenario, impl} }

// docCell is one figure at a client count: a's transactions a second over
// b's (or the limit step's p50 latency, with step), or with no b a's
// transactions a second.
type docCell struct {
	a, b docRef
	step bool
}

func over(a, b docRef) docCell     { return docCell{a: a, b: b} }
func stepOver(a, b docRef) docCell { return docCell{a: a, b: b, step: true} }
func opsOf(a docRef) docCell       { return docCell{a: a} }

// docLine is a row of a table: its label, and its figures at each client
// count, several joined by " / ".
type docLine struct {
	label string
	cells []docCell
	only  []int // the client counts measured for this line (nil: all), "—" elsewhere
}

type docTable struct {
	corner  string // the header of the labels' column
	clients []int
	lines   []docLine
	// caption follows the table, with the spread of the runs behind its
	// figures unless spreadInCells (every figure of transactions a second
	// then carries its own).
	caption       string
	spreadInCells bool
}

func (t docTable) render(rep *Report) (string, error) {
	type cellKey struct {
		docRef
		clients int
	}
	rows := map[cellKey]*Row{}
	for i := range rep.Rows {
		r := &rep.Rows[i]
		rows[cellKey{docRef{r.DB, r.Scenario, r.Impl}, r.Clients}] = r
	}
	var missing []string
	var used []*Row
	row := func(ref docRef, clients int, step bool) *Row {
		r := rows[cellKey{ref, clients}]
		what := fmt.Sprintf("%s %s %s at %s", ref.db, ref.scenario, ref.impl, clientList([]int{clients}))
		switch {
		case r == nil:
			what = "no row " + what
		case step && r.StepP50Ms <= 0:
			what = "no limit step timed in " + what
		case !step && r.OpsPerSec <= 0:
			what = "no transactions a second in " + what
		default:
			if !slices.Contains(used, r) {
				used = append(used, r)
			}
			return r
		}
		if !slices.Contains(missing, what) {
			missing = append(missing, what)
		}
		return nil
	}

	var b strings.Builder
	b.WriteString(strings.ReplaceAll("| "+t.corner+" |", "|  |", "| |"))
	for _, n := range t.clients {
		b.WriteString(" " + clientList([]int{n}) + " |")
	}
	b.WriteString("\n| --- |" + strings.Repeat(" ---: |", len(t.clients)) + "\n")
	for _, l := range t.lines {
		b.WriteString("| " + l.label + " |")
		for _, n := range t.clients {
			if l.only != nil && !slices.Contains(l.only, n) {
				b.WriteString(" — |")
				continue
			}
			var figures []string
			for _, c := range l.cells {
				a := row(c.a, n, c.step)
				if c.b == (docRef{}) {
					if a != nil {
						figures = append(figures, opsFigure(a, t.spreadInCells))
					}
					continue
				}
				d := row(c.b, n, c.step)
				if a == nil || d == nil {
					continue
				}
				if c.step {
					figures = append(figures, fmt.Sprintf("%.2f×", a.StepP50Ms/d.StepP50Ms))
				} else {
					figures = append(figures, fmt.Sprintf("%.2f×", a.OpsPerSec/d.OpsPerSec))
				}
			}
			b.WriteString(" " + strings.Join(figures, " / ") + " |")
		}
		b.WriteString("\n")
	}
	if len(missing) > 0 {
		return "", fmt.Errorf("%s has %s: measure them (the run's -subjects, -clients, -shards, -sqlite, -mysql) or change the layout in cmd/txlimit-bench/docs_layouts.go",
			docsResults, strings.Join(missing, "; "))
	}
	caption := t.caption
	if lo, hi, ok := spreadRange(used); ok && !t.spreadInCells {
		spread := fmt.Sprintf("±%d–%d%%", lo, hi)
		if lo == hi {
			spread = fmt.Sprintf("±%d%%", lo)
		}
		caption += " The runs behind these figures spread by " + spread + " (half their range over the median)."
	}
	b.WriteString("\n" + wrap(caption))
	return b.String(), nil
}

// opsFigure is a row's transactions a second, grouped by thousands, and
// with spread the spread of its runs.
func opsFigure(r *Row, spread bool) string {
	s := strconv.FormatFloat(math.Round(r.OpsPerSec), 'f', 0, 64)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if p, ok := rowSpread(r); ok && spread {
		s += fmt.Sprintf(" ±%d%%", p)
	}
	return s
}

// rowSpread is half the range of a row's runs over their median, in whole
// percent (as results.md shows it); false for a single run.
func rowSpread(r *Row) (int, bool) {
	if len(r.Runs) < 2 || r.OpsPerSec <= 0 {
		return 0, false
	}
	return int(math.Round(50 * (slices.Max(r.Runs) - slices.Min(r.Runs)) / r.OpsPerSec)), true
}

func spreadRange(rows []*Row) (lo, hi int, ok bool) {
	for _, r := range rows {
		p, has := rowSpread(r)
		if !has {
			continue
		}
		if !ok {
			lo, hi, ok = p, p, true
		}
		lo, hi = min(lo, p), max(hi, p)
	}
	return lo, hi, ok
}

// clientList reads "1 client", "8 clients", "1 and 8 clients".
func clientList(counts []int) string {
	if len(counts) == 1 && counts[0] == 1 {
		return "1 client"
	}
	s := make([]string, len(counts))
	for i, n := range counts {
		s[i] = strconv.Itoa(n)
	}
	if len(s) > 1 {
		return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1] + " clients"
	}
	return s[0] + " clients"
}

// renderRun is the run block: which run the figures of a document come
// from, and what it ran on.
func renderRun(rep *Report, link string) (string, error) {
	if rep.Command == "" || rep.Generated.IsZero() {
		return "", fmt.Errorf("%s records no command or date", docsResults)
	}
	var servers []string
	if rep.Postgres != "" {
		servers = append(servers, firstWords(rep.Postgres, 2))
	}
	if rep.MySQL != "" {
		servers = append(servers, mysqlVersion(rep.MySQL))
	}
	if rep.Redis != "" {
		servers = append(servers, rep.Redis)
	}
	if rep.SQLite != "" {
		servers = append(servers, "SQLite "+rep.SQLite)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "The bench's figures here come from one run of `%s` on %s: %s on %s, %d CPUs", benchCommand(rep.Command), runDate(rep), rep.Go, rep.Platform, rep.CPUs)
	if rep.LoadStart != "" && rep.LoadEnd != "" {
		fmt.Fprintf(&b, " (load average %s at its start, %s at its end)", firstWords(rep.LoadStart, 1), firstWords(rep.LoadEnd, 1))
	}
	if len(servers) > 0 {
		fmt.Fprintf(&b, ", against %s", joinAnd(servers))
	}
	each := fmt.Sprintf("the median of %d runs of %s", rep.Repeats, rep.Duration)
	if rep.Repeats == 1 {
		each = "one run of " + rep.Duration
	}
	fmt.Fprintf(&b, ". Each figure is %s, the runs of all cells of a client count interleaved", each)
	if n := len(rep.Checks); n > 0 {
		fmt.Fprintf(&b, "; all %d admission checks passed", n)
	}
	fmt.Fprintf(&b, ". The run's whole output: [%s](%s).", link, link)
	return wrap(b.String()), nil
}

// docsWidth is the width the docs' paragraphs are wrapped to.
const docsWidth = 95

// wrap fills a paragraph into lines of at most docsWidth characters where
// it can, never breaking a code span, and ends it with a newline.
func wrap(paragraph string) string {
	var words []string
	inCode := false
	for _, w := range strings.Fields(paragraph) {
		if inCode {
			words[len(words)-1] += " " + w
		} else {
			words = append(words, w)
		}
		if strings.Count(w, "`")%2 == 1 {
			inCode = !inCode
		}
	}
	var b strings.Builder
	width := 0
	for i, w := range words {
		n := utf8.RuneCountInString(w)
		switch {
		case i == 0:
		case width+1+n > docsWidth:
			b.WriteString("\n")
			width = 0
		default:
			b.WriteString(" ")
			width++
		}
		b.WriteString(w)
		width += n
	}
	return b.String() + "\n"
}

func runDate(rep *Report) string { return rep.Generated.UTC().Format("2006-01-02 15:04 MST") }

// benchCommand is the recorded command line as it is run from the
// repository's root, its arguments quoted for a POSIX shell where they need
// it (the -dsn value, redacted to …, stays as recorded).
func benchCommand(recorded string) string {
	args, ok := strings.CutPrefix(recorded, "txlimit-bench")
	if !ok {
		return recorded
	}
	var out []string
	if args = strings.TrimPrefix(args, " "); args != "" {
		// parseFlags joined the arguments with single spaces: an empty
		// argument (-shards '') left two in a row.
		for _, a := range strings.Split(args, " ") {
			out = append(out, shellQuote(a))
		}
	}
	return strings.TrimSpace("cd cmd/txlimit-bench && go run . " + strings.Join(out, " "))
}

func shellQuote(s string) string {
	if s == "…" {
		return s
	}
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./:,=+@%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func firstWords(s string, n int) string {
	f := strings.Fields(s)
	return strings.Join(f[:min(n, len(f))], " ")
}

// mysqlVersion reads the server's VERSION(): "10.11.19-MariaDB-0+deb12u1"
// is MariaDB 10.11.19, "8.4.3" MySQL 8.4.3.
func mysqlVersion(v string) string {
	number, _, _ := strings.Cut(v, "-")
	if strings.Contains(v, "MariaDB") {
		return "MariaDB " + number
	}
	return "MySQL " + number
}

func joinAnd(s []string) string {
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}
