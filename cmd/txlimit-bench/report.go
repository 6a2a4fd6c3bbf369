package main

import (
	"bytes"
	"cmp"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Row is one measured cell: the medians of its runs.
type Row struct {
	DB       string `json:"db"`
	Scenario string `json:"scenario"`
	Impl     string `json:"impl"`
	Shards   int    `json:"shards"`
	Clients  int    `json:"clients"`
	// Business is set in the business scenario, whose transactions insert
	// an order beside the limit step.
	Business  bool    `json:"business,omitempty"`
	OpsPerSec float64 `json:"ops_per_sec"`
	P50Ms     float64 `json:"p50_ms"`
	P99Ms     float64 `json:"p99_ms"`
	// StepP50Ms and StepP99Ms are the latency of the limit step alone (the
	// time around LimitTx, the floor's statements, Redis's EVALSHA), BEGIN,
	// business write and COMMIT left out. 0 for "none".
	StepP50Ms float64 `json:"step_p50_ms,omitempty"`
	StepP99Ms float64 `json:"step_p99_ms,omitempty"`
	// VsFloor is the throughput over the floor's, same scenario and client
	// count (for hot-shards, the hand-written sharded floor). 0 for the
	// floor itself.
	VsFloor float64 `json:"vs_floor,omitempty"`
	// VsRedis is the throughput over that of the business transaction with
	// the Redis limiter, same scenario and client count (business only).
	VsRedis float64 `json:"vs_redis,omitempty"`
	// VsRedisRate and VsNone are the same over redis_rate beside the
	// transaction and over the transaction with no limit (business
	// scenarios only).
	VsRedisRate float64 `json:"vs_redis_rate,omitempty"`
	VsNone      float64 `json:"vs_none,omitempty"`
	// VsSemaphore is, in the slot scenarios, the throughput over that of
	// the business transaction with the Redis semaphore beside it, and
	// StepVsSemaphore the step's p50 (acquire and release) over its.
	VsSemaphore     float64 `json:"vs_redis_semaphore,omitempty"`
	StepVsSemaphore float64 `json:"step_p50_vs_redis_semaphore,omitempty"`
	// StepVsFloor and StepVsRedis are the limit step's p50 over the
	// floor's and Redis's (lower is faster); the P99 ones the same for p99.
	StepVsFloor    float64 `json:"step_p50_vs_floor,omitempty"`
	StepVsRedis    float64 `json:"step_p50_vs_redis,omitempty"`
	StepP99VsFloor float64 `json:"step_p99_vs_floor,omitempty"`
	StepP99VsRedis float64 `json:"step_p99_vs_redis,omitempty"`
	// VsHotFloor is, for txlimit on a sharded hot key, its throughput over
	// the floor's on the same key unsharded (one row): what shards gain;
	// and on the hot key inside a business transaction (business-hot),
	// the throughput over the floor's on that one row in the same
	// transaction: what the answers for a hot key gain.
	VsHotFloor float64 `json:"vs_hot_floor,omitempty"`
	// VsDistinct is, on a hot key, the throughput over the same
	// implementation's on distinct keys at the same client count
	// (txlimit/shards16, which runs on the hot key only, over txlimit's).
	VsDistinct float64 `json:"vs_distinct,omitempty"`
	// RoundTrips is the queries and batches sent per call, BEGIN and
	// COMMIT included (PostgreSQL only).
	RoundTrips float64 `json:"round_trips_per_op,omitempty"`
	// Fallback is the share of calls on a sharded limit whose fast path
	// gave up its shard and locked every shard instead.
	Fallback float64   `json:"fallback_share"`
	Runs     []float64 `json:"runs_ops_per_sec"`
	// Profile is, with -profile, the mean time per call spent in each kind
	// of statement (µs, as the client sees it: round trip and lock waits
	// included), PostgreSQL only.
	Profile map[string]float64 `json:"profile_us_per_op,omitempty"`
}

// Target is one of the goals, evaluated.
type Target struct {
	Name string  `json:"name"`
	Want float64 `json:"want_ratio"`
	Got  float64 `json:"got_ratio"`
	Met  bool    `json:"met"`
	// AtMost marks a target met at or below Want (a latency ratio);
	// the others are met at or above it.
	AtMost bool `json:"at_most,omitempty"`
	// FloorGot is, where the target compares with distinct keys, the same
	// ratio for the hand-written floor of the same run: what plain SQL
	// reaches on that machine.
	FloorGot float64 `json:"floor_got_ratio,omitempty"`
}

// Report is everything one run of the command measured.
type Report struct {
	Generated time.Time `json:"generated"`
	Command   string    `json:"command"`
	Go        string    `json:"go"`
	Platform  string    `json:"platform"`
	CPUs      int       `json:"cpus"`
	Postgres  string    `json:"postgres"`
	SQLite    string    `json:"sqlite,omitempty"`
	MySQL     string    `json:"mysql,omitempty"`
	Redis     string    `json:"redis,omitempty"`
	Duration  string    `json:"duration_per_run"`
	Repeats   int       `json:"repeats"`
	LoadStart string    `json:"loadavg_start,omitempty"`
	LoadEnd   string    `json:"loadavg_end,omitempty"`
	Rows      []Row     `json:"rows"`
	Targets   []Target  `json:"targets"`
	Checks    []check   `json:"checks"`

	schema    string // the PostgreSQL schema the run used (and dropped)
	redisKeys string // matches the Redis keys the run wrote (and deleted)
}

func (r *Report) checksOK() bool {
	for _, c := range r.Checks {
		if !c.OK {
			return false
		}
	}
	return true
}

func ratio(f float64) string {
	if f == 0 {
		return ""
	}
	return fmt.Sprintf("%.2fx", f)
}

func share(r Row) string {
	if r.Shards <= 1 || r.DB != "postgres" {
		return ""
	}
	return fmt.Sprintf("%.0f%%", 100*r.Fallback)
}

func roundTrips(r Row) string {
	if r.RoundTrips == 0 {
		return ""
	}
	return fmt.Sprintf("%.2f", r.RoundTrips)
}

// spread is how far apart the runs of a row were, relative to the median.
func spread(r Row) string {
	if len(r.Runs) < 2 || r.OpsPerSec == 0 {
		return ""
	}
	return fmt.Sprintf("±%.0f%%", 50*(slices.Max(r.Runs)-slices.Min(r.Runs))/r.OpsPerSec)
}

func writeTable(w io.Writer, rep *Report) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "db\tscenario\timpl\tclients\tops/s\tspread\tp50 ms\tp99 ms\tvs floor\tvs redis\tvs redis_rate\tvs none\tvs hot floor\tvs distinct\trt/op\tfallback\t")
	for _, r := range rep.Rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%.0f\t%s\t%.2f\t%.2f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n",
			r.DB, r.Scenario, r.Impl, r.Clients, r.OpsPerSec, spread(r), r.P50Ms, r.P99Ms,
			ratio(r.VsFloor), ratio(r.VsRedis), ratio(r.VsRedisRate), ratio(r.VsNone), ratio(r.VsHotFloor), ratio(r.VsDistinct), roundTrips(r), share(r))
	}
	tw.Flush()
	fmt.Fprintln(w, "\nbusiness: each client its own key, and every transaction inserts an order beside its limit step: BEGIN; INSERT; step; COMMIT.")
	fmt.Fprintln(w, "tpcb: pgbench's tpcb-like transaction (UPDATE an account, SELECT it, UPDATE a teller, UPDATE the branch, INSERT history) at scale 1,")
	fmt.Fprintln(w, "  then the step; a limit per account (each client its own account); tpcb-hot: a limit per branch, one hot key (random accounts).")
	fmt.Fprintln(w, "none: that transaction with no limit at all, the ceiling. redis: seed 003's fixed-window Lua script (EVALSHA) as the step.")
	fmt.Fprintln(w, "vs floor: this / the hand-written floor, same scenario (for hot-shards a sharded floor that does not pool) and clients.")
	fmt.Fprintln(w, "vs redis: this / the business transaction with the Redis limiter, same clients. vs redis_rate: the same with redis_rate (GCRA) beside it.")
	fmt.Fprintln(w, "vs none: this / the business transaction with no limit, same clients. txlimit/commit: Limiter.Commit, the take riding the COMMIT.")
	fmt.Fprintln(w, "txlimit/batch: pgstore.SendBatch, the take queued ahead of the INSERT in one batch (its step: the take and the INSERT);")
	fmt.Fprintln(w, "  in tpcb ahead of the account's UPDATE, the rest of the transaction after it.")
	fmt.Fprintln(w, "vs hot floor: txlimit on a sharded hot key / the floor on the same key unsharded (one row), same clients;")
	fmt.Fprintln(w, "  in business-hot (one hot key inside the business transaction): this / the floor on that one row in the same transaction.")
	fmt.Fprintln(w, "vs distinct: on the hot key / on distinct keys, same implementation, transaction and clients.")
	fmt.Fprintln(w, "txlimit/shards16: LimitTx on the hot key spread over 16 shards (Config.Shards).")
	fmt.Fprintln(w, "spread: half the range of the runs over the median. rt/op: queries + batches sent per call, BEGIN and COMMIT included.")
	fmt.Fprintln(w, "fallback: share of calls whose fast path gave its shard back and locked every shard.")
	if rep.LoadStart != "" {
		fmt.Fprintf(w, "load average: %s at the start, %s at the end (%d CPUs)\n", rep.LoadStart, rep.LoadEnd, rep.CPUs)
	}

	writeSteps(w, rep)
	writeSlots(w, rep)
	writeProfile(w, rep)

	failed := 0
	for _, c := range rep.Checks {
		if !c.OK {
			failed++
			fmt.Fprintf(w, "CHECK FAILED %s: %s\n", c.Name, c.Detail)
		}
	}
	fmt.Fprintf(w, "\nadmission checks: %d passed, %d failed\n", len(rep.Checks)-failed, failed)
	if len(rep.Targets) > 0 {
		fmt.Fprintln(w, "\ntargets:")
		for _, t := range rep.Targets {
			verdict := "met"
			if !t.Met {
				verdict = "NOT met"
			}
			fmt.Fprintf(w, "  %s: %s, %s", t.Name, ratioOrNone(t.Got), verdict)
			if t.FloorGot > 0 {
				fmt.Fprintf(w, " (the hand-written floor: %.2fx)", t.FloorGot)
			}
			fmt.Fprintln(w)
		}
	}
}

func ratioOrNone(f float64) string {
	if f == 0 {
		return "not measured"
	}
	return ratio(f)
}

// stepRows are the rows whose limit step is reported: the business
// scenarios' (BEGIN; INSERT; step; COMMIT), "none" left out.
func stepRows(rep *Report) []Row {
	var out []Row
	for _, r := range rep.Rows {
		if r.Business && r.StepP50Ms > 0 && !strings.HasPrefix(r.Scenario, "tpcb") && !slotRow(r) {
			out = append(out, r)
		}
	}
	return out
}

// writeSteps prints the latency of the limit step inside a business
// transaction, and its ratios to the floor's and to Redis's.
func writeSteps(w io.Writer, rep *Report) {
	rows := stepRows(rep)
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w, "\nlimit step inside a business transaction (BEGIN; INSERT; step; COMMIT): the time around the step alone")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "db\timpl\tclients\tstep p50 ms\tstep p99 ms\tp50 vs floor\tp50 vs redis\tp99 vs floor\tp99 vs redis\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.3f\t%.3f\t%s\t%s\t%s\t%s\t\n", r.DB, r.Impl, r.Clients, r.StepP50Ms, r.StepP99Ms,
			ratio(r.StepVsFloor), ratio(r.StepVsRedis), ratio(r.StepP99VsFloor), ratio(r.StepP99VsRedis))
	}
	tw.Flush()
	fmt.Fprintln(w, "vs floor, vs redis: this step's latency / theirs, same clients (lower is faster).")
}

// slotRow reports whether r measures a concurrency slot (slots.go).
func slotRow(r Row) bool { return r.Impl == implSlot || r.Impl == implRedisSemaphore }

// slotRows are the rows of the concurrency slots.
func slotRows(rep *Report) []Row {
	var out []Row
	for _, r := range rep.Rows {
		if slotRow(r) {
			out = append(out, r)
		}
	}
	return out
}

// slotsCaption says what the slot rows measure.
const slotsCaption = "slots: a concurrency slot around the business transaction, each client its own key (slots) or one hot key (slots-hot). " +
	"txlimit/slot: BEGIN; INSERT …; LimitTx acquires a slot of a Concurrency limit; COMMIT; then ReleaseTx in the next transaction " +
	"(BEGIN; release; COMMIT) on the same connection, once the work the slot guards is done (here at once). " +
	"redis/semaphore: the sorted-set semaphore beside the transaction, BEGIN; INSERT …; EVALSHA (ZREMRANGEBYSCORE the expired holders, " +
	"ZCARD, ZADD when below the capacity); COMMIT; ZREM. The step is the acquire and the release together."

// writeSlots prints the concurrency slots' rows and their ratios to the
// Redis semaphore.
func writeSlots(w io.Writer, rep *Report) {
	rows := slotRows(rep)
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w, "\nconcurrency slots around a business transaction")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\timpl\tclients\tops/s\tp50 ms\tstep p50 ms\tvs semaphore\tstep p50 vs semaphore\tvs distinct\trt/op\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f\t%.2f\t%.3f\t%s\t%s\t%s\t%s\t\n", r.Scenario, r.Impl, r.Clients, r.OpsPerSec, r.P50Ms, r.StepP50Ms,
			ratio(r.VsSemaphore), ratio(r.StepVsSemaphore), ratio(r.VsDistinct), roundTrips(r))
	}
	tw.Flush()
	fmt.Fprint(w, wrap(slotsCaption))
	fmt.Fprintln(w, "vs semaphore: this / the business transaction with the Redis semaphore beside it, same scenario and clients (the step: lower is faster).")
}

// writeProfile prints the -profile breakdown: where each cell's time goes,
// per call, statement by statement, slowest first.
func writeProfile(w io.Writer, rep *Report) {
	header := false
	for _, r := range rep.Rows {
		if len(r.Profile) == 0 {
			continue
		}
		if !header {
			fmt.Fprintln(w, "\nprofile: mean µs per call in each statement as the client sees it (round trip and lock waits included)")
			header = true
		}
		labels := slices.Collect(maps.Keys(r.Profile))
		slices.SortFunc(labels, func(a, b string) int { return cmp.Compare(r.Profile[b], r.Profile[a]) })
		total := 0.0
		parts := make([]string, len(labels))
		for i, l := range labels {
			total += r.Profile[l]
			parts[i] = fmt.Sprintf("%s %.0f", l, r.Profile[l])
		}
		fmt.Fprintf(w, "  %s %s %s %d clients: total %.0f = %s\n", r.DB, r.Scenario, r.Impl, r.Clients, total, strings.Join(parts, ", "))
	}
}

// write writes results.csv, results.json, results.svg and results.md into
// dir.
func (r *Report) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var c bytes.Buffer
	if err := r.csv(&c); err != nil {
		return err
	}
	j, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	files := map[string][]byte{
		"results.csv":  c.Bytes(),
		"results.json": append(j, '\n'),
		"results.svg":  []byte(r.svg()),
		"results.md":   []byte(r.markdown()),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

func (r *Report) csv(w io.Writer) error {
	cw := csv.NewWriter(w)
	f := func(v float64, prec int) string {
		if v == 0 {
			return ""
		}
		return strconv.FormatFloat(v, 'f', prec, 64)
	}
	_ = cw.Write([]string{"db", "scenario", "impl", "shards", "clients", "ops_per_sec", "p50_ms", "p99_ms",
		"vs_floor", "vs_hot_floor", "vs_distinct", "round_trips_per_op", "fallback_share",
		"vs_redis", "step_p50_ms", "step_p99_ms", "step_p50_vs_floor", "step_p50_vs_redis", "step_p99_vs_floor", "step_p99_vs_redis",
		"vs_redis_semaphore", "step_p50_vs_redis_semaphore", "runs_ops_per_sec"})
	for _, row := range r.Rows {
		runs := make([]string, len(row.Runs))
		for i, v := range row.Runs {
			runs[i] = strconv.FormatFloat(v, 'f', 0, 64)
		}
		fallback := ""
		if row.Shards > 1 && row.DB == "postgres" {
			fallback = strconv.FormatFloat(row.Fallback, 'f', 3, 64)
		}
		_ = cw.Write([]string{row.DB, row.Scenario, row.Impl, strconv.Itoa(row.Shards), strconv.Itoa(row.Clients),
			strconv.FormatFloat(row.OpsPerSec, 'f', 0, 64), f(row.P50Ms, 3), f(row.P99Ms, 3),
			f(row.VsFloor, 3), f(row.VsHotFloor, 3), f(row.VsDistinct, 3), f(row.RoundTrips, 2), fallback,
			f(row.VsRedis, 3), f(row.StepP50Ms, 3), f(row.StepP99Ms, 3), f(row.StepVsFloor, 3), f(row.StepVsRedis, 3),
			f(row.StepP99VsFloor, 3), f(row.StepP99VsRedis, 3), f(row.VsSemaphore, 3), f(row.StepVsSemaphore, 3), strings.Join(runs, ";")})
	}
	cw.Flush()
	return cw.Error()
}

// The chart: one panel per database, a group of bars per scenario and
// implementation, one bar per client count.
const (
	svgWidth    = 1200
	panelHeight = 340
	plotLeft    = 80
	plotRight   = 20
	plotTop     = 50
	plotBottom  = 70
)

var barColors = []string{"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948"}

func (r *Report) svg() string {
	var dbs []string
	for _, row := range r.Rows {
		if !slices.Contains(dbs, row.DB) {
			dbs = append(dbs, row.DB)
		}
	}
	height := panelHeight*len(dbs) + 40
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		svgWidth, height, svgWidth, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="24" font-size="16" font-weight="bold">%s</text>`+"\n", plotLeft,
		html.EscapeString(fmt.Sprintf("txlimit LimitTx vs the hand-written floor and Redis: ops/s, %s", runsOf(r.Repeats, r.Duration))))
	for i, db := range dbs {
		r.panel(&b, db, 40+i*panelHeight)
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// panel draws the bars of one database with its top edge at y0.
func (r *Report) panel(b *strings.Builder, db string, y0 int) {
	type group struct{ scenario, impl string }
	var groups []group
	var clients []int
	peak := 0.0
	values := map[group]map[int]float64{}
	for _, row := range r.Rows {
		if row.DB != db {
			continue
		}
		g := group{row.Scenario, row.Impl}
		if values[g] == nil {
			values[g] = map[int]float64{}
			groups = append(groups, g)
		}
		values[g][row.Clients] = row.OpsPerSec
		if !slices.Contains(clients, row.Clients) {
			clients = append(clients, row.Clients)
		}
		peak = max(peak, row.OpsPerSec)
	}
	// Order the groups as the table does: scenarios, then impls by name.
	order := func(g group) int {
		switch {
		case g.scenario == "distinct":
			return 0
		case g.scenario == "hot":
			return 1
		case strings.HasPrefix(g.scenario, "hot-shards"):
			n, _ := strconv.Atoi(strings.TrimPrefix(g.scenario, "hot-shards"))
			return 2 + n
		case g.scenario == "business":
			return 2 + 2*1024 // after every shard count
		case g.scenario == "business-hot":
			return 3 + 2*1024
		case g.scenario == "tpcb":
			return 4 + 2*1024
		}
		return 5 + 2*1024 // tpcb-hot
	}
	slices.SortStableFunc(groups, func(a, c group) int {
		if d := order(a) - order(c); d != 0 {
			return d
		}
		return strings.Compare(a.impl, c.impl)
	})
	slices.Sort(clients)

	plotH := panelHeight - plotTop - plotBottom
	plotW := svgWidth - plotLeft - plotRight
	base := y0 + plotTop + plotH
	top := niceCeil(peak)
	title := "PostgreSQL"
	switch db {
	case "sqlite":
		title = "SQLite (WAL file)"
	case "mysql":
		title = "MySQL/MariaDB"
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" font-size="14" font-weight="bold">%s</text>`+"\n", plotLeft, y0+plotTop-22, title)
	// Y axis, grid and ticks.
	for i := 0; i <= 5; i++ {
		v := top * float64(i) / 5
		y := base - int(math.Round(float64(plotH)*float64(i)/5))
		fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#ddd"/>`+"\n", plotLeft, y, plotLeft+plotW, y)
		fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", plotLeft-6, y+4, humanInt(v))
	}
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>`+"\n", plotLeft, base, plotLeft+plotW, base)
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>`+"\n", plotLeft, y0+plotTop, plotLeft, base)
	fmt.Fprintf(b, `<text transform="translate(%d,%d) rotate(-90)" text-anchor="middle">ops/s (higher is better)</text>`+"\n",
		18, y0+plotTop+plotH/2)
	// Bars.
	if len(groups) == 0 {
		return
	}
	groupW := float64(plotW) / float64(len(groups))
	barW := groupW * 0.8 / float64(len(clients))
	for gi, g := range groups {
		gx := float64(plotLeft) + groupW*float64(gi) + groupW*0.1
		for ci, n := range clients {
			v, ok := values[g][n]
			if !ok {
				continue
			}
			h := 0.0
			if top > 0 {
				h = float64(plotH) * v / top
			}
			x := gx + barW*float64(ci)
			fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s</title></rect>`+"\n",
				x, float64(base)-h, barW-1, h, barColors[ci%len(barColors)],
				html.EscapeString(fmt.Sprintf("%s %s %s, %d clients: %.0f ops/s", db, g.scenario, g.impl, n, v)))
			fmt.Fprintf(b, `<text x="%.1f" y="%.1f" font-size="9" text-anchor="middle">%s</text>`+"\n",
				x+barW/2, float64(base)-h-3, humanInt(v))
		}
		cx := gx + groupW*0.4
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", cx, base+16, html.EscapeString(g.scenario))
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle" fill="#555">%s</text>`+"\n", cx, base+30, html.EscapeString(g.impl))
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle">scenario / implementation</text>`+"\n", plotLeft+plotW/2, base+50)
	// Legend.
	lx := plotLeft + plotW - 110*len(clients)
	for ci, n := range clients {
		x := lx + ci*110
		fmt.Fprintf(b, `<rect x="%d" y="%d" width="12" height="12" fill="%s"/>`+"\n", x, y0+plotTop-34, barColors[ci%len(barColors)])
		label := fmt.Sprintf("%d clients", n)
		if n == 1 {
			label = "1 client"
		}
		fmt.Fprintf(b, `<text x="%d" y="%d">%s</text>`+"\n", x+16, y0+plotTop-24, label)
	}
}

func runsOf(repeats int, d string) string {
	if repeats == 1 {
		return "one run of " + d
	}
	return fmt.Sprintf("median of %d runs of %s", repeats, d)
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten, for the axis.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func humanInt(v float64) string {
	switch {
	case v >= 10000:
		return fmt.Sprintf("%.0fk", v/1000)
	case v >= 1000:
		return fmt.Sprintf("%.1fk", v/1000)
	}
	return fmt.Sprintf("%.0f", v)
}
