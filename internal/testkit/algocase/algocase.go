// Package algocase generates the random cases of the differential tests that
// hold each store's one-statement take to algo.Take: configs of
// both kinds, prior states (a missing row, debt, a value above capacity, a
// ts in the future as after a clock that stepped back), counts, the reserve
// flag and clocks. The stores' tests run every case through algo and through
// their SQL and require the same decision and the same stored state, bit for
// bit.
package algocase

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/internal/driver"
)

// Case is one call on one row.
type Case struct {
	Limit driver.Limit
	// State is the stored row, or nil for none (full: Limit.Full()).
	State   *algo.State
	Now     int64 // µs since the epoch
	Count   float64
	Reserve bool
}

// Prior is the state algo starts from: State, or full.
func (c Case) Prior() algo.State {
	if c.State == nil {
		return c.Limit.Full()
	}
	return *c.State
}

// Want is what algo decides.
func (c Case) Want() (algo.State, algo.Decision) {
	return algo.Take(c.Limit.Config, c.Prior(), c.Now, c.Count, c.Reserve)
}

// Generate returns n cases from seed. Every case is valid input: what the
// Limiter would hand a store after its validation.
func Generate(seed uint64, n int) []Case {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	out := make([]Case, n)
	for i := range out {
		out[i] = generate(r, i)
	}
	return out
}

func pick[T any](r *rand.Rand, xs ...T) T { return xs[r.IntN(len(xs))] }

// uniform returns a float in [lo, hi), sometimes rounded to a short decimal
// (the values people configure), sometimes with every bit random.
func uniform(r *rand.Rand, lo, hi float64) float64 {
	v := lo + r.Float64()*(hi-lo)
	if r.IntN(2) == 0 {
		v = math.Round(v*100) / 100
		if v < lo {
			v = lo
		}
	}
	return v
}

func generate(r *rand.Rand, i int) Case {
	kind := pick(r, algo.TokenBucket, algo.FixedWindow)
	capacity := pick(r, 1, 3, 10, 0.5, 1e6, 1e12, uniform(r, 0.01, 1000))
	if capacity <= 0 {
		capacity = 1
	}
	rate := pick(r, capacity, capacity/3, uniform(r, 0.001, 1e4), 1e9)
	if rate <= 0 {
		rate = 1
	}
	period := pick[int64](r, 1, 7, 1000, 1_000_000, 3_600_000_000, 86_400_000_000, 1+r.Int64N(10_000_000_000))
	maxReserved := pick(r, 0, 0, capacity/2, capacity*3, uniform(r, 0, 100))
	c := algo.Config{Kind: kind, Rate: rate, Period: period, Capacity: capacity, MaxReserved: maxReserved}
	now := int64(1_700_000_000_000_000) + r.Int64N(100_000_000_000_000)
	if r.IntN(40) == 0 {
		// A clock at the epoch, either side of it: a missing row (full
		// at ts 0) is then ahead of the clock.
		now = r.Int64N(2_000_000) - 1_000_000
	}
	l := driver.Limit{Name: "diff", Key: "k", Shards: 1, Config: c}
	if kind == algo.FixedWindow {
		l.Origin = pick(r, 0, r.Int64N(period), now-r.Int64N(1_000_000_000_000))
	}

	out := Case{Limit: l, Now: now}
	if r.IntN(5) > 0 {
		s := algo.State{}
		switch r.IntN(6) {
		case 0:
			s.Value = capacity
		case 1:
			s.Value = 0
		case 2:
			s.Value = -uniform(r, 0, capacity+maxReserved+1) // debt
		case 3:
			s.Value = capacity * uniform(r, 1, 2) // written under a larger capacity
		default:
			s.Value = uniform(r, 0, capacity)
		}
		// Elapsed time: none, a little, several periods, a lot, or
		// negative (the row's ts is ahead of the clock).
		elapsed := pick(r, 0, 1+r.Int64N(period), r.Int64N(10*period+1), r.Int64N(1_000_000_000_000),
			-r.Int64N(2*period+1_000_000), period, period-1)
		s.TS = now - elapsed
		if kind == algo.FixedWindow && r.IntN(4) > 0 {
			// Rows the store wrote are at a window start aligned to
			// origin.
			s.TS = algo.WindowStart(l.Origin, period, s.TS)
		}
		out.State = &s
	}
	out.Reserve = r.IntN(3) == 0
	switch {
	case out.Reserve && maxReserved > 0:
		out.Count = pick(r, 1, 0, uniform(r, 0, capacity+maxReserved), capacity+maxReserved, capacity)
		out.Count = math.Min(out.Count, capacity+maxReserved)
	case out.Reserve:
		out.Count = pick(r, 1, 0, uniform(r, 0, 3*capacity), capacity)
	default:
		out.Count = math.Min(pick(r, 1, 0, uniform(r, 0, capacity), capacity, capacity/3), capacity)
	}
	return out
}

// RequireCoverage fails t unless cases reach every outcome the statement
// must get right: grants, reservations, denials, missing rows, rows ahead
// of the clock, both kinds.
func RequireCoverage(t testing.TB, cases []Case) {
	t.Helper()
	var grants, reservations, long, denials, missing, ahead, fixed int
	for _, c := range cases {
		next, d := c.Want()
		switch {
		case !d.OK:
			denials++
		case next.Value < 0:
			reservations++
			if LongReservation(c, next) {
				long++
			}
		default:
			grants++
		}
		if c.State == nil {
			missing++
		} else if c.State.TS > c.Now {
			ahead++
		}
		if c.Limit.Config.Kind == algo.FixedWindow {
			fixed++
		}
	}
	t.Logf("%d cases: %d grants, %d reservations (%d left to Go for their wait), %d denials; %d missing rows, %d rows ahead of the clock, %d fixed windows",
		len(cases), grants, reservations, long, denials, missing, ahead, fixed)
	min := len(cases) / 20
	if grants < min || reservations < min || denials < min || missing < min || ahead < min || fixed < min {
		t.Fatalf("the cases miss an outcome (each needs %d)", min)
	}
}

// LongReservation reports whether a call that algo grants as want is a
// reservation whose wait the stores' statement does not vouch for (the
// statement's bound from above, in the same float operations, reaches 2e15
// µs) and leaves to the Go path: the statement alone grants nothing then,
// and the store's Take decides with algo.
func LongReservation(c Case, want algo.State) bool {
	if want.Value >= 0 {
		return false
	}
	cfg := c.Limit.Config
	ahead := max(c.Prior().TS-c.Now, 0)
	bound := float64(float64(-want.Value/cfg.Rate+2)*float64(cfg.Period)) + float64(ahead)
	return bound >= 2e15
}

// RequireStored fails t unless rows, the states a store holds for a case's
// key, are prior: none for a nil prior, else one, bit for bit.
func RequireStored(t testing.TB, prior *algo.State, rows []algo.State, msg string) {
	t.Helper()
	if prior == nil {
		require.Empty(t, rows, msg)
		return
	}
	require.Len(t, rows, 1, msg)
	RequireBits(t, *prior, rows[0], msg)
}

// RequireTake fails t unless a store's whole Take of c decided as algo
// does (got) and left the rows algo would (rows, the states the store holds
// for c's key after it): the prior row untouched on a denial, algo's state
// bit for bit on a grant.
func RequireTake(t testing.TB, c Case, got algo.Decision, rows []algo.State, msg string) {
	t.Helper()
	want, wantD := c.Want()
	require.Equal(t, wantD, got, msg)
	if !wantD.OK {
		RequireStored(t, c.State, rows, msg+": a denial writes nothing")
		return
	}
	require.Len(t, rows, 1, msg)
	RequireBits(t, want, rows[0], msg+": stored by Take")
}

// RequireBits fails t unless got is want bit for bit: the same float64 bits
// of Value and the same TS.
func RequireBits(t testing.TB, want, got algo.State, msg string) {
	t.Helper()
	require.Equal(t, math.Float64bits(want.Value), math.Float64bits(got.Value), "%s: value %v, want %v", msg, got.Value, want.Value)
	require.Equal(t, want.TS, got.TS, "%s: ts", msg)
}
