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
// peer's IP address, an IPv6 peer by its /64 (one host usually holds a whole
// /64, and would otherwise get a limit per address). Behind reverse proxies
// every request comes from a proxy, and the client's address is in a header
// the proxies append to; ClientIPKey reads it, believing only what the
// proxies you name (ClientIP.TrustedProxies) wrote.
//
// # Several limits
//
// NewAll applies several limits to each request, all or none: a per-client
// limit beside a global one, say. The header fields describe the limit that
// binds; NewAll says which.
//
// # Header fields
//
// Every response to a request the limit was applied to carries, for the
// policy name P (the limit's name unless Options.Policy says otherwise):
//
//	RateLimit-Policy: "P";q=<Rate per w, rounded down>;w=<Period in seconds, rounded up>
//	RateLimit: "P";r=<whole tokens left>;t=<seconds before another token>
//
// A calendar window (txlimit.Daily, Weekly, Monthly, Yearly) has no fixed
// period: its policy is "P";q=<Rate, rounded down>, without w.
//
// r is Result.Remaining rounded down (never below 0) and t is
// Result.NextToken rounded down, omitted when the limit is full; both err on
// the side of telling a client less than it has, never more. A denied
// request gets 429 Too Many Requests with Retry-After: Result.RetryAfter in
// whole seconds rounded up (1.2s → 2), so a client that waits that long is
// never early. The values are those of the call. A sharded limit
// (txlimit.Config.Shards > 1) must have Config.ReportRemaining set, which New
// and NewAll check: without it a call served from one free shard does not
// know r. With it, the other shards count as last committed
// (Result.Remaining says more).
//
// # Charging by outcome
//
// By default Handler charges every request before its handler runs. A limit
// with a Charge (Options.Charge, Rule.Charge) charges only the responses
// Charge picks, by status code (Statuses(401, 403): failed logins) or by
// any function of the request, the status and the response's header. A
// request the limit cannot grant now is still denied with a 429 before its
// handler runs; the charge of the others is settled when the handler
// commits its response (its first WriteHeader of a final status, Write,
// Flush or Hijack, or its return when it wrote nothing, which net/http
// answers 200), before the header goes out: by the time a client reads the
// status, the limit already counts it. The Mode says how requests are held
// back until then:
//
//   - Refund (the default) takes the tokens before the handler and gives
//     them back when the response is not charged. While a request runs it
//     holds its tokens: no more requests of a key run at once than its
//     limit has tokens, and the responses charged never exceed the limit,
//     whatever arrives together. The fields are those of the take, which
//     counts the request as charged: a refund only adds to r.
//   - TakeAfter checks the limit before the handler (taking nothing) and
//     takes the tokens after it when the response is charged. Requests not
//     charged never count, even while they run; but requests that arrive
//     together all pass the check, so the responses charged can exceed the
//     limit by the requests running when it ran out, and those are charged
//     only what is left (txlimit.UpTo). The fields are set when the
//     response is committed: the take's for a charged response, the
//     check's for another.
//
// The take before the handler and the refund or take after it do not stop
// when the client goes away (the request's context is cancelled), so a
// disconnect loses no token and forgives none. A handler that panics before
// committing its response is charged as a 500 (the panic goes on). Tx
// cannot apply a limit with a Charge: the handler's transaction already
// decides whether its tokens are spent.
//
// # Requests in flight
//
// A limit whose Config.Kind is txlimit.Concurrency caps the requests of a
// key that run at once, rather than their rate: Handler acquires one of
// its slots before the handler runs, with a holder id made for the
// request, and releases it when the handler returns, when it panics (the
// panic goes on after the release) and when the client disconnects (the
// release does not use the request's context, and gives up after 10
// seconds, leaving the slot to its expiry). A request the limit cannot
// admit gets a 429 with Retry-After: RetryAfter, the time until the
// earliest expiry of a slot's holder (a release usually frees one sooner);
// Options.Denied may answer otherwise, a 503 for a cap that protects the
// server rather than shares it among clients, say. A handler that runs for
// longer than HoldFor/3 has its slot extended every HoldFor/3; its
// request's context is cancelled if the slot is lost all the same. The
// fields say RateLimit-Policy: "P";q=<Capacity>;qu="concurrent-requests"
// and RateLimit: "P";r=<free slots>. Count, Charge and Mode do not apply
// to a Concurrency limit, and Tx cannot apply one (nothing would release
// its slot). NewAll takes slots and tokens all or none.
package httplimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/txlimit/txlimit"
)

// Options configures a Limit. A nil *Options is the zero value: every field
// takes its default.
type Options struct {
	// Policy is the name the RateLimit and RateLimit-Policy fields give
	// the limit. It must be printable ASCII (the fields quote it as a
	// Structured Fields String). Defaults to the limit's name. NewAll
	// takes it from each Rule instead.
	Policy string
	// Count returns the number of tokens a request takes. Defaults to 1
	// for every request. A count the limit could never grant (above its
	// Capacity) is an error, answered by Error. NewAll takes it from each
	// Rule instead.
	Count func(r *http.Request) float64
	// Charge, when set, charges a request only for the responses it
	// returns true for, given the request, the response's status code and
	// its header as the handler commits it; Mode says how requests are
	// limited until then (see Charging by outcome). Statuses builds one
	// from status codes. Defaults to nil: every request is charged before
	// the handler runs. NewAll takes it from each Rule instead.
	Charge func(r *http.Request, status int, header http.Header) bool
	// Mode is how a limit with a Charge holds requests whose outcome is
	// not yet known: Refund (the default) or TakeAfter. It must be left
	// unset without a Charge. NewAll takes it from each Rule instead.
	Mode Mode
	// Denied writes the response to a request the limit denied. When it
	// runs, Retry-After and the RateLimit fields are set on w, and res is
	// the result of the limit that binds (see NewAll). Defaults to a 429
	// Too Many Requests with an application/problem+json body of the
	// "quota-exceeded" type of the draft (section 5.1) that names every
	// policy that denied.
	Denied func(w http.ResponseWriter, r *http.Request, res txlimit.Result)
	// Error writes the response when the key cannot be found or the limit
	// fails (the database is down, the count is invalid). Defaults to a
	// 500 Internal Server Error with the text body "Internal Server
	// Error", which does not show err to the client; err goes to Logger
	// instead.
	Error func(w http.ResponseWriter, r *http.Request, err error)
	// Logger receives, at level Error, what the default Error hides from
	// the client: the error, with the request's method and path and the
	// limits' names; and, whether Error is set or not, an error charging or
	// refunding a request after its handler (Charge), which no longer
	// changes the response. Defaults to slog.Default() at the time of
	// logging.
	Logger *slog.Logger
}

// A Rule is one limit of a Limit made by NewAll.
type Rule struct {
	// Name is the limit's name, which the limiter must have been given.
	Name string
	// Key returns the request's key for this limit. Required.
	Key KeyFunc
	// Policy is the name the header fields give this limit, as
	// Options.Policy. Defaults to Name.
	Policy string
	// Count returns the number of tokens a request takes from this limit.
	// Defaults to 1.
	Count func(r *http.Request) float64
	// Charge and Mode charge this limit by the response, as
	// Options.Charge and Options.Mode: each rule chooses for itself.
	Charge func(r *http.Request, status int, header http.Header) bool
	Mode   Mode
}

// rule is a Rule ready to apply.
type rule struct {
	Rule
	policy  string // Policy quoted for the header fields
	header  string // the RateLimit-Policy field value
	slot    bool   // a Concurrency limit: a request holds a slot while its handler runs
	holdFor time.Duration
}

// Limit applies one limit, or several all or none, to HTTP requests. It is
// safe for concurrent use.
type Limit[TTx any] struct {
	limiter *txlimit.Limiter[TTx]
	rules   []rule
	denied  func(w http.ResponseWriter, r *http.Request, res txlimit.Result)
	fail    func(w http.ResponseWriter, r *http.Request, err error)
	// byOutcome reports that a rule has a Charge: Handler then settles
	// each request when its response is committed (outcome.go).
	byOutcome bool
	// slots reports that a rule is a Concurrency limit: Handler then
	// releases the request's slots when its handler returns (inflight.go),
	// and extends them every holdFor/3 (the shortest HoldFor) while it
	// runs.
	slots   bool
	holdFor time.Duration
	logger  *slog.Logger
}

// New returns a Limit that applies the limit name of l, which l must have
// been given (txlimit.New), keyed by key. A sharded limit needs
// Config.ReportRemaining (see Header fields). opts may be nil.
func New[TTx any](l *txlimit.Limiter[TTx], name string, key KeyFunc, opts *Options) (*Limit[TTx], error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	return newLimit(l, []Rule{{Name: name, Key: key, Policy: o.Policy, Count: o.Count, Charge: o.Charge, Mode: o.Mode}}, o)
}

// NewAll returns a Limit that applies several limits of l to each request,
// all or none (txlimit.Limiter.LimitAll): a request that one of them denies
// takes nothing from any, and a granted one takes from all. Use it for a
// per-client limit beside a per-route or global one. The rules' (name, key)
// pairs must differ for every request. opts may be nil; its Policy and
// Count must be empty (each Rule has its own).
//
// The header fields describe one limit, the one that binds. When the
// request is denied, it is the denied limit with the longest RetryAfter,
// the one the client must wait for (Retry-After is its RetryAfter). When it
// is granted, it is the limit with the fewest whole requests like this one
// left (Remaining divided by the request's count for that limit, rounded
// down), the one that will deny first if the client goes on; among those,
// the one whose next token is furthest away. On a tie, the first in rules.
// The default 429 body names every policy that denied.
func NewAll[TTx any](l *txlimit.Limiter[TTx], rules []Rule, opts *Options) (*Limit[TTx], error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	switch {
	case len(rules) == 0:
		return nil, errors.New("httplimit: NewAll has no rules; give it at least one Rule")
	case o.Policy != "":
		return nil, errors.New("httplimit: Options.Policy is set for NewAll; set the Policy of each Rule instead")
	case o.Count != nil:
		return nil, errors.New("httplimit: Options.Count is set for NewAll; set the Count of each Rule instead")
	case o.Charge != nil || o.Mode != Refund:
		return nil, errors.New("httplimit: Options.Charge or Options.Mode is set for NewAll; set the Charge and Mode of each Rule instead")
	}
	return newLimit(l, rules, o)
}

func newLimit[TTx any](l *txlimit.Limiter[TTx], rules []Rule, o Options) (*Limit[TTx], error) {
	m := &Limit[TTx]{limiter: l, rules: make([]rule, len(rules)), denied: o.Denied, fail: o.Error, logger: o.Logger}
	policies := make(map[string]int, len(rules))
	for i, r := range rules {
		cfg, err := config(l, r.Name, r.Key)
		if err != nil {
			return nil, err
		}
		if cfg.Shards > 1 && !cfg.ReportRemaining {
			return nil, fmt.Errorf("httplimit: limit %q has %d shards but not ReportRemaining, so a call served from one free shard cannot tell the RateLimit field how many tokens are left; set ReportRemaining: true in its txlimit.Config", r.Name, cfg.Shards)
		}
		slot := cfg.Kind == txlimit.Concurrency
		check := checkMode
		if slot {
			check = checkSlot
			m.slots = true
			if m.holdFor == 0 || cfg.HoldFor < m.holdFor {
				m.holdFor = cfg.HoldFor
			}
		}
		if err := check(r); err != nil {
			return nil, err
		}
		m.byOutcome = m.byOutcome || r.Charge != nil
		if r.Policy == "" {
			r.Policy = r.Name
		}
		if j, dup := policies[r.Policy]; dup {
			return nil, fmt.Errorf("httplimit: rules %d and %d have the policy name %q; give each Rule a Policy of its own", j, i, r.Policy)
		}
		policies[r.Policy] = i
		policy, err := quote(r.Policy)
		if err != nil {
			return nil, err
		}
		// w is the period in whole seconds, rounded up (the field has no
		// fractions), and q what the limit adds over w, rounded down: a
		// client that keeps to q per w keeps to the limit.
		// A calendar window's windows are days to years of varying length:
		// its policy gives the quota of one, and no w.
		// A Concurrency limit's quota is its Capacity of requests at once,
		// in the draft's unit for that, over no window.
		header := fmt.Sprintf("%s;q=%d", policy, sfInteger(math.Floor(cfg.Rate)))
		if slot {
			header = fmt.Sprintf(`%s;q=%d;qu="concurrent-requests"`, policy, sfInteger(cfg.Capacity))
		} else if _, calendar := calendarNames[cfg.Kind]; !calendar {
			w := max(1, int64(math.Ceil(cfg.Period.Seconds())))
			q := math.Floor(cfg.Rate * float64(time.Duration(w)*time.Second) / float64(cfg.Period))
			header = fmt.Sprintf("%s;q=%d;w=%d", policy, sfInteger(q), w)
		}
		m.rules[i] = rule{Rule: r, policy: policy, header: header, slot: slot, holdFor: cfg.HoldFor}
	}
	if m.fail == nil {
		m.fail = logError(o.Logger, func() []string {
			names := make([]string, len(m.rules))
			for i, r := range m.rules {
				names[i] = r.Name
			}
			return names
		}())
	}
	return m, nil
}

// config checks the arguments shared by New, NewAll and ValueHandler.
func config[TTx any](l *txlimit.Limiter[TTx], name string, key KeyFunc) (txlimit.Config, error) {
	if l == nil {
		return txlimit.Config{}, errors.New("httplimit: the limiter is nil; pass the *txlimit.Limiter built with txlimit.New")
	}
	if key == nil {
		return txlimit.Config{}, fmt.Errorf("httplimit: the KeyFunc of limit %q is nil; pass httplimit.RemoteAddrKey or a function that names the caller", name)
	}
	cfg, ok := l.Config(name)
	if !ok {
		return txlimit.Config{}, fmt.Errorf("httplimit: %q is not a limit of the limiter; give its Config to txlimit.New", name)
	}
	return cfg, nil
}

// Handler returns middleware around next: each request takes its tokens in
// a short transaction of its own (txlimit.Limiter.Limit, or LimitAll for
// several rules) before next runs, and next runs only when they are
// granted. The tokens stay spent whatever next does; to spend them only
// when the handler's own work commits, call Tx from the handler instead.
//
// A limit with a Charge is charged by the response instead, as its Mode
// says (see Charging by outcome): next then gets a ResponseWriter that
// settles the charge when the response is committed, before its header
// goes out. It has Unwrap, Flush and Hijack, so http.ResponseController
// and the http.Flusher and http.Hijacker assertions work through it.
//
// A Concurrency limit is held while next runs, and released when it
// returns or panics, or after the client has gone (see Requests in
// flight); next then gets a request whose context is also cancelled if
// its slot is lost.
func (m *Limit[TTx]) Handler(next http.Handler) http.Handler {
	if m.byOutcome {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serveByOutcome(w, r, next) })
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reqs, holder, err := m.requests(r)
		ctx := r.Context()
		if err == nil && m.slots {
			// A slot taken for a client that is gone would be given back at
			// once; an acquire cancelled during its commit may have
			// committed all the same, so it runs to the end.
			err = ctx.Err()
			ctx = context.WithoutCancel(ctx)
		}
		var res txlimit.MultiResult
		if err == nil {
			if res, err = m.limit(ctx, reqs, nil); err != nil {
				m.acquireFailed(r, reqs, holder, err)
			}
		}
		if err != nil {
			m.fail(w, r, err)
			return
		}
		if !m.respond(w, r, res) {
			return
		}
		if m.slots {
			var release func()
			r, release = m.hold(r, reqs, holder, res)
			defer release() // on a panic too, which goes on after it
		}
		next.ServeHTTP(w, r)
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
//
// A Limit with a Charge is an error here: tx's commit already decides
// whether the tokens are spent, and Tx sees no response to charge by. So
// is a Limit with a Concurrency limit: Tx returns before the handler ends,
// and nothing would release the slot.
func (m *Limit[TTx]) Tx(w http.ResponseWriter, r *http.Request, tx TTx) (bool, error) {
	if m.byOutcome {
		return false, errTxByOutcome
	}
	if m.slots {
		return false, errTxSlots
	}
	reqs, _, err := m.requests(r)
	if err != nil {
		return false, err
	}
	res, err := m.limit(r.Context(), reqs, &tx)
	if err != nil {
		return false, err
	}
	return m.respond(w, r, res), nil
}

// requests returns the limits of r's call and, for a Limit with
// Concurrency limits, the holder of its slots, a new one.
func (m *Limit[TTx]) requests(r *http.Request) ([]txlimit.Request, string, error) {
	var holder string
	if m.slots {
		holder = newHolder()
	}
	reqs := make([]txlimit.Request, len(m.rules))
	for i, ru := range m.rules {
		key, err := ru.Key(r)
		if err != nil {
			return nil, "", err
		}
		var opts []txlimit.Option
		switch {
		case ru.slot:
			opts = []txlimit.Option{txlimit.Holder(holder)}
		case ru.Count != nil:
			opts = []txlimit.Option{txlimit.Count(ru.Count(r))}
		}
		reqs[i] = txlimit.Request{Name: ru.Name, Key: key, Options: opts}
	}
	return reqs, holder, nil
}

// limit takes reqs in tx, or in a transaction of its own when tx is nil.
// One limit goes through Limit, which has a faster path for sharded limits
// than LimitAll.
func (m *Limit[TTx]) limit(ctx context.Context, reqs []txlimit.Request, tx *TTx) (txlimit.MultiResult, error) {
	if len(reqs) > 1 {
		if tx != nil {
			return m.limiter.LimitAllTx(ctx, *tx, reqs...)
		}
		return m.limiter.LimitAll(ctx, reqs...)
	}
	q := reqs[0]
	var res txlimit.Result
	var err error
	if tx != nil {
		res, err = m.limiter.LimitTx(ctx, *tx, q.Name, q.Key, q.Options...)
	} else {
		res, err = m.limiter.Limit(ctx, q.Name, q.Key, q.Options...)
	}
	return txlimit.MultiResult{OK: res.OK, RetryAfter: res.RetryAfter, Results: []txlimit.Result{res}, At: res.At}, err
}

// binding returns the index of the limit whose header fields res gets: see
// NewAll.
func binding(res txlimit.MultiResult) int {
	best := 0
	if !res.OK {
		best = -1
		for i, r := range res.Results {
			if !r.OK && (best < 0 || r.RetryAfter > res.Results[best].RetryAfter) {
				best = i
			}
		}
		return best
	}
	// Whole requests like this one left, as a client reads r; +Inf for a
	// limit the request takes nothing from.
	left := func(r txlimit.Result) float64 {
		if r.Count <= 0 {
			return math.Inf(1)
		}
		return math.Floor(max(r.Remaining, 0) / r.Count)
	}
	for i, r := range res.Results {
		b := res.Results[best]
		if left(r) < left(b) || (left(r) == left(b) && r.NextToken > b.NextToken) {
			best = i
		}
	}
	return best
}

// respond sets the header fields of the binding limit of res on w and, for
// a denial, writes the response; it reports whether the request may go on.
func (m *Limit[TTx]) respond(w http.ResponseWriter, r *http.Request, res txlimit.MultiResult) bool {
	i := m.setFields(w.Header(), res)
	if res.OK {
		return true
	}
	b := res.Results[i]
	h := w.Header()
	h.Set("Retry-After", strconv.FormatInt(retrySeconds(b.RetryAfter), 10))
	if m.denied != nil {
		m.denied(w, r, b)
		return false
	}
	var violated []string
	for j, rr := range res.Results {
		if !rr.OK {
			violated = append(violated, m.rules[j].Policy)
		}
	}
	detail := "Rate limit exceeded"
	if m.rules[i].slot {
		detail = "Too many requests in flight"
	}
	problem(w, detail, violated)
	return false
}

// setFields sets the RateLimit-Policy and RateLimit fields of the binding
// limit of res on h and returns its index.
func (m *Limit[TTx]) setFields(h http.Header, res txlimit.MultiResult) int {
	i := binding(res)
	ru, b := m.rules[i], res.Results[i]
	h.Set("RateLimit-Policy", ru.header)
	if b.Paused {
		// No quota until the pause ends, whatever the tokens.
		h.Set("RateLimit", fmt.Sprintf("%s;r=0;t=%d", ru.policy, retrySeconds(b.RetryAfter)))
		return i
	}
	field := fmt.Sprintf("%s;r=%d", ru.policy, sfInteger(math.Floor(max(b.Remaining, 0))))
	if b.NextToken > 0 {
		t := int64(b.NextToken / time.Second)
		if !b.OK {
			// Retry-After must not end before the effective window.
			t = min(t, retrySeconds(b.RetryAfter))
		}
		field += ";t=" + strconv.FormatInt(t, 10)
	}
	h.Set("RateLimit", field)
	return i
}

// retrySeconds is d in whole seconds, rounded up, and at least 1: a client
// that waits that long is never early.
func retrySeconds(d time.Duration) int64 {
	s := int64(d / time.Second)
	if d%time.Second > 0 {
		s++ // rounded up without adding to d, which may be near its maximum
	}
	return max(1, s)
}

// problem is the default Denied: RFC 9457 problem details of the draft's
// quota-exceeded type. detail says what was exceeded.
func problem(w http.ResponseWriter, detail string, violated []string) {
	body, _ := json.Marshal(map[string]any{
		"type":              "https://iana.org/assignments/http-problem-types#quota-exceeded",
		"title":             "Too Many Requests",
		"status":            http.StatusTooManyRequests,
		"detail":            fmt.Sprintf("%s; retry after %s seconds.", detail, w.Header().Get("Retry-After")),
		"violated-policies": violated,
	})
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = w.Write(append(body, '\n'))
}

// logError returns the default Options.Error: a 500 that shows the client
// nothing, and err logged with what identifies the request.
func logError(logger *slog.Logger, limits []string) func(w http.ResponseWriter, r *http.Request, err error) {
	return func(w http.ResponseWriter, r *http.Request, err error) {
		l := logger
		if l == nil {
			l = slog.Default()
		}
		l.LogAttrs(r.Context(), slog.LevelError, "httplimit: answered 500: the limit could not be applied",
			slog.String("method", r.Method), slog.String("path", r.URL.Path),
			slog.Any("limits", limits), slog.String("err", err.Error()))
		http.Error(w, http.StatusText(http.StatusInternalServerError), http.StatusInternalServerError)
	}
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

// errFailedOpen is ValueHandler's error for a read the limiter answered
// without the database (txlimit.Options.FailOpen): it has no value to show.
var errFailedOpen = errors.New("httplimit: the limiter failed open (txlimit.Options.FailOpen), so the limit's value is unknown; the store's error went to txlimit.Options.Observer")

// Value is the JSON document ValueHandler serves.
type Value struct {
	Name string `json:"name"`
	// Kind is "tokenBucket", "fixedWindow", "slidingWindow" or
	// "concurrency"; a calendar window (txlimit.Daily to Yearly) is a
	// "fixedWindow" with Calendar set. For a "concurrency" limit, Value is
	// the free slots, Capacity the most requests at once, and Rate and
	// PeriodMs are 0.
	Kind string `json:"kind"`
	// Calendar is "day", "week", "month" or "year" for a calendar window
	// (txlimit.Daily, Weekly, Monthly, Yearly; its PeriodMs is 0), in the
	// time zone Zone, the limit's Config.Zone.
	Calendar string `json:"calendar,omitempty"`
	Zone     string `json:"zone,omitempty"`
	// Value is the tokens the limit holds at ServerTime, summed over all
	// shards; negative while reservations are outstanding.
	Value    float64 `json:"value"`
	Capacity float64 `json:"capacity"`
	// Rate tokens are added every PeriodMs milliseconds, or every calendar
	// window.
	Rate     float64 `json:"rate"`
	PeriodMs float64 `json:"periodMs"`
	// ServerTime is the clock reading Value was projected to, in RFC 3339
	// with nanoseconds, so that a front end can keep projecting it.
	ServerTime string `json:"serverTime"`
	Shards     int    `json:"shards"`
}

// kindNames and calendarNames are Value's names of the kinds: a calendar
// Kind is a "fixedWindow" of a calendar unit.
var (
	kindNames = map[txlimit.Kind]string{
		txlimit.TokenBucket: "tokenBucket", txlimit.FixedWindow: "fixedWindow", txlimit.SlidingWindow: "slidingWindow",
		txlimit.Daily: "fixedWindow", txlimit.Weekly: "fixedWindow", txlimit.Monthly: "fixedWindow", txlimit.Yearly: "fixedWindow",
		txlimit.Concurrency: "concurrency",
	}
	calendarNames = map[txlimit.Kind]string{
		txlimit.Daily: "day", txlimit.Weekly: "week", txlimit.Monthly: "month", txlimit.Yearly: "year",
	}
)

// ValueHandler returns a handler that answers GET with the current Value of
// the limit name for the key of the request, as JSON: what a front end needs
// to show the limit and count it down. The key comes from key, on the
// server, never from the request's parameters, so that one caller cannot
// read another's limit. Only opts.Error and opts.Logger are used (for key
// and database errors, and for a read that txlimit.Options.FailOpen answered
// without the database, which has no value to show); opts may be nil.
//
// The value is read with Check (txlimit.Count(0)), which sums every shard, so
// a sharded limit needs no Config.ReportRemaining here.
func ValueHandler[TTx any](l *txlimit.Limiter[TTx], name string, key KeyFunc, opts *Options) (http.Handler, error) {
	cfg, err := config(l, name, key)
	if err != nil {
		return nil, err
	}
	fail := logError(nil, []string{name})
	if opts != nil && opts.Error != nil {
		fail = opts.Error
	} else if opts != nil {
		fail = logError(opts.Logger, []string{name})
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, http.StatusText(http.StatusMethodNotAllowed), http.StatusMethodNotAllowed)
			return
		}
		k, err := key(r)
		var res txlimit.Result
		if err == nil {
			res, err = l.Check(r.Context(), name, k, txlimit.Count(0))
		}
		if err == nil && res.FailedOpen {
			err = errFailedOpen
		}
		if err != nil {
			fail(w, r, err)
			return
		}
		body, err := json.Marshal(Value{
			Name: name, Kind: kindNames[cfg.Kind], Calendar: calendarNames[cfg.Kind], Zone: cfg.Zone, Value: res.Remaining,
			Capacity: cfg.Capacity, Rate: cfg.Rate,
			PeriodMs:   float64(cfg.Period) / float64(time.Millisecond),
			ServerTime: res.At.UTC().Format(time.RFC3339Nano),
			Shards:     cfg.Shards,
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
