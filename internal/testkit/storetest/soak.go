package storetest

import (
	"context"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
)

// The soak: mixed limits (a token bucket and a fixed window, each alone and
// sharded, and a token bucket that reserves), a business row
// written in the same transaction, random rollbacks and, on a store whose
// harness can (Harness.Kill), connections killed under load, for a bounded
// time. At the end the committed business rows of each limit must equal
// exactly what the limit allows: the tokens spent are the tokens the
// committed transactions took, nothing lost and nothing invented.
//
// TXLIMIT_SOAK_PHASE sets how long each of the four phases runs at least:
// 50ms by default, for go test ./..., which runs the soak once per store
// and exec mode; .ci/run sets 2s, and TXLIMIT_SOAK_PHASE=30s
// soaks each for two minutes. A phase goes on past its length until every
// limit is drained, so the totals are exact whatever the machine's speed.

// soakPhases is the number of phases: the clock moves one Period between
// them, so that each limit refills once per phase.
const soakPhases = 4

// soakWorkers is the number of workers, each in a transaction of its own:
// enough for several to queue on one limit, and to leave two of the shared
// harness's 8 transactions to the drain check and the killer.
const soakWorkers = 6

func soakPhase(t *testing.T) time.Duration {
	if v := os.Getenv("TXLIMIT_SOAK_PHASE"); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(t, err, "TXLIMIT_SOAK_PHASE")
		return d
	}
	return 50 * time.Millisecond
}

type soakLimit struct {
	name    string
	cfg     txlimit.Config
	reserve bool
	// want is the number of admissions over soakPhases phases with the
	// clock frozen in each phase and moved one Period between phases,
	// when demand exceeds supply.
	want int
}

func soakLimits(t *testing.T) []soakLimit {
	start := T0.Add(-time.Minute) // fixed windows aligned to the phases
	ls := []soakLimit{
		{name: "tb", cfg: txlimit.Config{Kind: txlimit.TokenBucket, Rate: 10, Period: time.Hour}},
		{name: "tb-shards", cfg: txlimit.Config{Kind: txlimit.TokenBucket, Rate: 16, Period: time.Hour, Shards: 8}},
		{name: "fw", cfg: txlimit.Config{Kind: txlimit.FixedWindow, Rate: 8, Period: time.Hour, Start: start}},
		{name: "fw-shards", cfg: txlimit.Config{Kind: txlimit.FixedWindow, Rate: 12, Period: time.Hour, Start: start, Shards: 4}},
		{name: "reserve", cfg: txlimit.Config{Kind: txlimit.TokenBucket, Rate: 6, Period: time.Hour, MaxReserved: 4}, reserve: true},
	}
	for i := range ls {
		ls[i].name = UniqueName(t, ls[i].name)
		ls[i].want = int(ls[i].cfg.Rate)*soakPhases + int(ls[i].cfg.MaxReserved)
	}
	return ls
}

// sqlString is s as an SQL string literal, the same in every dialect the
// stores speak: the soak's statements carry no parameters, whose
// placeholders differ ($1, ?).
func sqlString(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

func runSoak[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := context.Background()
	clk := NewClock()
	limits := soakLimits(t)
	cfgs := map[string]txlimit.Config{}
	for _, sl := range limits {
		cfgs[sl.name] = sl.cfg
	}
	l, err := txlimit.New(h.Store, cfgs, &txlimit.Options{Clock: clk.Now})
	require.NoError(t, err)
	require.GreaterOrEqual(t, h.Conns, soakWorkers+2, "the workers, the drain check and the killer")

	// The application's own table, beside txlimit's.
	tx := h.Begin(t)
	require.NoError(t, h.Exec(ctx, tx, "CREATE TABLE txlimit_soak_events (limit_name TEXT NOT NULL)"))
	require.NoError(t, h.Commit(tx))

	var committed, rolledBack, denied, failed atomic.Int64
	work := func(rng *rand.Rand) {
		sl := limits[rng.IntN(len(limits))]
		tx, err := h.TryBegin(ctx)
		if err != nil {
			if !h.Retryable(err) {
				t.Errorf("unexpected begin error: %v", err)
			}
			failed.Add(1)
			return
		}
		var opts []txlimit.Option
		if sl.reserve {
			opts = append(opts, txlimit.Reserve())
		}
		res, err := l.LimitTx(ctx, tx, sl.name, "", opts...)
		if err == nil && res.OK {
			err = h.Exec(ctx, tx, "INSERT INTO txlimit_soak_events (limit_name) VALUES ("+sqlString(sl.name)+")")
		}
		switch {
		case err != nil:
			h.Rollback(tx)
			if !h.Retryable(err) {
				t.Errorf("unexpected error: %v", err)
			}
			failed.Add(1)
		case !res.OK:
			h.Rollback(tx)
			denied.Add(1)
			// Once the limits are drained, a phase is all denials: a caller
			// pauses after one, as a client would, instead of spinning (on
			// SQLite, 40,000 denials a second and most of the soak's CPU).
			time.Sleep(5 * time.Millisecond)
		case rng.IntN(4) == 0:
			h.Rollback(tx) // the business transaction fails after LimitTx
			rolledBack.Add(1)
		default:
			if err := h.Commit(tx); err != nil {
				// A COMMIT that failed on a killed connection may or may not
				// have happened; the business rows tell, at the end.
				if !h.Retryable(err) {
					t.Errorf("unexpected commit error: %v", err)
				}
				failed.Add(1)
				return
			}
			committed.Add(1)
		}
	}

	// inTx runs fn in a transaction it rolls back, again while the
	// transaction fails with an error the application would retry.
	inTx := func(fn func(tx TTx) error) {
		for {
			tx, err := h.TryBegin(ctx)
			if err == nil {
				err = fn(tx)
				h.Rollback(tx)
				if err == nil {
					return
				}
			}
			require.True(t, h.Retryable(err), "%v", err)
		}
	}
	// value reads the tokens left in a limit.
	value := func(sl soakLimit) (v float64) {
		inTx(func(tx TTx) error {
			res, err := l.CheckTx(ctx, tx, sl.name, "", txlimit.Count(0))
			v = res.Remaining
			return err
		})
		return v
	}
	drained := func() bool {
		for _, sl := range limits {
			if value(sl) > -sl.cfg.MaxReserved+1e-6 {
				return false
			}
		}
		return true
	}

	phase := soakPhase(t)
	for p := range soakPhases {
		if p > 0 {
			clk.Advance(time.Hour)
		}
		var stop, stopKilling atomic.Bool
		var wg sync.WaitGroup
		for w := range soakWorkers {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(p), uint64(w)))
				for !stop.Load() {
					work(rng)
				}
			})
		}
		if h.Kill != nil {
			wg.Go(func() {
				for !stopKilling.Load() {
					// The killer's own connection may be one an earlier
					// kill ended.
					if err := h.Kill(ctx); err != nil && !h.Retryable(err) {
						t.Errorf("kill: %v", err)
						return
					}
					time.Sleep(50 * time.Millisecond)
				}
			})
		}
		time.Sleep(phase)
		// The killer stops first: on a loaded machine, kills every 50 ms can
		// abort nearly every transaction, and the test is about wrong
		// denials, not about the speed of work under fire. A limit that
		// never drains (a wrong denial) fails the test; the bound is only
		// there to end it.
		stopKilling.Store(true)
		giveUp := time.Now().Add(3 * time.Minute)
		for !drained() && time.Now().Before(giveUp) {
			time.Sleep(20 * time.Millisecond)
		}
		stop.Store(true)
		wg.Wait()
		require.True(t, drained(), "phase %d: the limits were not drained within 3 minutes of the last kill", p)
	}

	t.Logf("committed %d, rolled back %d, denied %d, failed %d", committed.Load(), rolledBack.Load(), denied.Load(), failed.Load())
	for _, sl := range limits {
		var n int64
		inTx(func(tx TTx) (err error) {
			n, err = h.QueryInt(ctx, tx, "SELECT count(*) FROM txlimit_soak_events WHERE limit_name = "+sqlString(sl.name))
			return err
		})
		require.Equal(t, int64(sl.want), n, "business rows of %s", sl.name)
		require.InDelta(t, -sl.cfg.MaxReserved, value(sl), 1e-6, "tokens left in %s", sl.name)
	}
}
