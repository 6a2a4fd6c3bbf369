package main

import (
	"fmt"
	"strings"
)

// markdown is the report as results.md: the run, the throughput table, the
// limit step inside a business transaction, the targets and the checks.
func (r *Report) markdown() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	cellRatio := func(f float64) string {
		if f == 0 {
			return ""
		}
		return fmt.Sprintf("%.2f×", f)
	}

	p("# txlimit-bench results\n\n")
	p("`%s`, %s; %s, %s, %d CPUs.\n\n", r.Command, r.Generated.Format("2006-01-02 15:04 MST"), r.Go, r.Platform, r.CPUs)
	p("- PostgreSQL: %s\n", r.Postgres)
	if r.Redis != "" {
		p("- %s\n", r.Redis)
	}
	if r.MySQL != "" {
		p("- MySQL: %s\n", r.MySQL)
	}
	if r.SQLite != "" {
		p("- SQLite %s (WAL file)\n", r.SQLite)
	}
	p("- every number is the %s, the runs of all cells of a client count interleaved\n", runsOf(r.Repeats, r.Duration))
	if r.LoadStart != "" {
		p("- load average %s at the start, %s at the end: the machine may be shared, and the absolute numbers move with it; quote ratios\n", r.LoadStart, r.LoadEnd)
	}

	p("\n## Throughput\n\n")
	p("Each call is one transaction that takes one token. *business*: each client its own key, and every transaction " +
		"inserts an order beside its limit step (`BEGIN; INSERT …; step; COMMIT`); *none* is that transaction with no " +
		"limit, the ceiling; *redis* is seed 003's fixed-window Lua script (`TIME`, `INCR`, `EXPIRE` in one `EVALSHA`) as the step, " +
		"*redis_rate* github.com/go-redis/redis_rate/v10 (GCRA, one `EVALSHA`); *txlimit/commit* is `Limiter.Commit`, the take " +
		"sent with the COMMIT in one pipeline (its step: the takes and the COMMIT); *txlimit/batch* is `pgstore.SendBatch`, " +
		"the take queued ahead of the INSERT in one batch (its step: the take and the INSERT). *tpcb* is pgbench's built-in " +
		"tpcb-like transaction at scale 1 on pgbench's tables (`UPDATE` an account, `SELECT` its balance, `UPDATE` a teller, " +
		"`UPDATE` the one branch, `INSERT` a history row; then the step) with a limit per account, each client its own account; " +
		"*tpcb-hot* the same with a limit per branch, one hot key, each transaction on a random account as pgbench's; there " +
		"*txlimit/batch* queues the take ahead of the account's `UPDATE`.\n\n")
	p("| db | scenario | impl | clients | ops/s | spread | p50 ms | p99 ms | vs floor | vs Redis | vs redis_rate | vs none | vs hot floor | vs distinct | round trips |\n")
	p("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, row := range r.Rows {
		p("| %s | %s | %s | %d | %.0f | %s | %.2f | %.2f | %s | %s | %s | %s | %s | %s | %s |\n",
			row.DB, row.Scenario, row.Impl, row.Clients, row.OpsPerSec, spread(row), row.P50Ms, row.P99Ms,
			cellRatio(row.VsFloor), cellRatio(row.VsRedis), cellRatio(row.VsRedisRate), cellRatio(row.VsNone),
			cellRatio(row.VsHotFloor), cellRatio(row.VsDistinct), roundTrips(row))
	}
	p("\nvs floor: ops/s over the hand-written floor's (`SELECT … FOR UPDATE; UPDATE`; for hot-shards a sharded floor that " +
		"does not pool), same scenario and clients. vs Redis: over the business transaction with the Redis limiter. " +
		"vs hot floor: a sharded hot key over the floor on one unsharded row; in business-hot (one hot key in the business " +
		"transaction), over the floor on that row in the same transaction. vs redis_rate, vs none: over the business " +
		"transaction with redis_rate beside it, and with no limit. vs distinct: a hot key over the same " +
		"implementation on distinct keys in the same transaction. Spread: half the range of the runs over the median. Round trips: statements and batches sent per call, BEGIN, COMMIT and the Redis call included.\n")

	if steps := stepRows(r); len(steps) > 0 {
		p("\n## The limit step inside a business transaction\n\n")
		p("The time around the limit step alone (LimitTx; the floor's two statements; the Redis `EVALSHA`) in " +
			"`BEGIN; INSERT …; step; COMMIT`. Lower is faster; a ratio below 1 means this step is faster than the other's.\n\n")
		p("| db | impl | clients | step p50 ms | step p99 ms | p50 vs floor | p50 vs Redis | p99 vs floor | p99 vs Redis |\n")
		p("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
		for _, row := range steps {
			p("| %s | %s | %d | %.3f | %.3f | %s | %s | %s | %s |\n", row.DB, row.Impl, row.Clients, row.StepP50Ms, row.StepP99Ms,
				cellRatio(row.StepVsFloor), cellRatio(row.StepVsRedis), cellRatio(row.StepP99VsFloor), cellRatio(row.StepP99VsRedis))
		}
	}

	if slots := slotRows(r); len(slots) > 0 {
		p("\n## Concurrency slots around a business transaction\n\n")
		p("%s Lower is faster for the step; a throughput ratio above 1 is ahead of the Redis semaphore.\n\n", slotsCaption)
		p("| scenario | impl | clients | ops/s | p50 ms | step p50 ms | vs Redis semaphore | step p50 vs Redis semaphore | vs distinct | round trips |\n")
		p("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
		for _, row := range slots {
			p("| %s | %s | %d | %.0f | %.2f | %.3f | %s | %s | %s | %s |\n", row.Scenario, row.Impl, row.Clients, row.OpsPerSec, row.P50Ms,
				row.StepP50Ms, cellRatio(row.VsSemaphore), cellRatio(row.StepVsSemaphore), cellRatio(row.VsDistinct), roundTrips(row))
		}
	}

	if len(r.Targets) > 0 {
		p("\n## Targets\n\n| target | got | met |\n| --- | ---: | --- |\n")
		for _, t := range r.Targets {
			met := "yes"
			if !t.Met {
				met = "**no**"
			}
			got := ratioOrNone(t.Got)
			if t.FloorGot > 0 {
				got += fmt.Sprintf(" (floor %.2fx)", t.FloorGot)
			}
			p("| %s | %s | %s |\n", t.Name, got, met)
		}
	}

	failed := 0
	for _, c := range r.Checks {
		if !c.OK {
			failed++
		}
	}
	p("\n## Admission checks\n\n%d passed, %d failed.\n", len(r.Checks)-failed, failed)
	if failed > 0 {
		p("\n")
	}
	for _, c := range r.Checks {
		if !c.OK {
			p("- **failed** %s: %s\n", c.Name, c.Detail)
		}
	}
	return b.String()
}
