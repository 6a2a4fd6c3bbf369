package httplimit_test

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/httplimit"
	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/pgstore"
	"github.com/txlimit/txlimit/sqlitestore"
)

func TestOutcomePostgres(t *testing.T) {
	pool := testdb.Pool(t, testdb.Schema(t), pgx.QueryExecModeCacheStatement, 16)
	runOutcome(t, pgstore.New(pool))
}

func TestOutcomeSQLite(t *testing.T) {
	db := openSQLite(t)
	// SQLite has one writer: 64 requests at once queue for one connection
	// here rather than in SQLite's busy handler, which under the race
	// detector on a busy machine can wait out busy_timeout.
	db.SetMaxOpenConns(1)
	runOutcome(t, sqlitestore.New(db))
}

func openSQLite(t *testing.T) *sql.DB {
	db, err := sql.Open("sqlite", "file:"+testdb.SQLitePath(t)+
		"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	require.NoError(t, migrations.Up(context.Background(), db, migrations.SQLite))
	return db
}

// probe is the application behind the limit: it answers with the status
// the request asks for (?status=401), and counts the requests that reach
// it. While a gate is set, each request waits for it to open first.
type probe struct {
	entered atomic.Int64
	running atomic.Int64
	mu      sync.Mutex
	gate    chan struct{}
}

func (p *probe) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.entered.Add(1)
	p.running.Add(1)
	defer p.running.Add(-1)
	p.mu.Lock()
	gate := p.gate
	p.mu.Unlock()
	if gate != nil {
		<-gate
	}
	q := r.URL.Query()
	status, _ := strconv.Atoi(q.Get("status"))
	switch q.Get("do") {
	case "panic":
		panic("the handler failed")
	case "panic-after-status":
		w.WriteHeader(status)
		panic("the handler failed after its status")
	case "wait-for-disconnect":
		<-r.Context().Done()
	case "flush":
		if err := http.NewResponseController(w).Flush(); err != nil {
			panic(err)
		}
	}
	if v := q.Get("outcome"); v != "" {
		w.Header().Set("X-Outcome", v)
	}
	if status != 0 {
		w.WriteHeader(status)
	}
	if q.Get("do") != "wait-for-disconnect" {
		_, _ = io.WriteString(w, "done\n")
	}
}

// open opens the gate, if one is set, and removes it.
func (p *probe) open() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gate != nil {
		close(p.gate)
		p.gate = nil
	}
}

// reply is what a client got.
type reply struct {
	status     int
	rateLimit  string
	policy     string
	retryAfter string
	err        error
}

type server struct {
	url    string
	client *http.Client
	// done receives a value each time the server has finished a request,
	// a panicking one included.
	done chan struct{}
}

// serve runs h behind the tests' authentication on a real socket.
func serve(t *testing.T, h http.Handler) *server {
	s := &server{client: &http.Client{
		Timeout:   time.Minute,
		Transport: &http.Transport{MaxIdleConnsPerHost: 64},
	}, done: make(chan struct{}, 256)}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { s.done <- struct{}{} }()
		authenticate(h).ServeHTTP(w, r)
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the panics the tests cause
	srv.Start()
	t.Cleanup(srv.Close)
	t.Cleanup(s.client.CloseIdleConnections)
	s.url = srv.URL
	return s
}

func (s *server) send(ctx context.Context, path, user string) reply {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url+path, nil)
	if err != nil {
		return reply{err: err}
	}
	req.Header.Set("X-Test-User", user)
	resp, err := s.client.Do(req)
	if err != nil {
		return reply{err: err}
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return reply{
		status: resp.StatusCode, rateLimit: resp.Header.Get("RateLimit"), policy: resp.Header.Get("RateLimit-Policy"),
		retryAfter: resp.Header.Get("Retry-After"), err: err,
	}
}

// get sends one request and waits until the server has finished it.
func (s *server) get(t *testing.T, path, user string) reply {
	t.Helper()
	r := s.send(context.Background(), path, user)
	require.NoError(t, r.err)
	s.wait(t)
	return r
}

func (s *server) wait(t *testing.T) {
	t.Helper()
	select {
	case <-s.done:
	case <-time.After(time.Minute):
		t.Fatal("the server did not finish the request")
	}
}

// burst sends one request per path at once as user, with p's gate shut.
// It opens the gate once admitted requests are waiting at it and every
// other one has been answered, and returns the replies in the order of
// paths. A limit that lets more than admitted requests in (or fewer) fails
// the test.
func (s *server) burst(t *testing.T, p *probe, user string, paths []string, admitted int) []reply {
	t.Helper()
	p.mu.Lock()
	p.gate = make(chan struct{})
	p.mu.Unlock()
	defer p.open()
	entered := p.entered.Load()
	replies := make([]reply, len(paths))
	var answered atomic.Int64
	var wg sync.WaitGroup
	for i, path := range paths {
		wg.Go(func() {
			replies[i] = s.send(context.Background(), path, user)
			answered.Add(1)
		})
	}
	deadline := time.Now().Add(time.Minute)
	for p.running.Load() != int64(admitted) || answered.Load() != int64(len(paths)-admitted) {
		if time.Now().After(deadline) {
			p.open()
			wg.Wait()
			t.Fatalf("after a minute, %d requests wait in the handler and %d were answered; want %d and %d",
				p.running.Load(), answered.Load(), admitted, len(paths)-admitted)
		}
		time.Sleep(time.Millisecond)
	}
	p.open()
	wg.Wait()
	for range paths {
		s.wait(t)
	}
	require.Equal(t, int64(admitted), p.entered.Load()-entered, "requests that reached the handler")
	for _, r := range replies {
		require.NoError(t, r.err)
	}
	return replies
}

// paths returns n paths asking for status, then m asking for 200.
func paths(n int, status int, m int) []string {
	var out []string
	for range n {
		out = append(out, fmt.Sprintf("/?status=%d", status))
	}
	for range m {
		out = append(out, "/?status=200")
	}
	return out
}

// tally counts replies by status.
func tally(replies []reply) map[int]int {
	out := map[int]int{}
	for _, r := range replies {
		out[r.status]++
	}
	return out
}

// fields returns the RateLimit fields of the replies of status, sorted.
func fields(replies []reply, status int) []string {
	var out []string
	for _, r := range replies {
		if r.status == status {
			out = append(out, r.rateLimit)
		}
	}
	slices.Sort(out)
	return out
}

func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

func runOutcome[TTx any](t *testing.T, store driver.Store[TTx]) {
	ctx := context.Background()
	clk := &clock{t: t0}
	limiter, err := txlimit.New(store, map[string]txlimit.Config{
		"three": {Kind: txlimit.TokenBucket, Rate: 3, Period: time.Hour},
		"ten":   {Kind: txlimit.TokenBucket, Rate: 10, Period: time.Hour},
		"one":   {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Hour},
		"fw":    {Kind: txlimit.FixedWindow, Rate: 2, Period: time.Hour, Start: t0},
	}, &txlimit.Options{Clock: clk.Now})
	require.NoError(t, err)
	value := func(name, key string) float64 {
		t.Helper()
		res, err := limiter.Check(ctx, name, key, txlimit.Count(0))
		require.NoError(t, err)
		return res.Remaining
	}
	failed := httplimit.Statuses(http.StatusUnauthorized, http.StatusForbidden)
	success := func(_ *http.Request, status int, _ http.Header) bool { return status >= 200 && status < 300 }
	notServerError := func(_ *http.Request, status int, _ http.Header) bool { return status < 500 }
	anyFailure := func(_ *http.Request, status int, _ http.Header) bool { return status >= 400 }
	limit := func(name string, opts *httplimit.Options) *httplimit.Limit[TTx] {
		t.Helper()
		lim, err := httplimit.New(limiter, name, userKey, opts)
		require.NoError(t, err)
		return lim
	}

	t.Run("TakeBeforeByDefault", func(t *testing.T) {
		// The default over a socket, for comparison: every request is
		// charged before the handler, whatever it answers.
		p := &probe{}
		s := serve(t, limit("three", nil).Handler(p))
		for i, status := range []int{200, 401, 500} {
			r := s.get(t, fmt.Sprintf("/?status=%d", status), "default")
			require.Equal(t, status, r.status)
			require.Equal(t, fmt.Sprintf(`"three";r=%d;t=1200`, 2-i), r.rateLimit)
		}
		r := s.get(t, "/", "default")
		require.Equal(t, http.StatusTooManyRequests, r.status)
		require.Equal(t, "1200", r.retryAfter)
		require.Equal(t, int64(3), p.entered.Load())
	})

	t.Run("RefundChargesFailuresOnly", func(t *testing.T) {
		p := &probe{}
		s := serve(t, limit("three", &httplimit.Options{Charge: failed}).Handler(p))
		for _, step := range []struct {
			status int
			field  string
			value  float64
		}{
			// The fields are those of the take before the handler: the
			// request counts as charged, and a refund only adds.
			{200, `"three";r=2;t=1200`, 3},
			{401, `"three";r=2;t=1200`, 2},
			{200, `"three";r=1;t=1200`, 2},
			{403, `"three";r=1;t=1200`, 1},
			{404, `"three";r=0;t=1200`, 1},
			{401, `"three";r=0;t=1200`, 0},
		} {
			r := s.get(t, fmt.Sprintf("/?status=%d", step.status), "refund")
			require.Equal(t, step.status, r.status)
			require.Equal(t, `"three";q=3;w=3600`, r.policy)
			require.Equal(t, step.field, r.rateLimit, step.status)
			require.Empty(t, r.retryAfter)
			require.Equal(t, step.value, value("three", "refund"), step.status)
		}
		// Three failures charged: denied before the handler, success or not.
		r := s.get(t, "/?status=200", "refund")
		require.Equal(t, http.StatusTooManyRequests, r.status)
		require.Equal(t, "1200", r.retryAfter)
		require.Equal(t, `"three";r=0;t=1200`, r.rateLimit)
		require.Equal(t, int64(6), p.entered.Load())
	})

	t.Run("RefundAServerError", func(t *testing.T) {
		// Every response is charged but a 5xx, which is given back.
		p := &probe{}
		s := serve(t, limit("three", &httplimit.Options{Charge: notServerError}).Handler(p))
		require.Equal(t, 503, s.get(t, "/?status=503", "refund5xx").status)
		require.Equal(t, 3.0, value("three", "refund5xx"))
		require.Equal(t, 404, s.get(t, "/?status=404", "refund5xx").status)
		require.Equal(t, 2.0, value("three", "refund5xx"))
		require.Equal(t, 500, s.get(t, "/?status=500", "refund5xx").status)
		require.Equal(t, 200, s.get(t, "/", "refund5xx").status)
		require.Equal(t, 1.0, value("three", "refund5xx"))
	})

	t.Run("TakeAfterChargesSuccessesOnly", func(t *testing.T) {
		p := &probe{}
		s := serve(t, limit("three", &httplimit.Options{Charge: success, Mode: httplimit.TakeAfter}).Handler(p))
		for _, step := range []struct {
			status int
			field  string
			value  float64
		}{
			// A response not charged has the fields of the check before
			// the handler, which took nothing (a full limit: no t); a
			// charged one those of the take after it.
			{422, `"three";r=3`, 3},
			{201, `"three";r=2;t=1200`, 2},
			{422, `"three";r=2;t=1200`, 2},
			{0, `"three";r=1;t=1200`, 1}, // no WriteHeader: the body's Write sends a 200
			{204, `"three";r=0;t=1200`, 0},
		} {
			r := s.get(t, fmt.Sprintf("/?status=%d", step.status), "after")
			require.Equal(t, cmp.Or(step.status, http.StatusOK), r.status)
			require.Equal(t, `"three";q=3;w=3600`, r.policy)
			require.Equal(t, step.field, r.rateLimit, step.status)
			require.Equal(t, step.value, value("three", "after"), step.status)
		}
		r := s.get(t, "/?status=422", "after")
		require.Equal(t, http.StatusTooManyRequests, r.status, "an empty limit denies before the handler, whatever the outcome would be")
		require.Equal(t, "1200", r.retryAfter)
		require.Equal(t, int64(5), p.entered.Load())
	})

	t.Run("ChargeByTheResponseHeader", func(t *testing.T) {
		// A function of the response: the handler marks a failed login
		// with a header of its own and answers 200 either way.
		byHeader := func(_ *http.Request, _ int, h http.Header) bool { return h.Get("X-Outcome") == "failed" }
		for _, mode := range []httplimit.Mode{httplimit.Refund, httplimit.TakeAfter} {
			key := fmt.Sprintf("header%d", mode)
			s := serve(t, limit("three", &httplimit.Options{Charge: byHeader, Mode: mode}).Handler(&probe{}))
			require.Equal(t, 200, s.get(t, "/?outcome=ok", key).status)
			require.Equal(t, 3.0, value("three", key))
			require.Equal(t, 200, s.get(t, "/?outcome=failed", key).status)
			require.Equal(t, 2.0, value("three", key))
		}
	})

	t.Run("SequentialClientGetsItsTokenBack", func(t *testing.T) {
		// The charge is settled before the response's header goes out:
		// a client that waits for each answer never finds its own last
		// request still holding the one token.
		for _, mode := range []httplimit.Mode{httplimit.Refund, httplimit.TakeAfter} {
			key := fmt.Sprintf("sequential%d", mode)
			s := serve(t, limit("one", &httplimit.Options{Charge: failed, Mode: mode}).Handler(&probe{}))
			for range 5 {
				r := s.send(ctx, "/?status=200", key)
				require.NoError(t, r.err)
				require.Equal(t, http.StatusOK, r.status)
			}
			r := s.send(ctx, "/?status=401", key)
			require.NoError(t, r.err)
			require.Equal(t, http.StatusUnauthorized, r.status)
			r = s.send(ctx, "/?status=200", key)
			require.NoError(t, r.err)
			require.Equal(t, http.StatusTooManyRequests, r.status)
			require.Equal(t, 0.0, value("one", key))
		}
	})

	t.Run("SixtyFourAtOnceRefund", func(t *testing.T) {
		// A limit of 10 that charges only failures. Requests hold their
		// token while they run: of 64 at once, 10 run and 54 are denied
		// before the handler, whatever their outcome would be.
		p := &probe{}
		s := serve(t, limit("ten", &httplimit.Options{Charge: failed}).Handler(p))
		replies := s.burst(t, p, "refund64", paths(40, 401, 24), 10)
		n := tally(replies)
		require.Equal(t, 54, n[http.StatusTooManyRequests], n)
		require.Equal(t, 10, n[http.StatusUnauthorized]+n[http.StatusOK], n)
		charged := n[http.StatusUnauthorized]
		require.Equal(t, float64(10-charged), value("ten", "refund64"), "exactly the failures are charged; the successes were given back")
		// The ten took one token each, one after the other.
		var admittedFields []string
		for i := range 10 {
			admittedFields = append(admittedFields, fmt.Sprintf(`"ten";r=%d;t=360`, i))
		}
		require.Equal(t, admittedFields, slices.Sorted(slices.Values(append(fields(replies, 401), fields(replies, 200)...))))
		for _, r := range replies {
			if r.status == http.StatusTooManyRequests {
				require.Equal(t, "360", r.retryAfter)
				require.Equal(t, `"ten";r=0;t=360`, r.rateLimit)
			}
		}

		// 64 failures at once: the tokens left run that many, all charged.
		left := 10 - charged
		replies = s.burst(t, p, "refund64", paths(64, 401, 0), left)
		n = tally(replies)
		require.Equal(t, left, n[http.StatusUnauthorized], n)
		require.Equal(t, 64-left, n[http.StatusTooManyRequests], n)
		require.Len(t, n, min(left, 1)+1, n)
		require.Equal(t, 0.0, value("ten", "refund64"), "10 failures charged in all")

		// Now every request is denied before the handler.
		replies = s.burst(t, p, "refund64", paths(0, 0, 64), 0)
		require.Equal(t, map[int]int{http.StatusTooManyRequests: 64}, tally(replies))
		require.Equal(t, 0.0, value("ten", "refund64"))
	})

	t.Run("SixtyFourAtOnceTakeAfter", func(t *testing.T) {
		// The same limit checked before the handler and taken after it:
		// all 64 pass the check (the handler holds them until all have),
		// 6 fail and 58 succeed, and exactly the 6 failures are charged.
		p := &probe{}
		s := serve(t, limit("ten", &httplimit.Options{Charge: failed, Mode: httplimit.TakeAfter}).Handler(p))
		replies := s.burst(t, p, "after64", paths(6, 401, 58), 64)
		require.Equal(t, map[int]int{401: 6, 200: 58}, tally(replies))
		require.Equal(t, 4.0, value("ten", "after64"))
		require.Equal(t, repeat(`"ten";r=10`, 58), fields(replies, 200), "the check saw a full limit")
		var want []string
		for r := 4; r <= 9; r++ {
			want = append(want, fmt.Sprintf(`"ten";r=%d;t=360`, r))
		}
		require.Equal(t, want, fields(replies, 401), "each failure's own take")

		// 40 failures and 24 successes, all past the check with 4 tokens
		// left: exactly 4 failures are charged, min(10, 6+40) in all; the
		// other 36 ran with the limit empty, and say so.
		replies = s.burst(t, p, "after64", paths(40, 401, 24), 64)
		require.Equal(t, map[int]int{401: 40, 200: 24}, tally(replies))
		require.Equal(t, 0.0, value("ten", "after64"))
		require.Equal(t, repeat(`"ten";r=4;t=360`, 24), fields(replies, 200))
		want = append(repeat(`"ten";r=0;t=360`, 37), `"ten";r=1;t=360`, `"ten";r=2;t=360`, `"ten";r=3;t=360`)
		require.Equal(t, want, fields(replies, 401))
		for _, r := range replies {
			require.Empty(t, r.retryAfter, "no response the handler wrote is a 429")
		}

		// 10 failures charged: every request is denied before the handler.
		replies = s.burst(t, p, "after64", paths(32, 401, 32), 0)
		require.Equal(t, map[int]int{http.StatusTooManyRequests: 64}, tally(replies))
		for _, r := range replies {
			require.Equal(t, "360", r.retryAfter)
		}
		require.Equal(t, 0.0, value("ten", "after64"))
	})

	t.Run("Panic", func(t *testing.T) {
		// A handler that panics before its status is charged as a 500,
		// the panic goes on to net/http (which drops the connection), and
		// not a token is lost or forgiven.
		for _, c := range []struct {
			name   string
			opts   httplimit.Options
			path   string
			charge bool
		}{
			{"RefundFailuresOnly", httplimit.Options{Charge: failed}, "/?do=panic", false},
			{"RefundAServerError", httplimit.Options{Charge: notServerError}, "/?do=panic", false},
			{"RefundAnyFailure", httplimit.Options{Charge: anyFailure}, "/?do=panic", true},
			{"TakeAfterAnyFailure", httplimit.Options{Charge: anyFailure, Mode: httplimit.TakeAfter}, "/?do=panic", true},
			{"TakeAfterSuccesses", httplimit.Options{Charge: success, Mode: httplimit.TakeAfter}, "/?do=panic", false},
			// After its status: charged by that status, once.
			{"RefundAfter401", httplimit.Options{Charge: failed}, "/?do=panic-after-status&status=401", true},
			{"RefundAfter200", httplimit.Options{Charge: failed}, "/?do=panic-after-status&status=200", false},
			{"TakeAfterAfter401", httplimit.Options{Charge: failed, Mode: httplimit.TakeAfter}, "/?do=panic-after-status&status=401", true},
		} {
			t.Run(c.name, func(t *testing.T) {
				key := "panic" + c.name
				s := serve(t, limit("three", &c.opts).Handler(&probe{}))
				r := s.send(ctx, c.path, key)
				s.wait(t)
				require.Error(t, r.err, "net/http dropped the connection of the panicking handler")
				want := 3.0
				if c.charge {
					want = 2
				}
				require.Equal(t, want, value("three", key))
			})
		}
	})

	t.Run("ClientDisconnects", func(t *testing.T) {
		// The client gives up while the handler runs: the handler sees
		// the request's context cancelled and answers all the same. The
		// refund or the charge still happens, exactly once.
		for _, c := range []struct {
			name   string
			opts   httplimit.Options
			path   string
			charge bool
		}{
			{"RefundGivesBack", httplimit.Options{Charge: failed}, "/?do=wait-for-disconnect", false},
			{"RefundKeeps", httplimit.Options{Charge: failed}, "/?do=wait-for-disconnect&status=401", true},
			{"TakeAfterTakes", httplimit.Options{Charge: failed, Mode: httplimit.TakeAfter}, "/?do=wait-for-disconnect&status=401", true},
			{"TakeAfterTakesNothing", httplimit.Options{Charge: failed, Mode: httplimit.TakeAfter}, "/?do=wait-for-disconnect", false},
		} {
			t.Run(c.name, func(t *testing.T) {
				key := "disconnect" + c.name
				p := &probe{}
				s := serve(t, limit("three", &c.opts).Handler(p))
				cctx, cancel := context.WithCancel(ctx)
				got := make(chan reply, 1)
				go func() { got <- s.send(cctx, c.path, key) }()
				for deadline := time.Now().Add(time.Minute); p.running.Load() == 0; time.Sleep(time.Millisecond) {
					require.True(t, time.Now().Before(deadline), "the request did not reach the handler")
				}
				cancel()
				require.ErrorIs(t, (<-got).err, context.Canceled)
				s.wait(t)
				want := 3.0
				if c.charge {
					want = 2
				}
				require.Equal(t, want, value("three", key))
			})
		}
	})

	t.Run("FlushBeforeWrite", func(t *testing.T) {
		// A handler that flushes first sends a 200 header then: the
		// charge is settled, and the fields set, before it goes.
		for _, mode := range []httplimit.Mode{httplimit.Refund, httplimit.TakeAfter} {
			key := fmt.Sprintf("flush%d", mode)
			s := serve(t, limit("three", &httplimit.Options{Charge: success, Mode: mode}).Handler(&probe{}))
			r := s.get(t, "/?do=flush", key)
			require.Equal(t, http.StatusOK, r.status)
			require.Equal(t, `"three";r=2;t=1200`, r.rateLimit)
			require.Equal(t, 2.0, value("three", key))
		}
	})

	t.Run("EarlyHintsAndHijack", func(t *testing.T) {
		// A 103 Early Hints comes before the final status, which decides.
		hints := serve(t, limit("three", &httplimit.Options{Charge: failed}).Handler(http.HandlerFunc(
			func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Link", "</style.css>; rel=preload")
				w.WriteHeader(http.StatusEarlyHints)
				w.WriteHeader(http.StatusUnauthorized)
			})))
		require.Equal(t, http.StatusUnauthorized, hints.get(t, "/", "hints").status)
		require.Equal(t, 2.0, value("three", "hints"))

		// A handler that takes the connection over (a WebSocket
		// handshake) is charged as a 101 when it does: here a limit on
		// upgrades, taken after.
		upgrades := serve(t, limit("three", &httplimit.Options{Charge: httplimit.Statuses(http.StatusSwitchingProtocols), Mode: httplimit.TakeAfter}).Handler(http.HandlerFunc(
			func(w http.ResponseWriter, r *http.Request) {
				conn, buf, err := http.NewResponseController(w).Hijack()
				if err != nil {
					panic(err)
				}
				defer conn.Close()
				_, _ = buf.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nhi\n")
				_ = buf.Flush()
			})))
		require.Equal(t, http.StatusOK, upgrades.get(t, "/", "hijack").status)
		require.Equal(t, 2.0, value("three", "hijack"))
	})

	t.Run("FixedWindow", func(t *testing.T) {
		// A window kind, refunded and taken after, with its t at the
		// window's end.
		p := &probe{}
		s := serve(t, limit("fw", &httplimit.Options{Charge: failed}).Handler(p))
		until := int64(t0.Add(time.Hour).Sub(clk.Now()) / time.Second)
		for range 3 {
			r := s.get(t, "/", "window")
			require.Equal(t, fmt.Sprintf(`"fw";r=1;t=%d`, until), r.rateLimit)
		}
		require.Equal(t, 2.0, value("fw", "window"))
		s = serve(t, limit("fw", &httplimit.Options{Charge: failed, Mode: httplimit.TakeAfter}).Handler(p))
		r := s.get(t, "/?status=401", "window")
		require.Equal(t, fmt.Sprintf(`"fw";r=1;t=%d`, until), r.rateLimit)
		require.Equal(t, 1.0, value("fw", "window"))
	})

	t.Run("SeveralRules", func(t *testing.T) {
		// A per-user limit charged before the handler, failed logins
		// given back unless they fail, and 404s taken after: each rule
		// charges by its own outcome.
		p := &probe{}
		lim, err := httplimit.NewAll(limiter, []httplimit.Rule{
			{Name: "ten", Key: userKey},
			{Name: "three", Key: userKey, Charge: failed},
			{Name: "one", Key: userKey, Charge: httplimit.Statuses(404), Mode: httplimit.TakeAfter},
		}, nil)
		require.NoError(t, err)
		s := serve(t, lim.Handler(p))
		values := func() [3]float64 {
			return [3]float64{value("ten", "several"), value("three", "several"), value("one", "several")}
		}
		r := s.get(t, "/", "several")
		require.Equal(t, http.StatusOK, r.status)
		require.Equal(t, `"one";r=1`, r.rateLimit, "1 request left by the check of one, which binds")
		require.Equal(t, [3]float64{9, 3, 1}, values())
		require.Equal(t, http.StatusUnauthorized, s.get(t, "/?status=401", "several").status)
		require.Equal(t, [3]float64{8, 2, 1}, values())
		r = s.get(t, "/?status=404", "several")
		require.Equal(t, http.StatusNotFound, r.status)
		require.Equal(t, `"one";r=0;t=3600`, r.rateLimit, "the take after binds now")
		require.Equal(t, [3]float64{7, 2, 0}, values())
		// one is spent: its check denies, and nothing is taken from the
		// others.
		r = s.get(t, "/", "several")
		require.Equal(t, http.StatusTooManyRequests, r.status)
		require.Equal(t, "3600", r.retryAfter)
		require.Equal(t, [3]float64{7, 2, 0}, values())
		require.Equal(t, int64(3), p.entered.Load())
	})

	t.Run("Errors", func(t *testing.T) {
		_, err := httplimit.New(limiter, "three", userKey, &httplimit.Options{Mode: httplimit.TakeAfter})
		require.ErrorContains(t, err, `limit "three" has Mode TakeAfter but no Charge`)
		_, err = httplimit.New(limiter, "three", userKey, &httplimit.Options{Charge: failed, Mode: 7})
		require.ErrorContains(t, err, "Mode 7, which is neither Refund nor TakeAfter")
		_, err = httplimit.NewAll(limiter, []httplimit.Rule{{Name: "three", Key: userKey}}, &httplimit.Options{Charge: failed})
		require.ErrorContains(t, err, "set the Charge and Mode of each Rule")
		_, err = httplimit.NewAll(limiter, []httplimit.Rule{{Name: "three", Key: userKey, Mode: httplimit.TakeAfter}}, nil)
		require.ErrorContains(t, err, "no Charge")

		// Tx has no response to charge by.
		lim := limit("three", &httplimit.Options{Charge: failed})
		w := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		var zero TTx
		ok, err := lim.Tx(w, req, zero)
		require.False(t, ok)
		require.ErrorContains(t, err, "Tx cannot apply a limit with a Charge")
		require.Empty(t, w.Header())

		// A key that cannot be found is answered by Options.Error, as
		// without Charge, and nothing reaches the handler.
		p := &probe{}
		s := serve(t, lim.Handler(p))
		require.Equal(t, http.StatusInternalServerError, s.get(t, "/", "").status)
		require.Zero(t, p.entered.Load())
	})
}

// A refund that fails after the handler is logged, and the response goes
// out as the handler wrote it.
func TestOutcomeSettleErrorIsLogged(t *testing.T) {
	db := openSQLite(t)
	limiter, err := txlimit.New(sqlitestore.New(db), map[string]txlimit.Config{
		"login": {Kind: txlimit.TokenBucket, Rate: 3, Period: time.Hour},
	}, &txlimit.Options{Clock: func() time.Time { return t0 }})
	require.NoError(t, err)
	var logs bytes.Buffer
	lim, err := httplimit.New(limiter, "login", userKey, &httplimit.Options{
		Charge: httplimit.Statuses(http.StatusUnauthorized),
		Logger: slog.New(slog.NewJSONHandler(&logs, nil)),
		// Error answers errors before the handler; the Logger still gets
		// those after it.
		Error: func(w http.ResponseWriter, r *http.Request, err error) { http.Error(w, "no", http.StatusBadGateway) },
	})
	require.NoError(t, err)
	s := serve(t, lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := db.Close(); err != nil { // the database goes away while the handler runs
			t.Error(err)
		}
		_, _ = io.WriteString(w, "welcome\n")
	})))
	r := s.get(t, "/login", "alice")
	require.Equal(t, http.StatusOK, r.status)
	require.Equal(t, `"login";r=2;t=1200`, r.rateLimit)
	var entry map[string]any
	require.NoError(t, json.Unmarshal(logs.Bytes(), &entry), logs.String())
	require.Equal(t, "ERROR", entry["level"])
	require.Equal(t, "httplimit: could not give back the tokens of a response not charged after the handler; the response went out as the handler wrote it", entry["msg"])
	require.Equal(t, "login", entry["limit"])
	require.Equal(t, "/login", entry["path"])
	require.EqualValues(t, 200, entry["status"])
	require.Contains(t, entry["err"], "closed")
}
