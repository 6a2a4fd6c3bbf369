package httplimit_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/httplimit"
	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/pgstore"
	"github.com/txlimit/txlimit/sqlitestore"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// backend is one store with a way to run a handler's own transaction.
type backend[TTx any] struct {
	store driver.Store[TTx]
	// inTx runs fn in a new transaction, committing when fn returns nil.
	inTx func(ctx context.Context, fn func(tx TTx) error) error
}

func TestPostgres(t *testing.T) {
	pool := testdb.Pool(t, testdb.Schema(t), pgx.QueryExecModeCacheStatement, 8)
	b := backend[pgx.Tx]{
		store: pgstore.New(pool),
		inTx: func(ctx context.Context, fn func(pgx.Tx) error) error {
			return pgx.BeginFunc(ctx, pool, fn)
		},
	}
	run(t, b)
	runDeployments(t, b)
}

func TestSQLite(t *testing.T) {
	db, err := sql.Open("sqlite", "file:"+testdb.SQLitePath(t)+
		"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	require.NoError(t, migrations.Up(context.Background(), db, migrations.SQLite))
	store := sqlitestore.New(db)
	b := backend[*sql.Tx]{
		store: store,
		inTx: func(ctx context.Context, fn func(*sql.Tx) error) error {
			return driver.OpsOf[*sql.Tx](store).InTx(ctx, false, fn)
		},
	}
	run(t, b)
	runDeployments(t, b)
}

// userKey is what an application's authentication middleware would give
// the limit: the user the server has established. The tests stand in for
// that middleware with a header only they set.
type userKeyType struct{}

func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := context.WithValue(r.Context(), userKeyType{}, r.Header.Get("X-Test-User"))
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

func userKey(r *http.Request) (string, error) {
	u, _ := r.Context().Value(userKeyType{}).(string)
	if u == "" {
		return "", errors.New("no user")
	}
	return u, nil
}

func get(t *testing.T, h http.Handler, target, user string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, target, nil)
	if user != "" {
		req.Header.Set("X-Test-User", user)
	}
	w := httptest.NewRecorder()
	authenticate(h).ServeHTTP(w, req)
	return w
}

func run[TTx any](t *testing.T, b backend[TTx]) {
	ctx := context.Background()
	clk := &clock{t: t0}
	limiter, err := txlimit.New(b.store, map[string]txlimit.Config{
		"api":     {Kind: txlimit.TokenBucket, Rate: 1, Period: 1200 * time.Millisecond, Capacity: 3},
		"slow":    {Kind: txlimit.TokenBucket, Rate: 1, Period: 3 * time.Second},
		"fw":      {Kind: txlimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0.Add(-15 * time.Second)},
		"tx":      {Kind: txlimit.TokenBucket, Rate: 2, Period: time.Hour},
		"ui":      {Kind: txlimit.TokenBucket, Rate: 5, Period: time.Minute, Shards: 2, ReportRemaining: true},
		"sharded": {Kind: txlimit.TokenBucket, Rate: 5, Period: time.Minute, Shards: 2},
		"month":   {Kind: txlimit.Monthly, Rate: 100, Zone: "Europe/Berlin"},
		"sliding": {Kind: txlimit.SlidingWindow, Rate: 10, Period: time.Minute, Start: t0},
	}, &txlimit.Options{Clock: clk.Now})
	require.NoError(t, err)
	var served int
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served++
		_, _ = w.Write([]byte("ok"))
	})

	t.Run("HeadersOnEveryResponse", func(t *testing.T) {
		lim, err := httplimit.New(limiter, "api", userKey, nil)
		require.NoError(t, err)
		h := lim.Handler(ok)
		served = 0
		// A token every 1.2s: over 2 whole seconds, at most 1 is added.
		const policy = `"api";q=1;w=2`
		for _, r := range []string{"2", "1", "0"} {
			w := get(t, h, "/", "alice")
			require.Equal(t, http.StatusOK, w.Code)
			require.Equal(t, policy, w.Header().Get("RateLimit-Policy"))
			// The next token is 1.2s away: t rounds down to 1.
			require.Equal(t, `"api";r=`+r+`;t=1`, w.Header().Get("RateLimit"))
			require.Empty(t, w.Header().Get("Retry-After"))
		}
		w := get(t, h, "/", "alice")
		require.Equal(t, http.StatusTooManyRequests, w.Code)
		require.Equal(t, 3, served, "the denied request never reached the handler")
		require.Equal(t, "2", w.Header().Get("Retry-After"), "1.2s rounds up")
		require.Equal(t, policy, w.Header().Get("RateLimit-Policy"))
		require.Equal(t, `"api";r=0;t=1`, w.Header().Get("RateLimit"))
		require.Equal(t, "application/problem+json", w.Header().Get("Content-Type"))
		var problem map[string]any
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &problem))
		require.Equal(t, "https://iana.org/assignments/http-problem-types#quota-exceeded", problem["type"])
		require.EqualValues(t, 429, problem["status"])
		require.Equal(t, []any{"api"}, problem["violated-policies"])

		// Another user has a limit of their own.
		w = get(t, h, "/", "bob")
		require.Equal(t, http.StatusOK, w.Code)
		require.Equal(t, `"api";r=2;t=1`, w.Header().Get("RateLimit"))

		// Waiting Retry-After is never early.
		clk.Advance(1200 * time.Millisecond)
		w = get(t, h, "/", "alice")
		require.Equal(t, http.StatusOK, w.Code)
		require.Equal(t, `"api";r=0;t=1`, w.Header().Get("RateLimit"))
	})

	t.Run("RetryAfterOfWholeSeconds", func(t *testing.T) {
		lim, err := httplimit.New(limiter, "slow", userKey, nil)
		require.NoError(t, err)
		h := lim.Handler(ok)
		w := get(t, h, "/", "alice")
		require.Equal(t, http.StatusOK, w.Code)
		require.Equal(t, `"slow";q=1;w=3`, w.Header().Get("RateLimit-Policy"))
		require.Equal(t, `"slow";r=0;t=3`, w.Header().Get("RateLimit"))
		w = get(t, h, "/", "alice")
		require.Equal(t, http.StatusTooManyRequests, w.Code)
		require.Equal(t, "3", w.Header().Get("Retry-After"), "exactly 3s stays 3")
		clk.Advance(2999 * time.Millisecond)
		w = get(t, h, "/", "alice")
		require.Equal(t, http.StatusTooManyRequests, w.Code)
		require.Equal(t, "1", w.Header().Get("Retry-After"), "1ms rounds up to a whole second")
		require.Equal(t, `"slow";r=0;t=0`, w.Header().Get("RateLimit"))
		clk.Advance(time.Millisecond)
		require.Equal(t, http.StatusOK, get(t, h, "/", "alice").Code)
	})

	t.Run("FixedWindow", func(t *testing.T) {
		// Windows start at :45; the clock reads :00 plus what the tests
		// before have advanced.
		lim, err := httplimit.New(limiter, "fw", userKey, &httplimit.Options{
			Policy: `per "minute"`,
			Count:  func(r *http.Request) float64 { return 4 },
		})
		require.NoError(t, err)
		h := lim.Handler(ok)
		untilWindow := t0.Add(45*time.Second).Sub(clk.Now()) / time.Second
		w := get(t, h, "/", "alice")
		require.Equal(t, http.StatusOK, w.Code)
		require.Equal(t, `"per \"minute\"";q=10;w=60`, w.Header().Get("RateLimit-Policy"))
		require.Equal(t, `"per \"minute\"";r=6;t=`+itoa(int64(untilWindow)), w.Header().Get("RateLimit"))
		require.Equal(t, http.StatusOK, get(t, h, "/", "alice").Code)
		w = get(t, h, "/", "alice")
		require.Equal(t, http.StatusTooManyRequests, w.Code)
		require.Equal(t, `"per \"minute\"";r=2;t=`+itoa(int64(untilWindow)), w.Header().Get("RateLimit"))
	})

	t.Run("HandlerTransaction", func(t *testing.T) {
		lim, err := httplimit.New(limiter, "tx", userKey, nil)
		require.NoError(t, err)
		// The handler's own work fails when asked to, after the limit has
		// taken its token in the same transaction.
		errWork := errors.New("the business write failed")
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			err := b.inTx(r.Context(), func(tx TTx) error {
				ok, err := lim.Tx(w, r, tx)
				if err != nil || !ok {
					return err
				}
				if r.URL.Query().Get("fail") != "" {
					return errWork
				}
				_, _ = w.Write([]byte("done"))
				return nil
			})
			if errors.Is(err, errWork) {
				http.Error(w, "failed", http.StatusConflict)
			} else if err != nil {
				http.Error(w, "error", http.StatusInternalServerError)
			}
		})
		value := func(user string) float64 {
			res, err := limiter.Check(ctx, "tx", user, txlimit.Count(0))
			require.NoError(t, err)
			return res.Remaining
		}
		for range 3 {
			w := get(t, h, "/?fail=1", "carol")
			require.Equal(t, http.StatusConflict, w.Code)
			require.Equal(t, `"tx";r=1;t=1800`, w.Header().Get("RateLimit"), "the call saw its own token taken")
			require.Equal(t, 2.0, value("carol"), "the rollback gave the token back")
		}
		w := get(t, h, "/", "carol")
		require.Equal(t, http.StatusOK, w.Code)
		require.Equal(t, "done", w.Body.String())
		require.Equal(t, 1.0, value("carol"))
		require.Equal(t, http.StatusOK, get(t, h, "/", "carol").Code)
		w = get(t, h, "/", "carol")
		require.Equal(t, http.StatusTooManyRequests, w.Code)
		require.Equal(t, "1800", w.Header().Get("Retry-After"))
		require.Equal(t, 0.0, value("carol"))
	})

	t.Run("CalendarAndSlidingWindows", func(t *testing.T) {
		// A calendar month has no fixed period: the policy gives its quota
		// alone, and t counts down to the next month in Berlin.
		lim, err := httplimit.New(limiter, "month", userKey, nil)
		require.NoError(t, err)
		w := get(t, lim.Handler(ok), "/", "alice")
		require.Equal(t, http.StatusOK, w.Code)
		require.Equal(t, `"month";q=100`, w.Header().Get("RateLimit-Policy"))
		berlin, err := time.LoadLocation("Europe/Berlin")
		require.NoError(t, err)
		local := clk.Now().In(berlin)
		next := time.Date(local.Year(), local.Month()+1, 1, 0, 0, 0, 0, berlin)
		require.Equal(t, `"month";r=99;t=`+itoa(int64(next.Sub(clk.Now())/time.Second)), w.Header().Get("RateLimit"))
		vh, err := httplimit.ValueHandler(limiter, "month", userKey, nil)
		require.NoError(t, err)
		w = get(t, vh, "/", "alice")
		var v httplimit.Value
		require.NoError(t, json.NewDecoder(w.Body).Decode(&v))
		require.Equal(t, httplimit.Value{
			Name: "month", Kind: "fixedWindow", Calendar: "month", Zone: "Europe/Berlin", Value: 99, Capacity: 100, Rate: 100,
			ServerTime: clk.Now().UTC().Format(time.RFC3339Nano), Shards: 1,
		}, v)

		// A sliding window: a policy of Rate per Period, and r and t from
		// the weighted count.
		lim, err = httplimit.New(limiter, "sliding", userKey, &httplimit.Options{Count: func(*http.Request) float64 { return 10 }})
		require.NoError(t, err)
		w = get(t, lim.Handler(ok), "/", "alice")
		require.Equal(t, http.StatusOK, w.Code)
		require.Equal(t, `"sliding";q=10;w=60`, w.Header().Get("RateLimit-Policy"))
		require.Equal(t, `"sliding";r=0;t=`, w.Header().Get("RateLimit")[:len(`"sliding";r=0;t=`)])
		require.Equal(t, http.StatusTooManyRequests, get(t, lim.Handler(ok), "/", "alice").Code)
	})

	t.Run("ValueHandlerShowsTheCallersLimitOnly", func(t *testing.T) {
		lim, err := httplimit.New(limiter, "ui", userKey, nil)
		require.NoError(t, err)
		vh, err := httplimit.ValueHandler(limiter, "ui", userKey, nil)
		require.NoError(t, err)
		// The remaining count of a sharded limit covers every shard, on
		// PostgreSQL's one-free-shard path too (the second call).
		for _, r := range []string{"4", "3"} {
			w := get(t, lim.Handler(ok), "/", "alice")
			require.Equal(t, http.StatusOK, w.Code)
			require.Equal(t, `"ui";r=`+r+`;t=12`, w.Header().Get("RateLimit"))
		}
		read := func(target, user string) httplimit.Value {
			t.Helper()
			w := get(t, vh, target, user)
			require.Equal(t, http.StatusOK, w.Code)
			require.Equal(t, "application/json", w.Header().Get("Content-Type"))
			require.Equal(t, "no-store", w.Header().Get("Cache-Control"))
			var v httplimit.Value
			dec := json.NewDecoder(w.Body)
			dec.DisallowUnknownFields()
			require.NoError(t, dec.Decode(&v))
			return v
		}
		v := read("/", "alice")
		require.Equal(t, httplimit.Value{
			Name: "ui", Kind: "tokenBucket", Value: 3, Capacity: 5, Rate: 5, PeriodMs: 60000,
			ServerTime: clk.Now().UTC().Format(time.RFC3339Nano), Shards: 2,
		}, v)
		// Bob asks for Alice's limit in every way a client can; the server
		// answers with his own.
		for _, target := range []string{"/?key=alice", "/?user=alice", "/alice"} {
			v = read(target, "bob")
			require.Equal(t, 5.0, v.Value, target)
		}
		// Time runs: the value is projected to the server's clock. (A
		// minute refills it whichever shards the two calls took.)
		clk.Advance(time.Minute)
		v = read("/", "alice")
		require.Equal(t, 5.0, v.Value)
		at, err := time.Parse(time.RFC3339Nano, v.ServerTime)
		require.NoError(t, err)
		require.True(t, at.Equal(clk.Now()))

		// No user: the key function fails and the default answer is 500.
		require.Equal(t, http.StatusInternalServerError, get(t, vh, "/", "").Code)
		req := httptest.NewRequest(http.MethodPost, "/", nil)
		w := httptest.NewRecorder()
		vh.ServeHTTP(w, req)
		require.Equal(t, http.StatusMethodNotAllowed, w.Code)
	})

	t.Run("Errors", func(t *testing.T) {
		var got error
		lim, err := httplimit.New(limiter, "api", userKey, &httplimit.Options{
			Error: func(w http.ResponseWriter, r *http.Request, err error) {
				got = err
				http.Error(w, "who are you?", http.StatusUnauthorized)
			},
		})
		require.NoError(t, err)
		w := get(t, lim.Handler(ok), "/", "")
		require.Equal(t, http.StatusUnauthorized, w.Code)
		require.EqualError(t, got, "no user")
		require.Empty(t, w.Header().Get("RateLimit"), "no limit was applied")

		// A count the limit could never grant is an error, not a denial.
		big, err := httplimit.New(limiter, "api", userKey, &httplimit.Options{Count: func(*http.Request) float64 { return 4 }})
		require.NoError(t, err)
		require.Equal(t, http.StatusInternalServerError, get(t, big.Handler(ok), "/", "dave").Code)

		_, err = httplimit.New(limiter, "nope", userKey, nil)
		require.ErrorContains(t, err, `"nope" is not a limit`)
		_, err = httplimit.New(limiter, "api", nil, nil)
		require.ErrorContains(t, err, "KeyFunc of limit \"api\" is nil")
		_, err = httplimit.New(limiter, "api", userKey, &httplimit.Options{Policy: "café"})
		require.ErrorContains(t, err, "printable ASCII")
		_, err = httplimit.ValueHandler(limiter, "nope", userKey, nil)
		require.Error(t, err)

		// A sharded limit without ReportRemaining could not fill in r on
		// PostgreSQL's one-free-shard path: refused, naming the fix, by
		// New and by NewAll. Its value needs no such thing.
		_, err = httplimit.New(limiter, "sharded", userKey, nil)
		require.ErrorContains(t, err, `limit "sharded" has 2 shards but not ReportRemaining`)
		require.ErrorContains(t, err, "set ReportRemaining: true in its txlimit.Config")
		_, err = httplimit.NewAll(limiter, []httplimit.Rule{{Name: "api", Key: userKey}, {Name: "sharded", Key: userKey}}, nil)
		require.ErrorContains(t, err, "set ReportRemaining: true")
		_, err = httplimit.ValueHandler(limiter, "sharded", userKey, nil)
		require.NoError(t, err)
	})

	t.Run("APausedKey", func(t *testing.T) {
		// A pause (an upstream's Retry-After) denies the key with its
		// Retry-After, and RateLimit says no quota until it ends, whatever
		// the tokens; another key is served.
		lim, err := httplimit.New(limiter, "fw", userKey, nil)
		require.NoError(t, err)
		until, err := httplimit.RetryAfter("90", clk.Now())
		require.NoError(t, err)
		require.NoError(t, limiter.Pause(ctx, "fw", "paused-user", until))
		w := get(t, lim.Handler(ok), "/", "paused-user")
		require.Equal(t, http.StatusTooManyRequests, w.Code)
		require.Equal(t, "90", w.Header().Get("Retry-After"))
		require.Equal(t, `"fw";r=0;t=90`, w.Header().Get("RateLimit"))
		require.Equal(t, http.StatusOK, get(t, lim.Handler(ok), "/", "other-user").Code)
		clk.Advance(90 * time.Second)
		w = get(t, lim.Handler(ok), "/", "paused-user")
		require.Equal(t, http.StatusOK, w.Code)
		require.Empty(t, w.Header().Get("Retry-After"))
	})
}

func itoa(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}

func TestRemoteAddrKey(t *testing.T) {
	for addr, want := range map[string]string{
		"192.0.2.1:1234":          "192.0.2.1",
		"[2001:db8::1]:443":       "2001:db8::/64",
		"[::ffff:192.0.2.7]:80":   "192.0.2.7",
		"[fe80::1%eth0]:80":       "fe80::/64",
		"198.51.100.3":            "198.51.100.3",
		"[2001:DB8:0:0::2]:65535": "2001:db8::/64",
		"[2001:db8:0:1::2]:65535": "2001:db8:0:1::/64",
	} {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.RemoteAddr = addr
		req.Header.Set("X-Forwarded-For", "203.0.113.9")
		req.Header.Set("X-Real-Ip", "203.0.113.9")
		got, err := httplimit.RemoteAddrKey(req)
		require.NoError(t, err, addr)
		require.Equal(t, want, got, "%s: headers are not trusted", addr)
	}
	for _, bad := range []string{"", "example.com:80", "@"} {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.RemoteAddr = bad
		_, err := httplimit.RemoteAddrKey(req)
		require.Error(t, err, bad)
	}
}

// A read that the limiter answered without the database has no value to
// show: ValueHandler answers it as an error rather than a value of 0.
func TestValueHandlerFailedOpen(t *testing.T) {
	db, err := sql.Open("sqlite", "file:"+testdb.SQLitePath(t))
	require.NoError(t, err)
	require.NoError(t, migrations.Up(context.Background(), db, migrations.SQLite))
	var observed error
	limiter, err := txlimit.New(sqlitestore.New(db), map[string]txlimit.Config{
		"ui": {Kind: txlimit.TokenBucket, Rate: 5, Period: time.Minute},
	}, &txlimit.Options{FailOpen: true, Observer: func(_ context.Context, e txlimit.Event) { observed = e.Err }})
	require.NoError(t, err)
	var got error
	vh, err := httplimit.ValueHandler(limiter, "ui", userKey, &httplimit.Options{
		Error: func(w http.ResponseWriter, r *http.Request, err error) {
			got = err
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
		},
	})
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, get(t, vh, "/", "alice").Code)
	require.NoError(t, db.Close()) // the database goes away
	w := get(t, vh, "/", "alice")
	require.Equal(t, http.StatusServiceUnavailable, w.Code)
	require.Error(t, observed, "the store failed")
	require.ErrorContains(t, got, "failed open")
}
