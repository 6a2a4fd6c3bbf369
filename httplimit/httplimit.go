// Package httplimit applies a txlimit limit to HTTP requests, as net/http
// middleware or from inside a handler's own transaction, and answers with the
// standard header fields: Retry-After on a 429, and RateLimit-Policy and
// RateLimit (draft-ietf-httpapi-ratelimit-headers-11) on every response.
//
//	lim, err := httplimit.New(limiter, "api", httplimit.RemoteAddrKey, nil)
//	…
//	mux.Handle("/api/", lim.Handler(apiHandler))
//
// # Keys
//
// The key of a request comes from a KeyFunc, which runs on the server. Key by
// what the server has established (the authenticated user, an API key it has
// checked, the peer address), never by a value the client picks freely: a
// client that chooses its key chooses its limit. RemoteAddrKey keys by the
// peer's IP address. Behind a reverse proxy every request comes from the
// proxy, and the client's address is in a header the proxy adds
// (X-Forwarded-For); write a KeyFunc that reads it only when every request
// reaches the server through a proxy you run, and take the address your proxy
// appended (the last one), not the first, which the client can forge.
// docs/http.md shows one.
//
// # Header fields
//
// Every response to a request the limit was applied to carries, for the
// policy name P (the limit's name unless Options.Policy says otherwise):
//
//	RateLimit-Policy: "P";q=<Rate per w, rounded down>;w=<Period in seconds, rounded up>
//	RateLimit: "P";r=<whole tokens left>;t=<seconds before another token>
//
// r is Result.Remaining rounded down (never below 0) and t is
// Result.NextToken rounded down, omitted when the limit is full; both err on
// the side of telling a client less than it has, never more. A denied
// request gets 429 Too Many Requests with Retry-After: Result.RetryAfter in
// whole seconds rounded up (1.2s → 2), so a client that waits that long is
// never early. The values are those of the call, which asks for them with
// txlimit.WithRemaining: on a sharded limit served from one free shard, the
// other shards count as last committed (Result.Remaining says more).
package httplimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/txlimit/txlimit"
)

// KeyFunc returns the limit key of a request. An error stops the request:
// Options.Error answers it.
type KeyFunc func(r *http.Request) (string, error)

// RemoteAddrKey keys a request by the IP address of its peer: the host of
// r.RemoteAddr, without the port, an IPv4 address mapped into IPv6 written as
// IPv4. It trusts no header. Behind a reverse proxy the peer is the proxy;
// see the package documentation.
func RemoteAddrKey(r *http.Request) (string, error) {
	host := r.RemoteAddr
	if h, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		host = h
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return "", fmt.Errorf("httplimit: RemoteAddr %q holds no IP address: %w", r.RemoteAddr, err)
	}
	return addr.Unmap().WithZone("").String(), nil
}

// Options configures a Limit. A nil *Options is the zero value: every field
// takes its default.
type Options struct {
	// Policy is the name the RateLimit and RateLimit-Policy fields give
	// the limit. It must be printable ASCII (the fields quote it as a
	// Structured Fields String). Defaults to the limit's name.
	Policy string
	// Count returns the number of tokens a request takes. Defaults to 1
	// for every request. A count the limit could never grant (above its
	// Capacity) is an error, answered by Error.
	Count func(r *http.Request) float64
	// Denied writes the response to a request the limit denied. When it
	// runs, Retry-After and the RateLimit fields are set on w. Defaults
	// to a 429 Too Many Requests with an application/problem+json body of
	// the "quota-exceeded" type of the draft (section 5.1).
	Denied func(w http.ResponseWriter, r *http.Request, res txlimit.Result)
	// Error writes the response when the key cannot be found or the limit
	// fails (the database is down, the count is invalid). Defaults to a
	// 500 Internal Server Error that does not show err to the client.
	Error func(w http.ResponseWriter, r *http.Request, err error)
}

// Limit applies the limit of one name to HTTP requests. It is safe for
// concurrent use.
type Limit[TTx any] struct {
	limiter    *txlimit.Limiter[TTx]
	name       string
	key        KeyFunc
	count      func(r *http.Request) float64
	denied     func(w http.ResponseWriter, r *http.Request, res txlimit.Result)
	fail       func(w http.ResponseWriter, r *http.Request, err error)
	policyName string
	policy     string // policyName quoted for the header fields
	header     string // the RateLimit-Policy field value
}

// New returns a Limit that applies the limit name of l, which l must have
// been given (txlimit.New), keyed by key. opts may be nil.
func New[TTx any](l *txlimit.Limiter[TTx], name string, key KeyFunc, opts *Options) (*Limit[TTx], error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	cfg, err := config(l, name, key)
	if err != nil {
		return nil, err
	}
	if o.Policy == "" {
		o.Policy = name
	}
	policy, err := quote(o.Policy)
	if err != nil {
		return nil, err
	}
	m := &Limit[TTx]{
		limiter: l, name: name, key: key,
		count: o.Count, denied: o.Denied, fail: o.Error,
		policyName: o.Policy, policy: policy,
	}
	if m.denied == nil {
		m.denied = m.problem
	}
	if m.fail == nil {
		m.fail = internalError
	}
	// w is the period in whole seconds, rounded up (the field has no
	// fractions), and q what the limit adds over w, rounded down: a client
	// that keeps to q per w keeps to the limit.
	w := max(1, int64(math.Ceil(cfg.Period.Seconds())))
	q := math.Floor(cfg.Rate * float64(time.Duration(w)*time.Second) / float64(cfg.Period))
	m.header = fmt.Sprintf("%s;q=%d;w=%d", policy, sfInteger(q), w)
	return m, nil
}

// config checks the arguments shared by New and ValueHandler.
func config[TTx any](l *txlimit.Limiter[TTx], name string, key KeyFunc) (txlimit.Config, error) {
	if l == nil {
		return txlimit.Config{}, errors.New("httplimit: the limiter is nil; pass the *txlimit.Limiter built with txlimit.New")
	}
	if key == nil {
		return txlimit.Config{}, errors.New("httplimit: the KeyFunc is nil; pass httplimit.RemoteAddrKey or a function that names the caller")
	}
	cfg, ok := l.Config(name)
	if !ok {
		return txlimit.Config{}, fmt.Errorf("httplimit: %q is not a limit of the limiter; give its Config to txlimit.New", name)
	}
	return cfg, nil
}

// Handler returns middleware around next: each request takes its tokens in
// a short transaction of its own (txlimit.Limiter.Limit) before next runs,
// and next runs only when the limit grants them. The tokens stay spent
// whatever next does; to spend them only when the handler's own work
// commits, call Tx from the handler instead.
func (m *Limit[TTx]) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, opts, err := m.request(r)
		var res txlimit.Result
		if err == nil {
			res, err = m.limiter.Limit(r.Context(), m.name, key, opts...)
		}
		if err != nil {
			m.fail(w, r, err)
			return
		}
		if m.respond(w, r, res) {
			next.ServeHTTP(w, r)
		}
	})
}

// Tx takes the request's tokens in tx, the handler's own transaction, so
// that they are spent if and only if tx commits. It sets the RateLimit
// fields on w and reports whether the handler should go on. On a denial it
// has written the response (Options.Denied) and returns false, and the
// handler should write nothing more; tx holds nothing to undo. On an error
// it writes nothing: roll tx back and answer the request.
//
// The fields describe the limit as this call left it. If tx then rolls
// back, the tokens come back and the client was told it had fewer than it
// has, which errs on the safe side.
func (m *Limit[TTx]) Tx(w http.ResponseWriter, r *http.Request, tx TTx) (bool, error) {
	key, opts, err := m.request(r)
	if err != nil {
		return false, err
	}
	res, err := m.limiter.LimitTx(r.Context(), tx, m.name, key, opts...)
	if err != nil {
		return false, err
	}
	return m.respond(w, r, res), nil
}

// request returns the key and options of r's call. WithRemaining: the
// header fields need Remaining on every path, sharded limits included.
func (m *Limit[TTx]) request(r *http.Request) (string, []txlimit.Option, error) {
	key, err := m.key(r)
	if err != nil {
		return "", nil, err
	}
	opts := []txlimit.Option{txlimit.WithRemaining()}
	if m.count != nil {
		opts = append(opts, txlimit.Count(m.count(r)))
	}
	return key, opts, nil
}

// respond sets the header fields of res on w and, for a denial, writes the
// response; it reports whether the request may go on.
func (m *Limit[TTx]) respond(w http.ResponseWriter, r *http.Request, res txlimit.Result) bool {
	h := w.Header()
	h.Set("RateLimit-Policy", m.header)
	field := fmt.Sprintf("%s;r=%d", m.policy, sfInteger(math.Floor(max(res.Remaining, 0))))
	if res.NextToken > 0 {
		t := int64(res.NextToken / time.Second)
		if !res.OK {
			// Retry-After must not end before the effective window.
			t = min(t, retrySeconds(res.RetryAfter))
		}
		field += ";t=" + strconv.FormatInt(t, 10)
	}
	h.Set("RateLimit", field)
	if res.OK {
		return true
	}
	h.Set("Retry-After", strconv.FormatInt(retrySeconds(res.RetryAfter), 10))
	m.denied(w, r, res)
	return false
}

// retrySeconds is d in whole seconds, rounded up, and at least 1: a client
// that waits that long is never early.
func retrySeconds(d time.Duration) int64 {
	return int64(max(1, (d+time.Second-1)/time.Second))
}

// problem is the default Denied: RFC 9457 problem details of the draft's
// quota-exceeded type.
func (m *Limit[TTx]) problem(w http.ResponseWriter, r *http.Request, res txlimit.Result) {
	body, _ := json.Marshal(map[string]any{
		"type":              "https://iana.org/assignments/http-problem-types#quota-exceeded",
		"title":             "Too Many Requests",
		"status":            http.StatusTooManyRequests,
		"detail":            fmt.Sprintf("Rate limit exceeded; retry after %s seconds.", w.Header().Get("Retry-After")),
		"violated-policies": []string{m.policyName},
	})
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = w.Write(append(body, '\n'))
}

func internalError(w http.ResponseWriter, r *http.Request, err error) {
	http.Error(w, http.StatusText(http.StatusInternalServerError), http.StatusInternalServerError)
}

// quote returns s as a Structured Fields String (RFC 9651, section 3.3.3).
func quote(s string) (string, error) {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c > 0x7e {
			return "", fmt.Errorf("httplimit: policy name %q is not printable ASCII, which the RateLimit fields require; set Options.Policy", s)
		}
		if c == '"' || c == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(c)
	}
	b.WriteByte('"')
	return b.String(), nil
}

// sfInteger clamps f to the range of a Structured Fields Integer (15
// digits).
func sfInteger(f float64) int64 {
	const most = 999_999_999_999_999
	return int64(min(max(f, 0), most))
}

// Value is the JSON document ValueHandler serves.
type Value struct {
	Name string `json:"name"`
	// Kind is "tokenBucket" or "fixedWindow".
	Kind string `json:"kind"`
	// Value is the tokens the limit holds at ServerTime, summed over all
	// shards; negative while reservations are outstanding.
	Value    float64 `json:"value"`
	Capacity float64 `json:"capacity"`
	// Rate tokens are added every PeriodMs milliseconds.
	Rate     float64 `json:"rate"`
	PeriodMs float64 `json:"periodMs"`
	// ServerTime is the clock reading Value was projected to, in RFC 3339
	// with nanoseconds, so that a front end can keep projecting it.
	ServerTime string `json:"serverTime"`
	Shards     int    `json:"shards"`
}

// ValueHandler returns a handler that answers GET with the current Value of
// the limit name for the key of the request, as JSON: what a front end needs
// to show the limit and count it down. The key comes from key, on the
// server, never from the request's parameters, so that one caller cannot
// read another's limit. Only opts.Error is used (for key and database
// errors); opts may be nil.
func ValueHandler[TTx any](l *txlimit.Limiter[TTx], name string, key KeyFunc, opts *Options) (http.Handler, error) {
	if _, err := config(l, name, key); err != nil {
		return nil, err
	}
	fail := internalError
	if opts != nil && opts.Error != nil {
		fail = opts.Error
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, http.StatusText(http.StatusMethodNotAllowed), http.StatusMethodNotAllowed)
			return
		}
		k, err := key(r)
		var snap txlimit.Snapshot
		if err == nil {
			snap, err = l.Value(r.Context(), name, k)
		}
		if err != nil {
			fail(w, r, err)
			return
		}
		kind := "tokenBucket"
		if snap.Config.Kind == txlimit.FixedWindow {
			kind = "fixedWindow"
		}
		body, err := json.Marshal(Value{
			Name: name, Kind: kind, Value: snap.Value,
			Capacity: snap.Config.Capacity, Rate: snap.Config.Rate,
			PeriodMs:   float64(snap.Config.Period) / float64(time.Millisecond),
			ServerTime: snap.At.UTC().Format(time.RFC3339Nano),
			Shards:     snap.Config.Shards,
		})
		if err != nil {
			fail(w, r, err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(append(body, '\n'))
	}), nil
}
