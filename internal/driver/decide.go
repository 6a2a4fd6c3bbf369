package driver

import (
	"cmp"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/txlimit/txlimit/algo"
)

// States returns the state of each of l's shards at now from every row of
// l's key, and whether they had to be resharded. A missing row is full.
// Rows are created and deleted a whole key at a time, so rows up to shard
// m-1 were written under m shards; when m is not l.Shards, they are
// resharded (algo.Reshard).
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

// take is algo's decision for p on the states of its shards at now, and
// what it took.
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
// holds, and whether the store must write the states (and delete the Extra
// rows): on a grant, or when the rows were resharded.
func Decide(p TakeParams, rows []Row, now time.Time) (TakeResult, bool) {
	at := now.UnixMicro()
	states, resharded := p.States(rows, at)
	if res, paused := pausedResult(rows, states, now); paused {
		return res, resharded
	}
	next, d, taken := p.take(states, at)
	if !d.OK {
		next = states
	}
	return TakeResult{Decision: d, At: now, States: next, Taken: taken}, d.OK || resharded
}

// Check is the decision of Take on rows read without locking them, taking
// nothing.
func Check(p TakeParams, read ReadResult) TakeResult {
	at := read.At.UnixMicro()
	states, _ := p.States(read.Rows, at)
	if res, paused := pausedResult(read.Rows, states, read.At); paused {
		return res
	}
	_, d, taken := p.take(states, at)
	return TakeResult{Decision: d, At: read.At, States: states, Taken: taken}
}

// DecideAll is the decision of TakeAll on rows[i], every row of
// p.Takes[i]'s key, all held by the store, and the rows to write per limit
// (nil for one that keeps its rows). The UpTo takes all take the least any
// of them could take alone: each unit of the work needs a token of each.
func DecideAll(p TakeAllParams, rows [][]Row, now time.Time) (TakeAllResult, [][]Row) {
	out := TakeAllResult{OK: true, Results: make([]TakeResult, len(p.Takes)), At: now}
	nexts := make([][]algo.State, len(p.Takes))
	current := make([][]algo.State, len(p.Takes))
	resharded := make([]bool, len(p.Takes))
	at := now.UnixMicro()
	least := math.Inf(1)
	for i, t := range p.Takes {
		current[i], resharded[i] = t.States(rows[i], at)
		if res, paused := pausedResult(rows[i], nil, now); paused {
			// Nothing of a paused key is taken, so none of the others.
			out.Results[i], out.OK = res, false
			continue
		}
		var d algo.Decision
		var taken float64
		nexts[i], d, taken = t.take(current[i], at)
		out.Results[i] = TakeResult{Decision: d, At: now, Taken: taken}
		out.OK = out.OK && d.OK
		if t.UpTo {
			least = min(least, taken)
		}
	}
	writes := make([][]Row, len(p.Takes))
	for i, t := range p.Takes {
		r := &out.Results[i]
		if !out.OK {
			r.States, r.Taken = current[i], 0
			if resharded[i] {
				writes[i] = t.Rows(current[i])
			}
			continue
		}
		if t.UpTo && r.Taken > least {
			// least fits: it is no more than this limit took alone.
			nexts[i], r.Decision = algo.TakeShards(t.Shard(t.Shards), current[i], at, least, false)
			r.Taken = least
		}
		r.States = nexts[i]
		writes[i] = t.Rows(nexts[i])
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

// InSQL reports whether a store may take p from one row in one statement
// that refills, decides and writes in SQL, whose arithmetic is then exactly
// algo's. A period above 2^53 µs does not survive PostgreSQL's interval
// arithmetic exactly, and magnitudes near float64's range overflow there
// into an error where algo rounds to ±Inf.
func InSQL(p TakeParams) bool {
	const maxPeriod, maxMagnitude = 1 << 53, 1e200
	c := p.Config
	return (c.Kind == algo.TokenBucket || c.Kind == algo.FixedWindow) && c.Calendar.Unit == 0 && !p.UpTo &&
		c.Period <= maxPeriod && c.Rate <= maxMagnitude && c.Capacity <= maxMagnitude &&
		c.MaxReserved <= maxMagnitude && p.Count <= maxMagnitude
}

// Granted is algo.Take's decision for a grant in SQL (InSQL) that left
// next at now: the wait of a reservation, if it is one.
func Granted(c algo.Config, next algo.State, now int64) algo.Decision {
	if algo.Pooled(c, []algo.State{next}, now) < 0 {
		return algo.Decision{OK: true, RetryAfter: algo.RetryAfter(c, next, now)}
	}
	return algo.Decision{OK: true}
}

// Fresh is what p leaves of a missing row (Limit.Full), and whether it
// grants, for a one-statement take (InSQL) to write. Neither depends on the
// clock; the statement sets the row's time.
func Fresh(p TakeParams) (algo.State, bool) {
	full := p.Full()
	next, d, _ := p.take([]algo.State{full}, full.TS)
	return next[0], d.OK
}

// Full reports whether rows, every row (name, key) has, are at now the same
// as no row under name's config (false for a name p does not know): every
// shard, resharded, projects to what a missing one does, and will at every
// later instant. A row whose time lies after now is kept.
func (p PruneParams) Full(name, key string, rows []Row, now time.Time) bool {
	c, ok := p.Limits[name]
	if !ok {
		return false
	}
	if !LivePause(rows, now).IsZero() {
		return false // a pause is kept until it ends
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
