package engine

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/internal/driver"
)

// fake is a Dialect on rows in memory, in one transaction, that records the
// operations the engine runs. Its kind picks the capabilities: "pg" (a
// SkipLocker and Releaser that creates rows only to write them), "innodb" (a
// SkipLocker and FreeLocker that creates placeholders before it locks) or
// "sqlite" (neither: a lock that covers missing rows).
type fake struct {
	kind  string
	now   time.Time
	rows  map[driver.KeyRef]map[int32]algo.State
	busy  map[driver.KeyRef][]int32 // held by another transaction
	trace []string
	// afterRead runs after each Read: a commit of another transaction.
	afterRead func()
}

// skipper, pgFake and innodbFake add the SkipLocker, Releaser and
// FreeLocker methods to a fake.
type skipper struct{ *fake }
type pgFake struct{ skipper }
type innodbFake struct{ skipper }

func (f pgFake) LetGo(context.Context, *fake) error { f.op("LetGo"); return nil }

func (f innodbFake) TryShards(_ context.Context, _ *fake, p driver.TakeParams, shards []int32) ([]driver.Row, error) {
	f.op("TryShards")
	var out []driver.Row
	for _, sh := range shards {
		if s, ok := f.rows[ref(p.Limit)][sh]; ok && !f.held(ref(p.Limit), sh) {
			out = append(out, row(sh, s))
		}
	}
	return out, nil
}

func newFake(kind string) (*fake, Dialect[*fake]) {
	f := &fake{kind: kind, now: time.UnixMicro(1_700_000_000_000_000),
		rows: map[driver.KeyRef]map[int32]algo.State{}, busy: map[driver.KeyRef][]int32{}}
	switch kind {
	case "pg":
		return f, pgFake{skipper{f}}
	case "innodb":
		return f, innodbFake{skipper{f}}
	}
	return f, f
}

func ref(l driver.Limit) driver.KeyRef { return driver.KeyRef{Name: l.Name, Key: l.Key} }

func (f *fake) op(name string)                         { f.trace = append(f.trace, name) }
func (f *fake) held(k driver.KeyRef, shard int32) bool { return slices.Contains(f.busy[k], shard) }

func (f *fake) sorted(k driver.KeyRef) []driver.Row {
	var out []driver.Row
	for _, sh := range slices.Sorted(maps.Keys(f.rows[k])) {
		out = append(out, row(sh, f.rows[k][sh]))
	}
	return out
}

func (f *fake) set(k driver.KeyRef, shard int32, s algo.State) {
	if f.rows[k] == nil {
		f.rows[k] = map[int32]algo.State{}
	}
	f.rows[k][shard] = s
}

func (f *fake) TakeRow(_ context.Context, _ *fake, p driver.TakeParams) (driver.TakeResult, bool, error) {
	f.op("TakeRow")
	s, ok := f.rows[ref(p.Limit)][0]
	if !ok {
		s = p.Full()
	}
	next, d := algo.Take(p.Config, s, f.now.UnixMicro(), p.Count, p.Reserve)
	if !d.OK || len(f.rows[ref(p.Limit)]) > 1 {
		return driver.TakeResult{}, false, nil
	}
	f.set(ref(p.Limit), 0, next)
	return Granted(p, next, f.now), true, nil
}

func (f *fake) Read(_ context.Context, _ *fake, p driver.ReadParams) (driver.ReadResult, error) {
	f.op("Read")
	out := driver.ReadResult{Rows: f.sorted(driver.KeyRef{Name: p.Name, Key: p.Key}), At: f.now}
	if f.afterRead != nil {
		f.afterRead()
	}
	return out, nil
}

// lock locks l's rows as the fake's kind does: with placeholders, the
// missing rows are created first (InnoDB, and PostgreSQL's LockKeys).
func (f *fake) lock(l driver.Limit, create, placeholders bool) Locked {
	k := ref(l)
	out := Locked{Had: f.sorted(k), At: f.now}
	switch {
	case f.kind == "sqlite":
	case placeholders:
		for sh := range int32(l.Shards) {
			if _, ok := f.rows[k][sh]; !ok {
				f.set(k, sh, l.Full())
				out.Created = append(out.Created, sh)
			}
		}
	case len(out.Had) > 0:
	case create:
		for sh := range int32(l.Shards) {
			f.set(k, sh, l.Full())
		}
		out.Had = f.sorted(k)
	default:
		return Locked{None: true}
	}
	return out
}

func (f *fake) LockKey(_ context.Context, _ *fake, l driver.Limit, _ *time.Time, create bool) (Locked, error) {
	f.op("LockKey")
	return f.lock(l, create, f.kind == "innodb"), nil
}

func (f *fake) LockKeys(_ context.Context, _ *fake, ls []driver.Limit, _ *time.Time) ([]Locked, time.Time, error) {
	f.op("LockKeys " + names(ls))
	out := make([]Locked, len(ls))
	for i, l := range ls {
		out[i] = f.lock(l, true, true)
	}
	return out, f.now, nil
}

func names(ls []driver.Limit) string {
	var out []string
	for _, l := range ls {
		out = append(out, l.Name+"/"+l.Key)
	}
	return strings.Join(out, ",")
}

func (f *fake) Write(_ context.Context, _ *fake, writes []KeyWrite, deletes []RowRef) (int64, error) {
	f.op("Write")
	for _, w := range writes {
		for i, s := range w.States {
			f.set(ref(w.Limit), int32(i), s)
		}
	}
	for _, r := range deletes {
		delete(f.rows[r.KeyRef], r.Shard)
		if len(f.rows[r.KeyRef]) == 0 {
			delete(f.rows, r.KeyRef)
		}
	}
	return int64(len(deletes)), nil
}

func (f *fake) ScanKeys(_ context.Context, _ *fake, after driver.KeyRef, max int) ([]Key, error) {
	f.op("ScanKeys")
	var out []Key
	for _, k := range slices.SortedFunc(maps.Keys(f.rows), func(a, b driver.KeyRef) int {
		return strings.Compare(a.Name+"\x00"+a.Key, b.Name+"\x00"+b.Key)
	}) {
		if k.Name+"\x00"+k.Key > after.Name+"\x00"+after.Key && len(out) < max {
			out = append(out, Key{KeyRef: k})
		}
	}
	return out, nil
}

func (f *fake) LockIdle(_ context.Context, _ *fake, keys []Key, _ *time.Time) ([]Held, time.Time, error) {
	f.op("LockIdle")
	var out []Held
	for _, k := range keys {
		h := Held{KeyRef: k.KeyRef, Whole: true}
		for _, r := range f.sorted(k.KeyRef) {
			if f.held(k.KeyRef, r.Shard) {
				h.Whole = false
			} else {
				h.Rows = append(h.Rows, r)
			}
		}
		out = append(out, h)
	}
	return out, f.now, nil
}

func (f skipper) TryShard(_ context.Context, _ *fake, p driver.TakeParams, order []int32) (Tried, error) {
	f.op("TryShard")
	k := ref(p.Limit)
	t := Tried{Top: -1, Now: f.now, All: f.sorted(k)}
	for sh := range f.rows[k] {
		t.Top = max(t.Top, sh)
	}
	for _, sh := range order {
		if s, ok := f.rows[k][sh]; ok && !f.held(k, sh) {
			t.Row, t.Locked = row(sh, s), true
			break
		}
	}
	return t, nil
}

func (f skipper) KeepShards(_ context.Context, _ *fake, l driver.Limit, rows []driver.Row) error {
	f.op("KeepShards")
	for _, r := range rows {
		f.set(ref(l), r.Shard, r.State())
	}
	return nil
}

var bucket = algo.Config{Kind: algo.TokenBucket, Rate: 8, Period: 3_600_000_000, Capacity: 8}

func limit(name string, shards int) driver.Limit {
	return driver.Limit{Name: name, Key: "k", Config: bucket, Shards: shards}
}

// seed stores value in every shard of l, written at the clock.
func (f *fake) seed(l driver.Limit, values ...float64) {
	for sh, v := range values {
		f.set(ref(l), int32(sh), algo.State{Value: v, TS: f.now.UnixMicro()})
	}
}

// Each kind of dialect takes the path its capabilities allow, in the order
// of operations the stores depend on, and decides what driver.Decide decides
// on every row.
func TestTakePaths(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		kind   string
		shards int
		values []float64 // the rows before the call, none when nil
		count  float64
		trace  string
		ok     bool
	}{
		{"pg", 1, nil, 1, "TakeRow", true},
		{"pg", 1, []float64{0.5}, 1, "TakeRow LockKey", false},
		{"pg", 4, []float64{2, 2, 2, 2}, 1, "TryShard KeepShards", true},
		// A shard short, the others enough: let it go, read, lock all.
		{"pg", 4, []float64{0.5, 0.5, 0.5, 0.5}, 1, "TryShard LetGo Read LockKey Write", true},
		// Short everywhere: the committed rows deny without locks.
		{"pg", 4, []float64{0.2, 0.2, 0.2, 0.2}, 1, "TryShard LetGo Read", false},
		// A new key: no row to try; the locked path creates them.
		{"pg", 4, nil, 1, "TryShard LetGo Read LockKey Write", true},
		{"innodb", 1, nil, 1, "TakeRow", true},
		// Read first; a shard with twice the count is tried.
		{"innodb", 4, []float64{2, 2, 2, 2}, 1, "Read TryShard KeepShards", true},
		// No shard has twice the count: none is tried.
		{"innodb", 4, []float64{1, 1, 1, 1}, 1, "Read LockKey Write", true},
		{"innodb", 4, []float64{0.2, 0.2, 0.2, 0.2}, 1, "Read", false},
		// A new key: placeholders, created and written.
		{"innodb", 4, nil, 1, "Read LockKey Write", true},
		// More than one shard holds: no shard is tried; PostgreSQL reads
		// the committed rows first, InnoDB locks at once.
		{"pg", 4, []float64{2, 2, 2, 2}, 3, "Read LockKey Write", true},
		{"innodb", 4, []float64{2, 2, 2, 2}, 3, "LockKey Write", true},
		// Rows of another Shards: InnoDB's read decides nothing, and the
		// locked path reshards them (a denial writes them spread).
		{"innodb", 4, []float64{0.1, 0.1}, 1, "Read LockKey Write", false},
		{"sqlite", 1, nil, 1, "TakeRow", true},
		{"sqlite", 1, []float64{0.5}, 1, "TakeRow LockKey", false},
		{"sqlite", 4, []float64{2, 2, 2, 2}, 1, "LockKey Write", true},
	} {
		f, d := newFake(tc.kind)
		l := limit("n", tc.shards)
		f.seed(l, tc.values...)
		before := f.sorted(ref(l))
		p := driver.TakeParams{Limit: l, Count: tc.count, Now: &f.now}
		want, _ := driver.Decide(p, before, f.now)
		res, err := Take(ctx, d, f, p)
		require.NoError(t, err)
		require.Equal(t, tc.trace, strings.Join(f.trace, " "), "%+v", tc)
		require.Equal(t, tc.ok, res.Decision.OK, "%+v", tc)
		require.Equal(t, want.Decision.OK, res.Decision.OK, "%+v", tc)
		if !tc.ok && len(tc.values) == tc.shards {
			require.Equal(t, before, f.sorted(ref(l)), "%+v: a denial writes nothing", tc)
		}
	}
}

// A reservation on a sharded limit: PostgreSQL tries a shard (never as a
// reservation) and then locks every shard, with no read before; InnoDB,
// which cannot let a shard go, locks every shard at once.
func TestTakeShardedReserve(t *testing.T) {
	for kind, trace := range map[string]string{
		"pg":     "TryShard LetGo LockKey Write",
		"innodb": "LockKey Write",
	} {
		f, d := newFake(kind)
		l := limit("n", 2)
		l.Config.MaxReserved = 8
		f.seed(l, 0.25, 0.25)
		res, err := Take(context.Background(), d, f, driver.TakeParams{Limit: l, Count: 1, Reserve: true, Now: &f.now})
		require.NoError(t, err)
		require.True(t, res.Decision.OK, kind)
		require.Positive(t, res.Decision.RetryAfter, kind)
		require.Equal(t, trace, strings.Join(f.trace, " "), kind)
	}
}

// Without a Releaser, a shard found short after the read (another
// transaction took its tokens since) is kept, and the call decides on the
// shards it can lock without waiting: every free one.
func TestTakeFromFree(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		busy    []int32
		ok      bool
		partial bool
	}{
		{"every shard free: the whole limit", nil, true, false},
		{"two free shards hold enough", []int32{3}, true, true},
		{"the free shards fall short", []int32{2, 3}, false, false},
	} {
		f, d := newFake("innodb")
		l := limit("n", 4)
		f.seed(l, 2, 0.5, 0.5, 0.5)
		f.afterRead = func() { f.set(ref(l), 0, algo.State{Value: 0.25, TS: f.now.UnixMicro()}) }
		f.busy[ref(l)] = tc.busy
		// Shard 0 is the only one the read gives twice the count.
		p := driver.TakeParams{Limit: l, Count: 1, Now: &f.now}
		res, err := Take(ctx, d, f, p)
		require.NoError(t, err, tc.name)
		require.Equal(t, tc.ok, res.Decision.OK, tc.name)
		require.Equal(t, tc.partial, res.Partial, tc.name)
		want := "Read TryShard TryShards"
		if tc.ok {
			want += " KeepShards"
			total := 0.0
			for _, r := range f.sorted(ref(l)) {
				total += r.Value
			}
			require.InDelta(t, 0.75, total, 1e-9, tc.name)
		} else {
			require.Positive(t, res.Decision.RetryAfter, tc.name)
			require.Len(t, res.States, 4, "%s: a denial reports every shard", tc.name)
		}
		require.Equal(t, want, strings.Join(f.trace, " "), tc.name)
	}
}

// TakeAll locks in the canonical order whatever the order of the takes, and
// a denial leaves no row the call created.
func TestTakeAllCanonicalAndForget(t *testing.T) {
	for _, kind := range []string{"pg", "innodb", "sqlite"} {
		f, d := newFake(kind)
		b, a := limit("b", 2), limit("a", 1)
		f.seed(b, 0.25, 0.25) // b denies
		res, err := TakeAll(context.Background(), d, f, driver.TakeAllParams{
			Takes: []driver.TakeParams{{Limit: b, Count: 1}, {Limit: a, Count: 1}}, Now: &f.now,
		})
		require.NoError(t, err)
		require.False(t, res.OK, kind)
		require.True(t, res.Results[1].Decision.OK, "%s: a alone would grant", kind)
		require.Equal(t, "LockKeys a/k,b/k", f.trace[0], kind)
		require.Empty(t, f.rows[ref(a)], "%s: a's created row went again", kind)
		require.Len(t, f.rows[ref(b)], 2, kind)
	}
}

// Credit gives back to the rows a key has, and creates none for a key that
// has none.
func TestCredit(t *testing.T) {
	for _, kind := range []string{"pg", "innodb", "sqlite"} {
		f, d := newFake(kind)
		l := limit("n", 2)
		require.NoError(t, Credit(context.Background(), d, f, driver.CreditParams{Limit: l, Count: 1, Now: &f.now}))
		require.Empty(t, f.rows, kind)
		f.seed(l, 1, 1)
		require.NoError(t, Credit(context.Background(), d, f, driver.CreditParams{Limit: l, Count: 2, Now: &f.now}))
		require.Equal(t, 4.0, f.rows[ref(l)][0].Value+f.rows[ref(l)][1].Value, kind)
	}
}

// Prune deletes the keys it holds whole and finds full, and leaves those
// with a row held elsewhere, those not full and those of unknown names.
func TestPrune(t *testing.T) {
	f, d := newFake("pg")
	full, used, busy, other := limit("full", 2), limit("used", 1), limit("busy", 2), limit("other", 1)
	f.seed(full, 4, 4)
	f.seed(used, 1)
	f.seed(busy, 4, 4)
	f.seed(other, 8)
	f.busy[ref(busy)] = []int32{1}
	cfg := driver.LimitConfig{Config: bucket, Shards: 2}
	res, err := Prune(context.Background(), d, f, driver.PruneParams{Max: 10, Now: &f.now, Limits: map[string]driver.LimitConfig{
		"full": cfg, "used": {Config: bucket, Shards: 1}, "busy": cfg,
	}})
	require.NoError(t, err)
	require.Equal(t, driver.PruneResult{Keys: 4, Unknown: 1, Deleted: 2, Last: ref(used)}, res)
	require.NotContains(t, f.rows, ref(full))
	require.Len(t, f.rows, 3)
}
