package httplimit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/httplimit"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/pgstore"
)

// TestInFlightPostgres caps the requests in flight per user with a
// Concurrency limit, over real sockets, on PostgreSQL.
func TestInFlightPostgres(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t, testdb.Schema(t), pgx.QueryExecModeCacheStatement, 32)
	clk := &clock{t: t0}
	limiter, err := txlimit.New(pgstore.New(pool), map[string]txlimit.Config{
		"inflight": {Kind: txlimit.Concurrency, Capacity: 3, HoldFor: time.Minute},
		"single":   {Kind: txlimit.Concurrency, Capacity: 1, HoldFor: time.Minute},
		"hourly":   {Kind: txlimit.TokenBucket, Rate: 3, Period: time.Hour},
	}, &txlimit.Options{Clock: clk.Now})
	require.NoError(t, err)
	free := func(name, key string) float64 {
		t.Helper()
		res, err := limiter.Check(ctx, name, key, txlimit.Count(0))
		require.NoError(t, err)
		return res.Remaining
	}
	limit := func(name string, opts *httplimit.Options) *httplimit.Limit[pgx.Tx] {
		t.Helper()
		lim, err := httplimit.New(limiter, name, userKey, opts)
		require.NoError(t, err)
		return lim
	}

	t.Run("ThreeOfTwentyInFlight", func(t *testing.T) {
		// 20 slow requests at once against a cap of 3: exactly 3 wait in
		// the handler together (burst holds them there until the other 17
		// have been answered), and 17 are denied before it.
		p := &probe{}
		s := serve(t, limit("inflight", nil).Handler(p))
		replies := s.burst(t, p, "burst", repeat("/", 20), 3)
		require.Equal(t, map[int]int{http.StatusOK: 3, http.StatusTooManyRequests: 17}, tally(replies))
		// Each admitted request acquired one slot, one after the other.
		require.Equal(t, []string{`"inflight";r=0`, `"inflight";r=1`, `"inflight";r=2`}, fields(replies, http.StatusOK))
		for _, r := range replies {
			require.Equal(t, `"inflight";q=3;qu="concurrent-requests"`, r.policy)
			if r.status == http.StatusTooManyRequests {
				require.Equal(t, `"inflight";r=0`, r.rateLimit)
				// The earliest expiry of a holder: HoldFor on this clock,
				// which does not move.
				require.Equal(t, "60", r.retryAfter)
			}
		}
		// The handlers have returned: every slot is back, and the next
		// burst gets 3 again.
		require.Equal(t, 3.0, free("inflight", "burst"))
		replies = s.burst(t, p, "burst", repeat("/", 8), 3)
		require.Equal(t, map[int]int{http.StatusOK: 3, http.StatusTooManyRequests: 5}, tally(replies))
		require.Equal(t, 3.0, free("inflight", "burst"))
		require.Equal(t, int64(6), p.entered.Load())
	})

	t.Run("DeniedBody", func(t *testing.T) {
		// The default answer to a denial says what was exceeded.
		p := &probe{}
		h := limit("single", nil).Handler(p)
		shut(p)
		defer p.open()
		s := serve(t, h)
		go s.send(ctx, "/", "body")
		waitRunning(t, p, 1)
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header.Set("X-Test-User", "body")
		w := httptest.NewRecorder()
		authenticate(h).ServeHTTP(w, req)
		p.open()
		s.wait(t)
		require.Equal(t, http.StatusTooManyRequests, w.Code)
		var body map[string]any
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &body))
		require.Equal(t, "Too many requests in flight; retry after 60 seconds.", body["detail"])
		require.Equal(t, []any{"single"}, body["violated-policies"])
		require.Equal(t, 1.0, free("single", "body"))
	})

	t.Run("ReleasedAfterPanic", func(t *testing.T) {
		// The handler panics: the slot is released, and the panic goes on
		// to net/http, which drops the connection.
		p := &probe{}
		s := serve(t, limit("single", nil).Handler(p))
		for range 3 {
			r := s.send(ctx, "/?do=panic", "panic")
			s.wait(t)
			require.Error(t, r.err, "net/http dropped the connection of the panicking handler")
			require.Equal(t, 1.0, free("single", "panic"))
		}
		require.Equal(t, http.StatusOK, s.get(t, "/", "panic").status)
		require.Equal(t, int64(4), p.entered.Load())
	})

	t.Run("ReleasedWhenTheClientDisconnects", func(t *testing.T) {
		// The client gives up mid-request: the handler sees its context
		// cancelled and returns, and the slot is released all the same,
		// in a context the cancellation does not reach.
		p := &probe{}
		s := serve(t, limit("single", nil).Handler(p))
		cctx, cancel := context.WithCancel(ctx)
		got := make(chan reply, 1)
		go func() { got <- s.send(cctx, "/?do=wait-for-disconnect", "gone") }()
		waitRunning(t, p, 1)
		// While it runs, it holds the only slot.
		r := s.get(t, "/", "gone")
		require.Equal(t, http.StatusTooManyRequests, r.status)
		require.Equal(t, 0.0, free("single", "gone"))
		cancel()
		require.ErrorIs(t, (<-got).err, context.Canceled)
		s.wait(t)
		require.Equal(t, 1.0, free("single", "gone"))
		r = s.get(t, "/", "gone")
		require.Equal(t, http.StatusOK, r.status, "a new request is admitted")
		require.Equal(t, `"single";r=0`, r.rateLimit)
		require.Equal(t, int64(2), p.entered.Load())
	})

	t.Run("WithARateLimit", func(t *testing.T) {
		// NewAll takes the slot and the token all or none: a request the
		// rate limit denies takes no slot, and one the full slot denies
		// takes no token.
		p := &probe{}
		lim, err := httplimit.NewAll(limiter, []httplimit.Rule{
			{Name: "single", Key: userKey},
			{Name: "hourly", Key: userKey},
		}, nil)
		require.NoError(t, err)
		s := serve(t, lim.Handler(p))
		r := s.get(t, "/", "mixed")
		require.Equal(t, http.StatusOK, r.status)
		require.Equal(t, `"single";r=0`, r.rateLimit, "no request like this one left in flight binds")
		require.Equal(t, 1.0, free("single", "mixed"))
		require.Equal(t, 2.0, free("hourly", "mixed"))

		shut(p)
		defer p.open()
		go s.send(ctx, "/", "mixed")
		waitRunning(t, p, 1)
		r = s.get(t, "/", "mixed")
		require.Equal(t, http.StatusTooManyRequests, r.status)
		require.Equal(t, "60", r.retryAfter)
		require.Equal(t, 1.0, free("hourly", "mixed"), "the running request took a token; the one its slot denied took none")
		p.open()
		s.wait(t)
		require.Equal(t, 1.0, free("single", "mixed"))

		require.Equal(t, http.StatusOK, s.get(t, "/", "mixed").status)
		require.Equal(t, 0.0, free("hourly", "mixed"))
		r = s.get(t, "/", "mixed")
		require.Equal(t, http.StatusTooManyRequests, r.status, "no token left")
		require.Equal(t, `"hourly";r=0;t=1200`, r.rateLimit)
		require.Equal(t, "1200", r.retryAfter)
		require.Equal(t, 1.0, free("single", "mixed"), "a denial took no slot")
		require.Equal(t, int64(3), p.entered.Load())
	})

	t.Run("WithACharge", func(t *testing.T) {
		// Beside a rule charged by outcome: the charge is settled when the
		// response is committed, and the slot released after the handler.
		p := &probe{}
		lim, err := httplimit.NewAll(limiter, []httplimit.Rule{
			{Name: "single", Key: userKey},
			{Name: "hourly", Key: userKey, Charge: httplimit.Statuses(http.StatusUnauthorized)},
		}, nil)
		require.NoError(t, err)
		s := serve(t, lim.Handler(p))
		require.Equal(t, http.StatusOK, s.get(t, "/", "charged").status)
		require.Equal(t, 3.0, free("hourly", "charged"), "a 200 is given back")
		require.Equal(t, http.StatusUnauthorized, s.get(t, "/?status=401", "charged").status)
		require.Equal(t, 2.0, free("hourly", "charged"), "a 401 is charged")
		require.Equal(t, 1.0, free("single", "charged"))
		// On a connection of its own: net/http's client sends a request
		// again when a reused connection breaks.
		s = serve(t, lim.Handler(p))
		r := s.send(ctx, "/?do=panic", "charged")
		s.wait(t)
		require.Error(t, r.err)
		require.Equal(t, 1.0, free("single", "charged"), "released after a panic too")
		require.Equal(t, int64(3), p.entered.Load())
	})

	t.Run("Value", func(t *testing.T) {
		vh, err := httplimit.ValueHandler(limiter, "inflight", userKey, nil)
		require.NoError(t, err)
		w := get(t, vh, "/", "value")
		require.Equal(t, http.StatusOK, w.Code)
		var v httplimit.Value
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &v))
		require.Equal(t, httplimit.Value{Name: "inflight", Kind: "concurrency", Value: 3, Capacity: 3,
			ServerTime: t0.Format(time.RFC3339Nano), Shards: 1}, v)
	})

	t.Run("Errors", func(t *testing.T) {
		_, err := httplimit.New(limiter, "inflight", userKey, &httplimit.Options{Count: func(*http.Request) float64 { return 2 }})
		require.ErrorContains(t, err, `limit "inflight" is a Concurrency limit, of which a request holds one slot; leave Count unset`)
		_, err = httplimit.New(limiter, "inflight", userKey, &httplimit.Options{Charge: httplimit.Statuses(401)})
		require.ErrorContains(t, err, "leave Charge and Mode unset")
		_, err = httplimit.NewAll(limiter, []httplimit.Rule{{Name: "inflight", Key: userKey, Mode: httplimit.TakeAfter}}, nil)
		require.ErrorContains(t, err, "leave Charge and Mode unset")

		// Tx returns before the handler ends: nothing would release the
		// slot. It writes nothing and takes nothing.
		lim := limit("inflight", nil)
		w := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			ok, err := lim.Tx(w, req.WithContext(context.WithValue(ctx, userKeyType{}, "tx")), tx)
			require.False(t, ok)
			return err
		})
		require.ErrorContains(t, err, "Tx cannot apply a Concurrency limit")
		require.Empty(t, w.Header())
		require.Equal(t, 3.0, free("inflight", "tx"))
	})
}

// TestInFlightExtended runs a request for longer than its slot's HoldFor,
// on the real clock: the middleware extends the slot while the handler
// runs, so that no second request is admitted beside it; when the slot is
// taken away by hand, the handler's context is cancelled.
func TestInFlightExtended(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t, testdb.Schema(t), pgx.QueryExecModeCacheStatement, 8)
	const holdFor = 3 * time.Second
	limiter, err := txlimit.New(pgstore.New(pool), map[string]txlimit.Config{
		"single": {Kind: txlimit.Concurrency, Capacity: 1, HoldFor: holdFor},
	}, nil)
	require.NoError(t, err)
	var logs bytes.Buffer
	lim, err := httplimit.New(limiter, "single", userKey, &httplimit.Options{Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	require.NoError(t, err)
	p := &probe{}
	var cause atomic.Value
	s := serve(t, lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("do") {
		case "now": // past the gate
			return
		case "until-cancelled":
			select {
			case <-r.Context().Done():
				cause.Store(context.Cause(r.Context()).Error())
			case <-time.After(time.Minute):
				cause.Store("not cancelled after a minute")
			}
			return
		}
		p.ServeHTTP(w, r)
	})))

	shut(p)
	defer p.open()
	got := make(chan reply, 1)
	go func() { got <- s.send(ctx, "/", "long") }()
	waitRunning(t, p, 1)
	// Past the HoldFor of its acquire, the request is still running and
	// still holds the slot.
	time.Sleep(holdFor + holdFor/6)
	r := s.get(t, "/?do=now", "long")
	require.Equal(t, http.StatusTooManyRequests, r.status, "the running request's slot was extended")
	p.open()
	require.Equal(t, http.StatusOK, (<-got).status)
	s.wait(t)
	r = s.get(t, "/", "long")
	require.Equal(t, http.StatusOK, r.status)

	// The slot is taken away while the handler runs (an operator's
	// reset): the next extension finds it gone and cancels the request's
	// context, with the reason as its cause.
	go func() { got <- s.send(ctx, "/?do=until-cancelled", "lost") }()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		res, err := limiter.Check(ctx, "single", "lost", txlimit.Count(0))
		require.NoError(t, err)
		if res.Remaining == 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the request did not acquire its slot")
	}
	require.NoError(t, limiter.Reset(ctx, "single", "lost"))
	require.Equal(t, http.StatusOK, (<-got).status)
	s.wait(t)
	require.Contains(t, cause.Load(), `the request's slot of Concurrency limit "single" was lost`)
	var entry map[string]any
	require.NoError(t, json.Unmarshal(logs.Bytes(), &entry), logs.String())
	require.Equal(t, "ERROR", entry["level"])
	require.Equal(t, "httplimit: the request's slot was lost while its handler ran; its context is cancelled", entry["msg"])
	require.Equal(t, "single", entry["limit"])
	require.NotEmpty(t, entry["holder"])
}

// waitRunning waits until n requests are inside p.
func waitRunning(t *testing.T, p *probe, n int64) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); p.running.Load() != n; time.Sleep(time.Millisecond) {
		require.True(t, time.Now().Before(deadline), "%d requests in the handler, want %d", p.running.Load(), n)
	}
}

// shut shuts p's gate: the requests that reach it wait until p.open().
func shut(p *probe) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gate = make(chan struct{})
}
