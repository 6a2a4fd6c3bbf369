package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
)

// configChange is one row of docs/config-changes.md: a limit's key takes
// under config a, a Limiter with config b opens the same store, and then
// the key holds exactly what the row says.
type configChange struct {
	// row is the subtest's name: the row's field and change, as the
	// table says it.
	row  string
	a, b txlimit.Config
	// at is where the clock stands (from T0) when the key takes under a;
	// then b after more.
	at, then time.Duration
	// take is the count taken under a at at (Reserve when reserve).
	take    float64
	reserve bool
	// remaining is the key's tokens under b at at+then; retryAfter the
	// wait of a call of count under b then, when the call is denied (0:
	// it is granted, and leaves remaining-count).
	remaining  float64
	count      float64
	retryAfter time.Duration
}

// runConfigChange is the suite's topic for a limit whose config changes
// while its keys have state (docs/config-changes.md): each row of the
// table, on this store, with a frozen clock.
func runConfigChange[TTx any](t *testing.T, h Harness[TTx]) {
	e := env[TTx]{h: h, ctx: context.Background()}
	minute := T0.Truncate(time.Hour) // T0 itself: a window boundary of every minute
	tb := txlimit.Config{Kind: txlimit.TokenBucket, Rate: 10, Period: time.Minute}
	fw := txlimit.Config{Kind: txlimit.FixedWindow, Rate: 10, Period: time.Minute, Start: minute}
	sw := txlimit.Config{Kind: txlimit.SlidingWindow, Rate: 10, Period: time.Minute, Start: minute}
	with := func(c txlimit.Config, edit func(*txlimit.Config)) txlimit.Config {
		edit(&c)
		return c
	}
	monthly := txlimit.Config{Kind: txlimit.Monthly, Rate: 100, Zone: "UTC"}
	day := 24 * time.Hour
	// T0 is Sunday, March 1, 2026, 12:00 UTC.
	rows := []configChange{
		{row: "Capacity/lowered", a: tb, b: with(tb, func(c *txlimit.Config) { c.Capacity = 5 }),
			take: 2, remaining: 5, count: 5},
		{row: "Capacity/raised", a: tb, b: with(tb, func(c *txlimit.Config) { c.Capacity = 20 }),
			take: 4, then: 30 * time.Second, remaining: 11, count: 12, retryAfter: 6 * time.Second},
		{row: "Rate/raised", a: tb, b: with(tb, func(c *txlimit.Config) { c.Rate, c.Capacity = 20, 10 }),
			take: 10, then: 15 * time.Second, remaining: 5, count: 6, retryAfter: 3 * time.Second},
		{row: "Rate/lowered", a: with(tb, func(c *txlimit.Config) { c.Rate = 20; c.Capacity = 10 }), b: tb,
			take: 10, then: 15 * time.Second, remaining: 2.5, count: 3, retryAfter: 3 * time.Second},
		{row: "Period/changed", a: tb, b: with(tb, func(c *txlimit.Config) { c.Period = 2 * time.Minute }),
			take: 10, then: 30 * time.Second, remaining: 2.5, count: 3, retryAfter: 6 * time.Second},
		{row: "Rate/FixedWindow_raised", a: fw, b: with(fw, func(c *txlimit.Config) { c.Rate = 20 }),
			at: 10 * time.Second, take: 10, then: 10 * time.Second, remaining: 0, count: 1, retryAfter: 40 * time.Second},
		{row: "MaxReserved/lowered", a: tb, b: with(tb, func(c *txlimit.Config) { c.MaxReserved = 5 }),
			take: 25, reserve: true, remaining: -15, count: 1, retryAfter: 96 * time.Second},
		{row: "Shards/raised", a: tb, b: with(tb, func(c *txlimit.Config) { c.Shards = 4 }),
			take: 6, remaining: 4, count: 4},
		{row: "Shards/lowered", a: with(tb, func(c *txlimit.Config) { c.Shards = 4 }), b: tb,
			take: 6, remaining: 4, count: 5, retryAfter: 6 * time.Second},
		{row: "Kind/FixedWindow_to_TokenBucket", a: fw, b: tb,
			at: 30 * time.Second, take: 10, remaining: 5, count: 6, retryAfter: 6 * time.Second},
		{row: "Kind/TokenBucket_to_FixedWindow", a: tb, b: fw,
			at: 30 * time.Second, take: 10, then: 40 * time.Second, remaining: 0, count: 1, retryAfter: 20 * time.Second},
		{row: "Kind/TokenBucket_to_SlidingWindow", a: tb, b: sw,
			take: 3, remaining: 3, count: 4, retryAfter: 68*time.Second + 571429*time.Microsecond},
		{row: "Kind/SlidingWindow_to_TokenBucket", a: sw, b: tb,
			take: 8, remaining: 8, count: 9, retryAfter: 6 * time.Second},
		{row: "Period/FixedWindow_raised", a: fw, b: with(fw, func(c *txlimit.Config) { c.Period = 5 * time.Minute }),
			at: 10 * time.Second, take: 10, then: 60 * time.Second, remaining: 0, count: 1, retryAfter: 230 * time.Second},
		{row: "Start/changed", a: fw, b: with(fw, func(c *txlimit.Config) { c.Start = minute.Add(30 * time.Second) }),
			at: 10 * time.Second, take: 10, then: 10 * time.Second, remaining: 0, count: 1, retryAfter: 40 * time.Second},
		{row: "Kind/FixedWindow_to_Daily", a: with(fw, func(c *txlimit.Config) { c.Period, c.Start = day, minute.Truncate(day) }),
			b:    txlimit.Config{Kind: txlimit.Daily, Rate: 10, Zone: "UTC"},
			take: 10, remaining: 0, count: 1, retryAfter: 12 * time.Hour},
		{row: "Zone/changed", a: monthly, b: with(monthly, func(c *txlimit.Config) { c.Zone = "America/New_York" }),
			take: 100, remaining: 0, count: 1, retryAfter: 30*day + 16*time.Hour},
		{row: "WeekStart/changed", a: txlimit.Config{Kind: txlimit.Weekly, Rate: 10, Zone: "UTC"},
			b:  txlimit.Config{Kind: txlimit.Weekly, Rate: 10, Zone: "UTC", WeekStart: time.Monday},
			at: 2 * day, take: 10, remaining: 0, count: 1, retryAfter: 5*day + 12*time.Hour},
		{row: "Kind/Monthly_to_Daily", a: monthly, b: txlimit.Config{Kind: txlimit.Daily, Rate: 10, Zone: "UTC"},
			at: 9 * day, take: 100, then: time.Hour, remaining: 0, count: 1, retryAfter: 11 * time.Hour},
		{row: "Kind/Monthly_to_Daily_days_later", a: monthly, b: txlimit.Config{Kind: txlimit.Daily, Rate: 10, Zone: "UTC"},
			take: 100, then: 9 * day, remaining: 10, count: 10},
		{row: "Kind/Daily_to_Monthly", a: txlimit.Config{Kind: txlimit.Daily, Rate: 10, Zone: "UTC"}, b: monthly,
			take: 10, remaining: 0, count: 1, retryAfter: 30*day + 12*time.Hour},
	}
	for _, r := range rows {
		t.Run(r.row, func(t *testing.T) {
			name := UniqueName(t, "change")
			clk := NewClock()
			clk.Advance(r.at)
			la := e.limiter(t, map[string]txlimit.Config{name: r.a}, clk)
			opts := []txlimit.Option{txlimit.Count(r.take)}
			if r.reserve {
				opts = append(opts, txlimit.Reserve())
			}
			require.True(t, e.limit(t, la, name, "k", opts...).OK, "the take under the old config")
			clk.Advance(r.then)
			lb := e.limiter(t, map[string]txlimit.Config{name: r.b}, clk)
			require.InDelta(t, r.remaining, e.value(t, lb, name, "k"), 1e-9, "the tokens under the new config")
			res := e.limit(t, lb, name, "k", txlimit.Count(r.count))
			if r.retryAfter == 0 {
				require.True(t, res.OK)
				require.InDelta(t, r.remaining-r.count, res.Remaining, 1e-9)
				if r.remaining-r.count < 1 {
					require.False(t, e.limit(t, lb, name, "k").OK, "nothing more than the new config holds")
				}
				return
			}
			e.requireRetryAfter(t, lb, clk, res, r.retryAfter, name, "k", txlimit.Count(r.count))
		})
	}

	t.Run("Capacity/raised_full_key", func(t *testing.T) {
		// A key with no row (never taken, or pruned once full) is full
		// under the new Capacity.
		name := UniqueName(t, "change")
		clk := NewClock()
		lb := e.limiter(t, map[string]txlimit.Config{name: with(tb, func(c *txlimit.Config) { c.Capacity = 20 })}, clk)
		require.InDelta(t, 20, e.value(t, lb, name, "k"), 1e-9)
	})

	acquire := func(t *testing.T, l *txlimit.Limiter[TTx], name, holder string) txlimit.Result {
		t.Helper()
		return e.limit(t, l, name, "k", txlimit.Holder(holder))
	}
	release := func(t *testing.T, l *txlimit.Limiter[TTx], name, holder string) {
		t.Helper()
		ok, err := l.Release(e.ctx, name, "k", holder)
		require.NoError(t, err)
		require.True(t, ok, holder)
	}
	slots := txlimit.Config{Kind: txlimit.Concurrency, Capacity: 3, HoldFor: time.Minute}

	t.Run("Concurrency/Capacity_lowered", func(t *testing.T) {
		// The holders keep their slots; none is admitted until fewer than
		// the new Capacity hold one.
		name := UniqueName(t, "change")
		clk := NewClock()
		la := e.limiter(t, map[string]txlimit.Config{name: slots}, clk)
		for _, id := range []string{"h1", "h2", "h3"} {
			require.True(t, acquire(t, la, name, id).OK, id)
		}
		clk.Advance(10 * time.Second)
		lb := e.limiter(t, map[string]txlimit.Config{name: with(slots, func(c *txlimit.Config) { c.Capacity = 2 })}, clk)
		res := acquire(t, lb, name, "h4")
		require.False(t, res.OK)
		require.Equal(t, 50*time.Second, res.RetryAfter, "until the first holder expires")
		require.True(t, acquire(t, lb, name, "h1").OK, "a holder is granted again")
		release(t, lb, name, "h1")
		require.False(t, acquire(t, lb, name, "h4").OK, "2 holders of 2")
		release(t, lb, name, "h2")
		res = acquire(t, lb, name, "h4")
		require.True(t, res.OK)
		require.Zero(t, res.Remaining)
	})

	t.Run("Concurrency/Capacity_raised", func(t *testing.T) {
		name := UniqueName(t, "change")
		clk := NewClock()
		la := e.limiter(t, map[string]txlimit.Config{name: slots}, clk)
		for _, id := range []string{"h1", "h2", "h3"} {
			require.True(t, acquire(t, la, name, id).OK, id)
		}
		lb := e.limiter(t, map[string]txlimit.Config{name: with(slots, func(c *txlimit.Config) { c.Capacity = 4 })}, clk)
		res := acquire(t, lb, name, "h4")
		require.True(t, res.OK)
		require.Zero(t, res.Remaining)
		require.False(t, acquire(t, lb, name, "h5").OK)
	})

	t.Run("Concurrency/HoldFor_changed", func(t *testing.T) {
		// A holder keeps the expiry it was granted; Extend and new holders
		// take the new HoldFor.
		name := UniqueName(t, "change")
		clk := NewClock()
		one := with(slots, func(c *txlimit.Config) { c.Capacity = 1 })
		la := e.limiter(t, map[string]txlimit.Config{name: one}, clk)
		require.True(t, acquire(t, la, name, "h1").OK)
		clk.Advance(30 * time.Second)
		lb := e.limiter(t, map[string]txlimit.Config{name: with(one, func(c *txlimit.Config) { c.HoldFor = 5 * time.Minute })}, clk)
		res := acquire(t, lb, name, "h2")
		require.False(t, res.OK)
		require.Equal(t, 30*time.Second, res.RetryAfter, "h1 expires as granted")
		ok, err := lb.Extend(e.ctx, name, "k", "h1")
		require.NoError(t, err)
		require.True(t, ok)
		res = acquire(t, lb, name, "h2")
		require.False(t, res.OK)
		require.Equal(t, 5*time.Minute, res.RetryAfter, "extended by the new HoldFor")
	})
}
