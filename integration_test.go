package txlimit_test

// The conformance suite: every scenario here runs against every store, on a
// real database (PostgreSQL in each pgx exec mode, and SQLite). A store is
// done when it passes it.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testdb"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/pgstore"
	"github.com/txlimit/txlimit/sqlitestore"
	_ "modernc.org/sqlite"
)

// harness adapts one store to the suite.
type harness[TTx any] struct {
	store txlimit.Store[TTx]
	// begin opens a transaction on its own connection.
	begin    func(t *testing.T) TTx
	commit   func(tx TTx) error
	rollback func(tx TTx)
	// rows returns the stored rows of (name, key) as text, in shard order,
	// exactly enough to tell whether anything was written.
	rows func(t *testing.T, name, key string) []string
	// conns is how many transactions may be open at once.
	conns int
	// skipsLocked is set for a store that serves a sharded limit from one
	// shard no other transaction holds (PostgreSQL's SKIP LOCKED).
	skipsLocked bool
}

// testClock is an injectable clock that only moves when told to.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func newClock() *testClock { return &testClock{t: t0} }

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

var limitSeq atomic.Int64

// uniqueName gives every test its own limit names in the shared table.
func uniqueName(t *testing.T, base string) string {
	return fmt.Sprintf("%s#%d/%s", t.Name(), limitSeq.Add(1), base)
}

func runConformance[TTx any](t *testing.T, h harness[TTx]) {
	ctx := context.Background()

	newLimiter := func(t *testing.T, limits map[string]txlimit.Config, clk *testClock) *txlimit.Limiter[TTx] {
		t.Helper()
		var opts *txlimit.Options
		if clk != nil {
			opts = &txlimit.Options{Clock: clk.Now}
		}
		l, err := txlimit.New(h.store, limits, opts)
		require.NoError(t, err)
		return l
	}
	// inTx runs fn in a transaction of the harness and commits it.
	inTx := func(t *testing.T, fn func(tx TTx)) {
		t.Helper()
		tx := h.begin(t)
		fn(tx)
		require.NoError(t, h.commit(tx))
	}
	limitTx := func(t *testing.T, l *txlimit.Limiter[TTx], name, key string, opts ...txlimit.Option) txlimit.Result {
		t.Helper()
		var res txlimit.Result
		inTx(t, func(tx TTx) {
			var err error
			res, err = l.LimitTx(ctx, tx, name, key, opts...)
			require.NoError(t, err)
		})
		return res
	}

	t.Run("TokenBucket", func(t *testing.T) {
		name := uniqueName(t, "tb")
		clk := newClock()
		l := newLimiter(t, map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: 10, Period: time.Minute}}, clk)
		for i := range 10 {
			res := limitTx(t, l, name, "u1")
			require.True(t, res.OK, "call %d", i)
			require.Zero(t, res.RetryAfter)
			require.WithinDuration(t, clk.Now(), res.At, 0)
		}
		res := limitTx(t, l, name, "u1")
		require.False(t, res.OK)
		require.Equal(t, 6*time.Second, res.RetryAfter)
		require.ErrorIs(t, res.Err(), txlimit.ErrRateLimited)
		var rl *txlimit.RateLimitedError
		require.ErrorAs(t, res.Err(), &rl)
		require.Equal(t, name, rl.Name)
		require.Equal(t, "u1", rl.Key)
		require.Equal(t, 6*time.Second, rl.RetryAfter)

		// Another key is another bucket.
		require.True(t, limitTx(t, l, name, "u2").OK)

		clk.Advance(6*time.Second - time.Microsecond)
		require.False(t, limitTx(t, l, name, "u1").OK)
		clk.Advance(time.Microsecond)
		require.True(t, limitTx(t, l, name, "u1").OK)
		require.False(t, limitTx(t, l, name, "u1").OK)

		// A long idle refills to Capacity and no further.
		clk.Advance(time.Hour)
		snap, err := l.Value(ctx, name, "u1")
		if errors.Is(err, txlimit.ErrNoPool) {
			inTx(t, func(tx TTx) { snap, err = l.ValueTx(ctx, tx, name, "u1") })
		}
		require.NoError(t, err)
		require.Equal(t, 10.0, snap.Value)
		require.WithinDuration(t, clk.Now(), snap.At, 0)
		require.True(t, limitTx(t, l, name, "u1", txlimit.Count(10)).OK)
		require.False(t, limitTx(t, l, name, "u1", txlimit.Count(0.5)).OK)
	})

	t.Run("FixedWindow", func(t *testing.T) {
		name := uniqueName(t, "fw")
		clk := newClock()
		start := t0.Add(-30 * time.Minute) // windows start at :30
		l := newLimiter(t, map[string]txlimit.Config{name: {
			Kind: txlimit.FixedWindow, Rate: 100, Period: time.Hour, Capacity: 150, Start: start,
		}}, clk)
		// A new key starts full: 150.
		require.True(t, limitTx(t, l, name, "k", txlimit.Count(80)).OK) // 70 left
		res := limitTx(t, l, name, "k", txlimit.Count(71))
		require.False(t, res.OK)
		require.Equal(t, 30*time.Minute, res.RetryAfter, "the next window starts at 12:30")
		// Mid-window nothing is added.
		clk.Advance(29 * time.Minute)
		require.False(t, limitTx(t, l, name, "k", txlimit.Count(71)).OK)
		// The next window adds Rate, capped at Capacity: 70+100 → 150.
		clk.Advance(time.Minute)
		require.True(t, limitTx(t, l, name, "k", txlimit.Count(150)).OK)
		res = limitTx(t, l, name, "k", txlimit.Count(150))
		require.False(t, res.OK)
		require.Equal(t, 2*time.Hour, res.RetryAfter, "two windows of 100 are needed for 150")
	})

	t.Run("FixedWindowPhaseIsStablePerKey", func(t *testing.T) {
		name := uniqueName(t, "phase")
		clk := newClock()
		cfg := txlimit.Config{Kind: txlimit.FixedWindow, Rate: 1, Period: time.Hour}
		l := newLimiter(t, map[string]txlimit.Config{name: cfg}, clk)
		retries := map[time.Duration]bool{}
		for _, key := range []string{"a", "b", "c", "d"} {
			// Before anything is written, Check and Limit agree on the
			// window: both report the same time to the next window.
			var chk txlimit.Result
			inTx(t, func(tx TTx) {
				var err error
				chk, err = l.CheckTx(ctx, tx, name, key, txlimit.Count(1))
				require.NoError(t, err)
			})
			require.True(t, chk.OK)
			require.True(t, limitTx(t, l, name, key).OK)
			inTx(t, func(tx TTx) {
				var err error
				chk, err = l.CheckTx(ctx, tx, name, key)
				require.NoError(t, err)
			})
			res := limitTx(t, l, name, key)
			require.False(t, res.OK)
			require.Equal(t, chk.RetryAfter, res.RetryAfter)
			require.Positive(t, res.RetryAfter)
			require.LessOrEqual(t, res.RetryAfter, time.Hour)
			retries[res.RetryAfter] = true
			// Resetting and starting again lands on the same phase.
			inTx(t, func(tx TTx) { require.NoError(t, l.ResetTx(ctx, tx, name, key)) })
			require.True(t, limitTx(t, l, name, key).OK)
			again := limitTx(t, l, name, key)
			require.Equal(t, res.RetryAfter, again.RetryAfter)
		}
		require.Greater(t, len(retries), 1, "keys should get different phases")
	})

	t.Run("DeniedCallWritesNothing", func(t *testing.T) {
		name := uniqueName(t, "deny")
		clk := newClock()
		for _, shards := range []int{1, 4} {
			l := newLimiter(t, map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: 4, Period: time.Hour, Shards: shards}}, clk)
			key := fmt.Sprint("shards", shards)
			require.True(t, limitTx(t, l, name, key, txlimit.Count(3)).OK)
			before := h.rows(t, name, key)
			require.Len(t, before, shards)
			clk.Advance(time.Second)
			res := limitTx(t, l, name, key, txlimit.Count(2))
			require.False(t, res.OK)
			require.Equal(t, before, h.rows(t, name, key))
		}
	})

	t.Run("RollbackRestoresState", func(t *testing.T) {
		name := uniqueName(t, "rollback")
		clk := newClock()
		for _, shards := range []int{1, 4} {
			l := newLimiter(t, map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: 4, Period: time.Hour, Shards: shards}}, clk)
			key := fmt.Sprint("shards", shards)
			// A rollback of the first call leaves no row at all.
			tx := h.begin(t)
			res, err := l.LimitTx(ctx, tx, name, key, txlimit.Count(4))
			require.NoError(t, err)
			require.True(t, res.OK)
			h.rollback(tx)
			require.Empty(t, h.rows(t, name, key))

			require.True(t, limitTx(t, l, name, key, txlimit.Count(1)).OK)
			before := h.rows(t, name, key)
			clk.Advance(time.Minute)
			tx = h.begin(t)
			res, err = l.LimitTx(ctx, tx, name, key, txlimit.Count(3))
			require.NoError(t, err)
			require.True(t, res.OK)
			require.NoError(t, l.CreditTx(ctx, tx, name, key, 1))
			require.NoError(t, l.ResetTx(ctx, tx, name, key+"-other"))
			h.rollback(tx)
			require.Equal(t, before, h.rows(t, name, key))
			// The tokens came back: 3 of the 4 are there (1 was spent).
			require.True(t, limitTx(t, l, name, key, txlimit.Count(3)).OK)
		}
	})

	t.Run("Reservations", func(t *testing.T) {
		name := uniqueName(t, "reserve")
		capped := uniqueName(t, "capped")
		clk := newClock()
		l := newLimiter(t, map[string]txlimit.Config{
			name:   {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second},
			capped: {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second, MaxReserved: 2},
		}, clk)
		for i := range 4 {
			res := limitTx(t, l, name, "k", txlimit.Reserve())
			require.True(t, res.OK)
			require.NoError(t, res.Err(), "a reservation is never an error")
			require.Equal(t, time.Duration(i)*time.Second, res.RetryAfter)
			require.Equal(t, i > 0, res.Reserved())
		}
		// MaxReserved refuses the reservation that goes too deep, writing
		// nothing.
		for i := range 3 {
			res := limitTx(t, l, capped, "k", txlimit.Reserve())
			require.True(t, res.OK)
			require.Equal(t, time.Duration(i)*time.Second, res.RetryAfter)
		}
		before := h.rows(t, capped, "k")
		res := limitTx(t, l, capped, "k", txlimit.Reserve())
		require.False(t, res.OK)
		require.Equal(t, time.Second, res.RetryAfter, "in 1s the debt is 1 and one more fits under MaxReserved")
		require.Equal(t, before, h.rows(t, capped, "k"))
		// A rolled-back reservation frees its tokens.
		tx := h.begin(t)
		res, err := l.LimitTx(ctx, tx, name, "rb", txlimit.Count(5), txlimit.Reserve())
		require.NoError(t, err)
		require.Equal(t, 4*time.Second, res.RetryAfter)
		h.rollback(tx)
		res = limitTx(t, l, name, "rb")
		require.True(t, res.OK)
		require.Zero(t, res.RetryAfter)
	})

	t.Run("CreditIsCappedAtCapacity", func(t *testing.T) {
		name := uniqueName(t, "credit")
		clk := newClock()
		for _, shards := range []int{1, 4} {
			l := newLimiter(t, map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: 8, Period: time.Hour, Shards: shards}}, clk)
			key := fmt.Sprint("shards", shards)
			require.True(t, limitTx(t, l, name, key, txlimit.Count(8)).OK)
			inTx(t, func(tx TTx) { require.NoError(t, l.CreditTx(ctx, tx, name, key, 3)) })
			var snap txlimit.Snapshot
			inTx(t, func(tx TTx) {
				var err error
				snap, err = l.ValueTx(ctx, tx, name, key)
				require.NoError(t, err)
			})
			require.InDelta(t, 3.0, snap.Value, 1e-9)
			inTx(t, func(tx TTx) { require.NoError(t, l.CreditTx(ctx, tx, name, key, 100)) })
			inTx(t, func(tx TTx) {
				var err error
				snap, err = l.ValueTx(ctx, tx, name, key)
				require.NoError(t, err)
			})
			require.InDelta(t, 8.0, snap.Value, 1e-9)
			// Exactly 8, not 11: taking 8.25 leaves a debt of 0.25, which
			// refills in 0.25/(8/h) = 112.5s.
			res := limitTx(t, l, name, key, txlimit.Count(8.25), txlimit.Reserve())
			require.True(t, res.Reserved())
			require.Equal(t, 112500*time.Millisecond, res.RetryAfter)
		}
	})

	t.Run("ValueIsSummedOverShards", func(t *testing.T) {
		name := uniqueName(t, "value")
		clk := newClock()
		cfg := txlimit.Config{Kind: txlimit.TokenBucket, Rate: 60, Period: time.Minute, Capacity: 64, Shards: 16}
		l := newLimiter(t, map[string]txlimit.Config{name: cfg}, clk)
		var snap txlimit.Snapshot
		read := func() {
			inTx(t, func(tx TTx) {
				var err error
				snap, err = l.ValueTx(ctx, tx, name, "k")
				require.NoError(t, err)
			})
		}
		read()
		require.Equal(t, 64.0, snap.Value, "a limit never used is full")
		require.Equal(t, 16, snap.Config.Shards)
		require.WithinDuration(t, clk.Now(), snap.At, 0)
		for range 10 {
			require.True(t, limitTx(t, l, name, "k", txlimit.Count(3)).OK)
		}
		read()
		require.InDelta(t, 34.0, snap.Value, 1e-9)
		// Each shard refills on its own up to its capacity (4), so 10s adds
		// up to 10 tokens: all 10 when the shards are balanced, fewer when
		// some were full and could not take their share.
		clk.Advance(10 * time.Second)
		read()
		require.Greater(t, snap.Value, 34.0)
		require.LessOrEqual(t, snap.Value, 44.0+1e-9)
		clk.Advance(time.Hour)
		read()
		require.InDelta(t, 64.0, snap.Value, 1e-9)
	})

	t.Run("ResetDeletesAllShards", func(t *testing.T) {
		name := uniqueName(t, "reset")
		clk := newClock()
		l := newLimiter(t, map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: 4, Period: time.Hour, Shards: 4}}, clk)
		require.True(t, limitTx(t, l, name, "k", txlimit.Count(4)).OK)
		require.True(t, limitTx(t, l, name, "other", txlimit.Count(4)).OK)
		require.Len(t, h.rows(t, name, "k"), 4)
		inTx(t, func(tx TTx) { require.NoError(t, l.ResetTx(ctx, tx, name, "k")) })
		require.Empty(t, h.rows(t, name, "k"))
		require.Len(t, h.rows(t, name, "other"), 4)
		require.True(t, limitTx(t, l, name, "k", txlimit.Count(4)).OK)
	})

	t.Run("CheckWritesNothing", func(t *testing.T) {
		name := uniqueName(t, "check")
		clk := newClock()
		l := newLimiter(t, map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: 2, Period: time.Second}}, clk)
		var res txlimit.Result
		inTx(t, func(tx TTx) {
			var err error
			res, err = l.CheckTx(ctx, tx, name, "k", txlimit.Count(2))
			require.NoError(t, err)
		})
		require.True(t, res.OK)
		require.Empty(t, h.rows(t, name, "k"))
		require.True(t, limitTx(t, l, name, "k", txlimit.Count(2)).OK)
		before := h.rows(t, name, "k")
		inTx(t, func(tx TTx) {
			var err error
			res, err = l.CheckTx(ctx, tx, name, "k")
			require.NoError(t, err)
		})
		require.False(t, res.OK)
		require.Equal(t, 500*time.Millisecond, res.RetryAfter)
		require.Equal(t, before, h.rows(t, name, "k"))
	})

	t.Run("ClockSteppingBackAddsNothing", func(t *testing.T) {
		name := uniqueName(t, "backwards")
		clk := newClock()
		l := newLimiter(t, map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second, Capacity: 5}}, clk)
		require.True(t, limitTx(t, l, name, "k", txlimit.Count(5)).OK)
		clk.Advance(-time.Hour)
		res := limitTx(t, l, name, "k")
		require.False(t, res.OK)
		require.Equal(t, time.Hour+time.Second, res.RetryAfter, "refill resumes when the clock is back at the stored time")
		clk.Advance(time.Hour + 2*time.Second)
		require.True(t, limitTx(t, l, name, "k", txlimit.Count(2)).OK)
		require.False(t, limitTx(t, l, name, "k").OK, "the hour the clock went back is not credited twice")
	})

	t.Run("DatabaseClockByDefault", func(t *testing.T) {
		name := uniqueName(t, "dbclock")
		l := newLimiter(t, map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Hour}}, nil)
		res := limitTx(t, l, name, "k")
		require.True(t, res.OK)
		require.WithinDuration(t, time.Now(), res.At, time.Minute)
		res = limitTx(t, l, name, "k")
		require.False(t, res.OK)
		require.InDelta(t, float64(time.Hour), float64(res.RetryAfter), float64(time.Minute))
	})

	t.Run("BadInputIsAnErrorAndWritesNothing", func(t *testing.T) {
		name := uniqueName(t, "bad")
		cfg := txlimit.Config{Kind: txlimit.TokenBucket, Rate: 5, Period: time.Minute, MaxReserved: 5}
		l := newLimiter(t, map[string]txlimit.Config{name: cfg}, newClock())
		cases := []struct {
			desc  string
			name  string
			key   string
			field string
			opts  []txlimit.Option
		}{
			{"unknown name", "no-such-limit", "k", "name", nil},
			{"empty name", "", "k", "name", nil},
			{"NUL in key", name, "a\x00b", "key", nil},
			{"invalid UTF-8 key", name, "\xff", "key", nil},
			{"negative count", name, "k", "Count", []txlimit.Option{txlimit.Count(-1)}},
			{"NaN count", name, "k", "Count", []txlimit.Option{txlimit.Count(math.NaN())}},
			{"Inf count", name, "k", "Count", []txlimit.Option{txlimit.Count(math.Inf(1))}},
			{"count above capacity", name, "k", "Count", []txlimit.Option{txlimit.Count(6)}},
			{"count above capacity+MaxReserved", name, "k", "Count", []txlimit.Option{txlimit.Count(10.5), txlimit.Reserve()}},
			{"zero rate", name, "k", "Rate", []txlimit.Option{txlimit.WithConfig(txlimit.Config{Kind: txlimit.TokenBucket, Period: time.Second})}},
			{"NaN rate", name, "k", "Rate", []txlimit.Option{txlimit.WithConfig(txlimit.Config{Kind: txlimit.TokenBucket, Rate: math.NaN(), Period: time.Second})}},
			{"zero period", name, "k", "Period", []txlimit.Option{txlimit.WithConfig(txlimit.Config{Kind: txlimit.TokenBucket, Rate: 1})}},
			{"negative capacity", name, "k", "Capacity", []txlimit.Option{txlimit.WithConfig(txlimit.Config{Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second, Capacity: -1})}},
			{"too many shards", name, "k", "Shards", []txlimit.Option{txlimit.WithConfig(txlimit.Config{Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second, Shards: txlimit.MaxShards + 1})}},
			{"no kind", name, "k", "Kind", []txlimit.Option{txlimit.WithConfig(txlimit.Config{Rate: 1, Period: time.Second})}},
			{"start on a token bucket", name, "k", "Start", []txlimit.Option{txlimit.WithConfig(txlimit.Config{Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second, Start: t0})}},
		}
		for _, tc := range cases {
			t.Run(tc.desc, func(t *testing.T) {
				inTx(t, func(tx TTx) {
					_, err := l.LimitTx(ctx, tx, tc.name, tc.key, tc.opts...)
					require.ErrorIs(t, err, txlimit.ErrInvalid)
					var inv *txlimit.InvalidError
					require.ErrorAs(t, err, &inv)
					require.Equal(t, tc.field, inv.Field)
					require.Contains(t, err.Error(), tc.field)
					_, err = l.CheckTx(ctx, tx, tc.name, tc.key, tc.opts...)
					require.ErrorIs(t, err, txlimit.ErrInvalid)
				})
				if utf8.ValidString(tc.key) && !strings.ContainsRune(tc.key, 0) {
					require.Empty(t, h.rows(t, tc.name, tc.key))
				}
			})
		}
		_, err := l.Check(ctx, "no-such-limit", "k")
		require.ErrorIs(t, err, txlimit.ErrUnknownLimit)
		_, err = txlimit.New(h.store, map[string]txlimit.Config{"x": {Kind: txlimit.FixedWindow, Rate: 1}}, nil)
		var inv *txlimit.InvalidError
		require.ErrorAs(t, err, &inv)
		require.Equal(t, "x", inv.Limit)
		require.Equal(t, "Period", inv.Field)
	})

	t.Run("CancelledContextLeavesStateAlone", func(t *testing.T) {
		name := uniqueName(t, "cancel")
		clk := newClock()
		l := newLimiter(t, map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: 4, Period: time.Hour}}, clk)
		require.True(t, limitTx(t, l, name, "k").OK)
		before := h.rows(t, name, "k")
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		tx := h.begin(t)
		_, err := l.LimitTx(cctx, tx, name, "k")
		require.ErrorIs(t, err, context.Canceled)
		h.rollback(tx)
		require.Equal(t, before, h.rows(t, name, "k"))
	})

	t.Run("ConcurrentCallsAdmitExactly", func(t *testing.T) {
		const workers, callsEach = 32, 3
		for _, tc := range []struct {
			kind   txlimit.Kind
			shards int
		}{
			{txlimit.TokenBucket, 1}, {txlimit.FixedWindow, 1},
			{txlimit.TokenBucket, 4}, {txlimit.FixedWindow, 8},
		} {
			t.Run(fmt.Sprintf("%v/shards=%d", tc.kind, tc.shards), func(t *testing.T) {
				name := uniqueName(t, "hot")
				clk := newClock()
				const capacity = 40
				l := newLimiter(t, map[string]txlimit.Config{name: {
					Kind: tc.kind, Rate: capacity, Period: time.Hour, Shards: tc.shards,
				}}, clk)
				var admitted, denied atomic.Int64
				var wg sync.WaitGroup
				errs := make(chan error, workers*callsEach)
				sem := make(chan struct{}, h.conns)
				for range workers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range callsEach {
							func() {
								sem <- struct{}{}
								// Deferred: a failed begin ends this goroutine,
								// and its slot must not be lost with it.
								defer func() { <-sem }()
								tx := h.begin(t)
								res, err := l.LimitTx(ctx, tx, name, "hot")
								if err != nil {
									h.rollback(tx)
									errs <- err
									return
								}
								if err := h.commit(tx); err != nil {
									errs <- err
								} else if res.OK {
									admitted.Add(1)
								} else {
									denied.Add(1)
								}
							}()
						}
					}()
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					require.NoError(t, err)
				}
				require.EqualValues(t, capacity, admitted.Load())
				require.EqualValues(t, workers*callsEach-capacity, denied.Load())
				var snap txlimit.Snapshot
				inTx(t, func(tx TTx) {
					var err error
					snap, err = l.ValueTx(ctx, tx, name, "hot")
					require.NoError(t, err)
				})
				require.InDelta(t, 0, snap.Value, 1e-9)
			})
		}
	})

	t.Run("ConcurrentReservationsStackExactly", func(t *testing.T) {
		const workers = 24
		name := uniqueName(t, "stack")
		clk := newClock()
		l := newLimiter(t, map[string]txlimit.Config{name: {
			Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second, Capacity: 4, MaxReserved: 10, Shards: 2,
		}}, clk)
		var mu sync.Mutex
		var retries []time.Duration
		var wg sync.WaitGroup
		sem := make(chan struct{}, h.conns)
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sem <- struct{}{}
				defer func() { <-sem }()
				tx := h.begin(t)
				res, err := l.LimitTx(ctx, tx, name, "k", txlimit.Reserve())
				if err != nil {
					h.rollback(tx)
					t.Error(err)
					return
				}
				if err := h.commit(tx); err != nil {
					t.Error(err)
					return
				}
				if res.OK {
					mu.Lock()
					retries = append(retries, res.RetryAfter)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		// 4 granted now, then 10 reserved at 1s, 2s, … 10s, then denials.
		require.Len(t, retries, 14)
		seen := map[time.Duration]int{}
		for _, r := range retries {
			seen[r]++
		}
		require.Equal(t, 4, seen[0])
		for i := 1; i <= 10; i++ {
			require.Equal(t, 1, seen[time.Duration(i)*time.Second], "one reservation at %ds", i)
		}
	})
}

// --- PostgreSQL ---

func pgHarness(t *testing.T, pool *pgxpool.Pool, opts ...pgstore.Option) harness[pgx.Tx] {
	return harness[pgx.Tx]{
		store: pgstore.New(pool, opts...),
		begin: func(t *testing.T) pgx.Tx {
			tx, err := pool.Begin(context.Background())
			require.NoError(t, err)
			// A failed assertion must not leak the connection.
			t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
			return tx
		},
		commit:   func(tx pgx.Tx) error { return tx.Commit(context.Background()) },
		rollback: func(tx pgx.Tx) { _ = tx.Rollback(context.Background()) },
		rows: func(t *testing.T, name, key string) []string {
			rows, err := pool.Query(context.Background(),
				`SELECT format('%s %s %s %s', ctid, shard, value, ts) FROM txlimit WHERE name = $1 AND key = $2 ORDER BY shard`,
				name, key)
			require.NoError(t, err)
			out, err := pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err)
			return out
		},
		conns:       int(pool.Config().MaxConns) - 1,
		skipsLocked: true,
	}
}

func TestPostgresLockIsHeldUntilCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t, testdb.Schema(t), pgx.QueryExecModeCacheStatement, 4)
	name := uniqueName(t, "held")
	l, err := txlimit.New(pgstore.New(pool), map[string]txlimit.Config{
		name: {Kind: txlimit.TokenBucket, Rate: 10, Period: time.Minute},
	}, nil)
	require.NoError(t, err)

	tx1, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx1.Rollback(ctx)
	res, err := l.LimitTx(ctx, tx1, name, "k")
	require.NoError(t, err)
	require.True(t, res.OK)

	// While tx1 is open, another transaction cannot take the row.
	tx2, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx2.Rollback(ctx)
	_, err = tx2.Exec(ctx, "SET LOCAL lock_timeout = '50ms'")
	require.NoError(t, err)
	_, err = l.LimitTx(ctx, tx2, name, "k")
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "55P03", pgErr.Code, "lock_not_available")
	require.NoError(t, tx2.Rollback(ctx))

	require.NoError(t, tx1.Commit(ctx))
	res, err = l.Limit(ctx, name, "k")
	require.NoError(t, err)
	require.True(t, res.OK)
	snap, err := l.Value(ctx, name, "k")
	require.NoError(t, err)
	require.InDelta(t, 8, snap.Value, 0.5, "two spent, a little refilled")
}

// Under REPEATABLE READ and SERIALIZABLE a concurrent update of the same
// limit is a serialization failure, retryable; retrying admits exactly.
func TestPostgresStrictIsolation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t, testdb.Schema(t), pgx.QueryExecModeCacheStatement, 20)
	for _, iso := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
		t.Run(string(iso), func(t *testing.T) {
			name := uniqueName(t, "iso")
			clk := newClock()
			l, err := txlimit.New(pgstore.New(pool), map[string]txlimit.Config{
				name: {Kind: txlimit.TokenBucket, Rate: 20, Period: time.Hour},
			}, &txlimit.Options{Clock: clk.Now})
			require.NoError(t, err)
			var admitted, denied, retries atomic.Int64
			var wg sync.WaitGroup
			for range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range 2 {
						for {
							var res txlimit.Result
							err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: iso}, func(tx pgx.Tx) (err error) {
								res, err = l.LimitTx(ctx, tx, name, "k")
								return err
							})
							var pgErr *pgconn.PgError
							if errors.As(err, &pgErr) && pgErr.Code == "40001" {
								retries.Add(1)
								continue
							}
							if err != nil {
								t.Error(err)
								return
							}
							if res.OK {
								admitted.Add(1)
							} else {
								denied.Add(1)
							}
							break
						}
					}
				}()
			}
			wg.Wait()
			require.EqualValues(t, 20, admitted.Load())
			require.EqualValues(t, 12, denied.Load())
			t.Logf("%s: %d serialization failures retried", iso, retries.Load())
		})
	}
}

func TestPostgresPoolErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema(t)
	name := uniqueName(t, "pool")
	limits := map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Minute}}

	// Without a pool only the Tx forms work.
	l, err := txlimit.New(pgstore.New(nil), limits, nil)
	require.NoError(t, err)
	_, err = l.Limit(ctx, name, "k")
	require.ErrorIs(t, err, txlimit.ErrNoPool)
	pool := testdb.Pool(t, schema, pgx.QueryExecModeCacheStatement, 2)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	res, err := l.LimitTx(ctx, tx, name, "k")
	require.NoError(t, err)
	require.True(t, res.OK)
	require.NoError(t, tx.Rollback(ctx))

	// A closed pool is an error, not a panic.
	closed := testdb.Pool(t, schema, pgx.QueryExecModeCacheStatement, 2)
	closed.Close()
	l, err = txlimit.New(pgstore.New(closed), limits, nil)
	require.NoError(t, err)
	_, err = l.Limit(ctx, name, "k")
	require.Error(t, err)
	_, err = l.Value(ctx, name, "k")
	require.Error(t, err)
}

// --- SQLite ---

// sqliteDSN is the configuration sqlitestore documents: WAL, a busy timeout
// and BEGIN IMMEDIATE.
const sqliteDSN = "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate"

func openSQLite(t *testing.T) *sql.DB {
	t.Helper()
	return openSQLiteDSN(t, sqliteDSN)
}

// openSQLiteDSN is openSQLite with another DSN suffix.
func openSQLiteDSN(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+testdb.SQLitePath(t)+dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(16)
	db.SetMaxIdleConns(16) // not database/sql's 2: no reopening under concurrency
	require.NoError(t, migrations.Up(context.Background(), db, migrations.SQLite))
	return db
}

func sqliteHarness(t *testing.T, db *sql.DB) harness[*sql.Tx] {
	return harness[*sql.Tx]{
		store: sqlitestore.New(db),
		begin: func(t *testing.T) *sql.Tx {
			tx, err := db.Begin()
			require.NoError(t, err)
			t.Cleanup(func() { _ = tx.Rollback() })
			return tx
		},
		commit:   func(tx *sql.Tx) error { return tx.Commit() },
		rollback: func(tx *sql.Tx) { _ = tx.Rollback() },
		rows: func(t *testing.T, name, key string) []string {
			rows, err := db.Query(`SELECT printf('%d %!.17g %d %s', shard, value, ts, typeof(value))
				FROM txlimit WHERE name = ? AND key = ? ORDER BY shard`, name, key)
			require.NoError(t, err)
			defer rows.Close()
			var out []string
			for rows.Next() {
				var s string
				require.NoError(t, rows.Scan(&s))
				out = append(out, s)
			}
			require.NoError(t, rows.Err())
			return out
		},
		conns: 15,
	}
}
