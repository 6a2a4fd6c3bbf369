package httplimit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/httplimit"
)

// runDeployments tests what a real deployment needs: several limits per
// request, clients behind proxies, IPv6 networks, and errors that are
// logged rather than shown.
func runDeployments[TTx any](t *testing.T, b backend[TTx]) {
	ctx := context.Background()
	clk := &clock{t: t0}
	limiter, err := txlimit.New(b.store, map[string]txlimit.Config{
		"perUser": {Kind: txlimit.TokenBucket, Rate: 3, Period: time.Hour},
		"global":  {Kind: txlimit.TokenBucket, Rate: 4, Period: time.Hour},
		"perIP":   {Kind: txlimit.TokenBucket, Rate: 5, Period: time.Hour},
		"proxied": {Kind: txlimit.TokenBucket, Rate: 2, Period: time.Hour},
		"slowest": {Kind: txlimit.TokenBucket, Rate: 1, Period: 2 * time.Hour},
		"logged":  {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Hour},
		"glacial": {Kind: txlimit.TokenBucket, Rate: 1e-300, Period: time.Second, Capacity: 1},
	}, &txlimit.Options{Clock: clk.Now})
	require.NoError(t, err)
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok")) })
	value := func(name, key string) float64 {
		t.Helper()
		res, err := limiter.Check(ctx, name, key, txlimit.Count(0))
		require.NoError(t, err)
		return res.Remaining
	}
	global := func(*http.Request) (string, error) { return "", nil }

	t.Run("SeveralLimitsAllOrNone", func(t *testing.T) {
		lim, err := httplimit.NewAll(limiter, []httplimit.Rule{
			{Name: "perUser", Key: userKey},
			{Name: "global", Key: global},
		}, nil)
		require.NoError(t, err)
		h := lim.Handler(ok)
		// Granted: the fields are those of the limit with the fewest
		// requests left, perUser while alice has fewer of her own than
		// everyone has together, then global.
		for _, step := range []struct{ user, field, policy string }{
			{"alice", `"perUser";r=2;t=1200`, `"perUser";q=3;w=3600`},
			{"alice", `"perUser";r=1;t=1200`, `"perUser";q=3;w=3600`},
			{"bob", `"global";r=1;t=900`, `"global";q=4;w=3600`},
			{"carol", `"global";r=0;t=900`, `"global";q=4;w=3600`},
		} {
			w := get(t, h, "/", step.user)
			require.Equal(t, http.StatusOK, w.Code, step.user)
			require.Equal(t, step.field, w.Header().Get("RateLimit"), step.user)
			require.Equal(t, step.policy, w.Header().Get("RateLimit-Policy"), step.user)
		}
		// The second limit denies; the first, which alone would grant,
		// is left as it was.
		require.Equal(t, 2.0, value("perUser", "carol"))
		w := get(t, h, "/", "carol")
		require.Equal(t, http.StatusTooManyRequests, w.Code)
		require.Equal(t, `"global";r=0;t=900`, w.Header().Get("RateLimit"))
		require.Equal(t, "900", w.Header().Get("Retry-After"))
		var problem map[string]any
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &problem))
		require.Equal(t, []any{"global"}, problem["violated-policies"])
		require.Equal(t, 2.0, value("perUser", "carol"), "nothing taken from perUser")
		require.Equal(t, 0.0, value("global", ""))

		// The same in the handler's own transaction (LimitAllTx).
		txh := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			err := b.inTx(r.Context(), func(tx TTx) error {
				ok, err := lim.Tx(w, r, tx)
				if err == nil && ok {
					_, _ = w.Write([]byte("done"))
				}
				return err
			})
			require.NoError(t, err)
		})
		w = get(t, txh, "/", "dave")
		require.Equal(t, http.StatusTooManyRequests, w.Code)
		require.Equal(t, 3.0, value("perUser", "dave"), "nothing taken from perUser")

		// Both deny: the one with the longer wait binds.
		both, err := httplimit.NewAll(limiter, []httplimit.Rule{
			{Name: "global", Key: global},
			{Name: "slowest", Key: userKey, Policy: "per user, slow"},
		}, nil)
		require.NoError(t, err)
		clk.Advance(16 * time.Minute) // global gains a token and a fifteenth
		w = get(t, both.Handler(ok), "/", "erin")
		require.Equal(t, http.StatusOK, w.Code)
		require.Equal(t, `"per user, slow";r=0;t=7200`, w.Header().Get("RateLimit"),
			"0 whole requests left in both: the one whose next token is furthest binds")
		w = get(t, both.Handler(ok), "/", "erin")
		require.Equal(t, http.StatusTooManyRequests, w.Code)
		require.Equal(t, `"per user, slow";r=0;t=7200`, w.Header().Get("RateLimit"))
		require.Equal(t, "7200", w.Header().Get("Retry-After"))
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &problem))
		require.Equal(t, []any{"global", "per user, slow"}, problem["violated-policies"])

		// A custom Denied gets the binding result.
		var got txlimit.Result
		custom, err := httplimit.NewAll(limiter, []httplimit.Rule{
			{Name: "global", Key: global},
			{Name: "slowest", Key: userKey},
		}, &httplimit.Options{Denied: func(w http.ResponseWriter, r *http.Request, res txlimit.Result) {
			got = res
			w.WriteHeader(http.StatusServiceUnavailable)
		}})
		require.NoError(t, err)
		require.Equal(t, http.StatusServiceUnavailable, get(t, custom.Handler(ok), "/", "erin").Code)
		require.Equal(t, "slowest", got.Name)
		require.InDelta(t, 7200, got.RetryAfter.Seconds(), 0.001)

		_, err = httplimit.NewAll(limiter, nil, nil)
		require.ErrorContains(t, err, "at least one Rule")
		_, err = httplimit.NewAll(limiter, []httplimit.Rule{{Name: "global", Key: global}}, &httplimit.Options{Policy: "x"})
		require.ErrorContains(t, err, "Policy of each Rule")
		_, err = httplimit.NewAll(limiter, []httplimit.Rule{{Name: "global", Key: global}, {Name: "perUser"}}, nil)
		require.ErrorContains(t, err, `KeyFunc of limit "perUser" is nil`)
		_, err = httplimit.NewAll(limiter, []httplimit.Rule{{Name: "global", Key: global}, {Name: "perUser", Key: userKey, Policy: "global"}}, nil)
		require.ErrorContains(t, err, "rules 0 and 1 have the policy name")
	})

	t.Run("WaitBeyondMaxWait", func(t *testing.T) {
		// A wait no Duration holds is the limiter's most (2^62 ns), and
		// Retry-After says so in whole seconds, rounded up: never 1.
		lim, err := httplimit.New(limiter, "glacial", userKey, nil)
		require.NoError(t, err)
		h := lim.Handler(ok)
		require.Equal(t, http.StatusOK, get(t, h, "/", "frank").Code)
		w := get(t, h, "/", "frank")
		require.Equal(t, http.StatusTooManyRequests, w.Code)
		require.Equal(t, "4611686019", w.Header().Get("Retry-After"))
		require.Equal(t, `"glacial";r=0;t=4611686018`, w.Header().Get("RateLimit"))
	})

	t.Run("IPv6NetworkSharesOneLimit", func(t *testing.T) {
		lim, err := httplimit.New(limiter, "perIP", httplimit.RemoteAddrKey, nil)
		require.NoError(t, err)
		h := lim.Handler(ok)
		// One host with a /64 tries 40 addresses of it: together they get
		// the 5 requests one address would.
		granted := 0
		for i := 1; i <= 40; i++ {
			req := httptest.NewRequest(http.MethodGet, "/", nil)
			req.RemoteAddr = fmt.Sprintf("[2001:db8:aa:bb:%x::%x]:443", i*977, i)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			if w.Code == http.StatusOK {
				granted++
			} else {
				require.Equal(t, http.StatusTooManyRequests, w.Code)
			}
		}
		require.Equal(t, 5, granted)
		require.Equal(t, 0.0, value("perIP", "2001:db8:aa:bb::/64"))
		// The next /64 is another client.
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.RemoteAddr = "[2001:db8:aa:bc::1]:443"
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		require.Equal(t, http.StatusOK, w.Code)
		require.Equal(t, 4.0, value("perIP", "2001:db8:aa:bc::/64"))
	})

	t.Run("ClientsBehindTrustedProxies", func(t *testing.T) {
		key, err := httplimit.ClientIPKey(httplimit.ClientIP{
			TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		})
		require.NoError(t, err)
		lim, err := httplimit.New(limiter, "proxied", key, nil)
		require.NoError(t, err)
		h := lim.Handler(ok)
		send := func(peer, xff string) int {
			req := httptest.NewRequest(http.MethodGet, "/", nil)
			req.RemoteAddr = peer
			req.Header.Set("X-Forwarded-For", xff)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			return w.Code
		}
		// A client that reaches the server directly and writes a new
		// X-Forwarded-For each time is keyed by its own address.
		for i, want := range []int{200, 200, 429, 429} {
			require.Equal(t, want, send("198.51.100.7:5000", fmt.Sprintf("203.0.113.%d", i+1)), i)
		}
		require.Equal(t, 0.0, value("proxied", "198.51.100.7"))
		require.Equal(t, 2.0, value("proxied", "203.0.113.1"), "the spoofed address was never charged")
		// Through two proxies of ours: the client is the first address
		// from the right that is not ours, whatever it put to its left.
		require.Equal(t, 200, send("10.0.0.2:80", "1.1.1.1, 192.0.2.44, 10.0.0.9"))
		require.Equal(t, 200, send("10.0.0.3:80", "8.8.8.8, 192.0.2.44, 10.0.0.1"))
		require.Equal(t, 429, send("10.0.0.2:80", "192.0.2.45, 192.0.2.44, 10.0.0.9"))
		require.Equal(t, 0.0, value("proxied", "192.0.2.44"))
		require.Equal(t, 2.0, value("proxied", "1.1.1.1"))
		require.Equal(t, 2.0, value("proxied", "10.0.0.2"), "the proxies were never charged")
	})

	t.Run("DefaultErrorLogsWhatItHides", func(t *testing.T) {
		var logs bytes.Buffer
		logger := slog.New(slog.NewJSONHandler(&logs, nil))
		lim, err := httplimit.New(limiter, "logged", userKey, &httplimit.Options{
			Logger: logger,
			Count: func(r *http.Request) float64 {
				if r.URL.Query().Has("big") {
					return 2 // above Capacity: an *InvalidError
				}
				return 1
			},
		})
		require.NoError(t, err)
		h := lim.Handler(ok)
		entry := func() map[string]any {
			t.Helper()
			var m map[string]any
			require.NoError(t, json.Unmarshal(logs.Bytes(), &m), logs.String())
			logs.Reset()
			return m
		}

		// The store fails: the request's context is cancelled before the
		// transaction begins.
		req := httptest.NewRequest(http.MethodPost, "/send", nil)
		req.Header.Set("X-Test-User", "frank")
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		w := httptest.NewRecorder()
		authenticate(h).ServeHTTP(w, req.WithContext(cctx))
		require.Equal(t, http.StatusInternalServerError, w.Code)
		require.Equal(t, "Internal Server Error\n", w.Body.String(), "the client sees no error")
		require.Equal(t, "text/plain; charset=utf-8", w.Header().Get("Content-Type"))
		m := entry()
		require.Equal(t, "ERROR", m["level"])
		require.Equal(t, "POST", m["method"])
		require.Equal(t, "/send", m["path"])
		require.Equal(t, []any{"logged"}, m["limits"])
		require.Contains(t, m["err"], "context canceled")

		w = get(t, h, "/send?big=1", "frank")
		require.Equal(t, http.StatusInternalServerError, w.Code)
		require.NotContains(t, w.Body.String(), "Capacity")
		require.Contains(t, entry()["err"], "exceeds Capacity")

		w = get(t, h, "/send", "")
		require.Equal(t, http.StatusInternalServerError, w.Code)
		require.Equal(t, "no user", entry()["err"])

		// The value endpoint logs the same way.
		vh, err := httplimit.ValueHandler(limiter, "logged", userKey, &httplimit.Options{Logger: logger})
		require.NoError(t, err)
		require.Equal(t, http.StatusInternalServerError, get(t, vh, "/limit", "").Code)
		require.Equal(t, "/limit", entry()["path"])

		// Without a Logger, slog.Default gets it.
		prev := slog.Default()
		t.Cleanup(func() { slog.SetDefault(prev) })
		slog.SetDefault(logger)
		plain, err := httplimit.New(limiter, "logged", userKey, nil)
		require.NoError(t, err)
		require.Equal(t, http.StatusInternalServerError, get(t, plain.Handler(ok), "/x", "").Code)
		require.True(t, strings.Contains(logs.String(), `"path":"/x"`), logs.String())
	})
}
