package driver

import (
	"cmp"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/txlimit/txlimit/algo"
)

// States returns the state of each of l's Shards shards at now from the rows
// the store found for l's key (every row it has, in any order), and whether
// they had to be resharded.
//
// A missing row is full. Rows are created as the complete set 0..m-1 and
// deleted a whole key at a time, so rows up to shard m-1 mean that they were
// written under a config with m shards. When m differs from l.Shards (the
// limit was redeployed with another Shards), the m rows are pooled under the
// m-shard config and spread over the new shards (algo.Reshard): the limit
// holds the same tokens, and the same debt, as before.
func (l Limit) States(rows []Row, now int64) (states []algo.State, resharded bool) {
	m := 0
	for _, r := range rows {
		m = max(m, int(r.Shard)+1)
	}
	n := l.Shards
	if m == 0 || m == n {
		return l.statesOf(rows, n), false
	}
	return algo.Reshard(l.Shard(m), l.statesOf(rows, m), l.Shard(n), n, now), true
}

// statesOf returns m states from rows written under an m-shard config, a
// full state for each row that is missing.
func (l Limit) statesOf(rows []Row, m int) []algo.State {
	full := algo.Full(l.Shard(m), l.Origin)
	states := make([]algo.State, m)
	for i := range states {
		states[i] = full
	}
	for _, r := range rows {
		if int(r.Shard) < m {
			states[r.Shard] = r.State()
		}
	}
	return states
}

// Rows returns the rows that store states, one per shard.
func (l Limit) Rows(states []algo.State) []Row {
	rows := make([]Row, len(states))
	for i, s := range states {
		rows[i] = Row{Shard: int32(i), Value: s.Value, Prev: s.Prev, TS: time.UnixMicro(s.TS)}
	}
	return rows
}

// take is algo's decision for p on the states of its shards at now:
// TakeUpTo with UpTo (taken is what it took), TakeShards otherwise (taken
// is the count, or 0 for a denial).
func (p TakeParams) take(states []algo.State, now int64) (next []algo.State, d algo.Decision, taken float64) {
	c := p.Shard(p.Shards)
	if p.UpTo {
		return algo.TakeUpTo(c, states, now, p.Count)
	}
	next, d = algo.TakeShards(c, states, now, p.Count, p.Reserve)
	if d.OK {
		taken = p.Count
	}
	return next, d, taken
}

// Decide is the decision of Take on every row of the limit, which the store
// holds: the states after the call, the decision, and whether the store must
// write the states (a grant, or rows that were resharded: a reshard keeps the
// total, so writing it on a denial changes no decision). Rows of shards at
// or beyond p.Shards that the store holds must then be deleted.
func Decide(p TakeParams, rows []Row, now time.Time) (TakeResult, bool) {
	at := now.UnixMicro()
	states, resharded := p.States(rows, at)
	next, d, taken := p.take(states, at)
	if !d.OK {
		next = states
	}
	return TakeResult{Decision: d, At: now, States: next, Taken: taken}, d.OK || resharded
}

// Check is the decision of Take on the rows a store read without locking
// them, which takes nothing: what Check reports, and what TakeAll reports
// for a limit it did not take once another denied.
func Check(p TakeParams, read ReadResult) TakeResult {
	at := read.At.UnixMicro()
	states, _ := p.States(read.Rows, at)
	_, d, taken := p.take(states, at)
	return TakeResult{Decision: d, At: read.At, States: states, Taken: taken}
}

// DecideOne is the decision of Take on one shard of a sharded limit, the
// only row the store holds: it grants only when that shard alone has the
// tokens, never as a reservation (a store falls back to Decide on every row
// when it denies).
func DecideOne(p TakeParams, row Row, now time.Time) (algo.State, algo.Decision) {
	return algo.Take(p.Shard(p.Shards), row.State(), now.UnixMicro(), p.Count, false)
}

// FitsOneShard reports whether a call may be served from one shard: a
// sharded limit, a count within one shard's capacity, not up to a count
// (which takes what every shard pools).
func FitsOneShard(p TakeParams) bool {
	return p.Shards > 1 && !p.UpTo && p.Count <= p.Shard(p.Shards).Capacity
}

// DecideAll is the decision of TakeAll: rows[i] are every row of
// p.Takes[i]'s key, all held by the store. It returns each limit's result
// (with the states to store when the call is OK), whether the call is OK, and
// the rows to write per limit (nil for a limit that keeps its rows). The
// takes up to a count (UpTo) all take the same amount, the least any of them
// could take alone: every unit of the caller's work needs a token of each
// limit, so taking more of one would only waste it.
func DecideAll(p TakeAllParams, rows [][]Row, now time.Time) (TakeAllResult, [][]Row) {
	out := TakeAllResult{OK: true, Results: make([]TakeResult, len(p.Takes)), At: now}
	nexts := make([][]algo.State, len(p.Takes))
	current := make([][]algo.State, len(p.Takes))
	resharded := make([]bool, len(p.Takes))
	at := now.UnixMicro()
	least := math.Inf(1)
	for i, t := range p.Takes {
		current[i], resharded[i] = t.States(rows[i], at)
		var d algo.Decision
		var taken float64
		nexts[i], d, taken = t.take(current[i], at)
		out.Results[i] = TakeResult{Decision: d, At: now, Taken: taken}
		out.OK = out.OK && d.OK
		if t.UpTo {
			least = min(least, taken)
		}
	}
	for i, t := range p.Takes {
		if out.OK && t.UpTo && out.Results[i].Taken > least {
			// least fits: it is no more than this limit took alone.
			var d algo.Decision
			nexts[i], d = algo.TakeShards(t.Shard(t.Shards), current[i], at, least, false)
			out.Results[i].Decision, out.Results[i].Taken = d, least
		}
	}
	writes := make([][]Row, len(p.Takes))
	for i, t := range p.Takes {
		switch {
		case out.OK:
			out.Results[i].States = nexts[i]
			writes[i] = t.Rows(nexts[i])
		default:
			out.Results[i].States = current[i]
			out.Results[i].Taken = 0
			if resharded[i] {
				writes[i] = t.Rows(current[i])
			}
		}
	}
	return out, writes
}

// CanonicalOrder returns the indexes of takes sorted by name, then key,
// compared byte by byte: the order in which TakeAll locks.
func CanonicalOrder(takes []TakeParams) []int {
	order := make([]int, len(takes))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		return cmp.Or(strings.Compare(takes[a].Name, takes[b].Name), strings.Compare(takes[a].Key, takes[b].Key))
	})
	return order
}

// CreditStates is the state of a limit after Credit, from every row of it.
func CreditStates(p CreditParams, rows []Row, now time.Time) []algo.State {
	at := now.UnixMicro()
	states, _ := p.States(rows, at)
	return algo.CreditShards(p.Shard(p.Shards), states, at, p.Count)
}

// Extra returns the shards of rows at or beyond n: rows a reshard to fewer
// shards leaves over, which the store deletes when it writes.
func Extra(rows []Row, n int) []int32 {
	var out []int32
	for _, r := range rows {
		if int(r.Shard) >= n {
			out = append(out, r.Shard)
		}
	}
	return out
}

// InSQL reports whether a store may take p from one row in one statement
// that refills, decides and writes in SQL (see "One statement" in the
// stores), that is whether the statement's arithmetic is exactly algo's for
// p. A period above 2^53 µs (285 years) does not survive PostgreSQL's
// interval arithmetic exactly, and magnitudes near float64's range overflow
// there into an error where algo rounds to ±Inf: such limits take the
// store's Go path.
func InSQL(p TakeParams) bool {
	const maxPeriod, maxMagnitude = 1 << 53, 1e200
	c := p.Config
	return (c.Kind == algo.TokenBucket || c.Kind == algo.FixedWindow) && c.Calendar.Unit == 0 && !p.UpTo &&
		c.Period <= maxPeriod && c.Rate <= maxMagnitude && c.Capacity <= maxMagnitude &&
		c.MaxReserved <= maxMagnitude && p.Count <= maxMagnitude
}

// Granted is the decision of a grant that left next, the new state of the
// row a store took from in SQL (InSQL), at now: algo.Take's when it grants,
// which reports the wait of a reservation (a value below zero) only.
func Granted(c algo.Config, next algo.State, now int64) algo.Decision {
	if algo.Pooled(c, []algo.State{next}, now) < 0 {
		return algo.Decision{OK: true, RetryAfter: algo.RetryAfter(c, next, now)}
	}
	return algo.Decision{OK: true}
}

// GrantsWhenFull reports whether p grants on a key with no row, whose every
// shard is full: the most a key can hold, so a p that does not grant then
// grants on no state of the key.
func GrantsWhenFull(p TakeParams) bool {
	states, _ := p.States(nil, 0)
	_, d, _ := p.take(states, p.Full().TS)
	return d.OK
}

// Fresh is what p leaves of a missing row, which is full (Limit.Full), and
// whether it grants: a one-statement take (InSQL) writes it when the key has
// no row. Neither depends on the clock (a full row refills to nothing more),
// only the row's time does, which the statement sets from the clock.
func Fresh(p TakeParams) (algo.State, bool) {
	full := p.Full()
	next, d, _ := p.take([]algo.State{full}, full.TS)
	return next[0], d.OK
}

// Known reports whether p judges the keys of the limit name.
func (p PruneParams) Known(name string) bool {
	_, ok := p.Limits[name]
	return ok
}

// Full reports whether rows, every row (name, key) has, are at now the same
// as no row under name's config (false for a name p does not know): every
// shard (resharded, as every call reads them) projects to what a missing
// shard (Limit.Full) projects to. Once equal, the two stay equal, since a
// full state's projection depends only on the window origin; a row whose
// time lies after now (a clock that stepped back) is not equal, and is kept.
func (p PruneParams) Full(name, key string, rows []Row, now time.Time) bool {
	c, ok := p.Limits[name]
	if !ok {
		return false
	}
	l := c.Limit(name, key)
	at := now.UnixMicro()
	shard := l.Shard(l.Shards)
	empty := algo.Project(shard, l.Full(), at)
	states, _ := l.States(rows, at)
	for _, s := range states {
		if algo.Project(shard, s, at) != empty {
			return false
		}
	}
	return true
}
