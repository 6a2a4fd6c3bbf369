// Package grpclimit applies txlimit limits to gRPC calls, as unary and
// stream server interceptors. A call the limits deny ends with
// codes.ResourceExhausted, a RetryInfo detail that says when to try again and
// a retry-after trailer; the handler never runs.
//
//	lim, err := grpclimit.New(limiter, "api", grpclimit.PeerKey, nil)
//	…
//	srv := grpc.NewServer(
//		grpc.ChainUnaryInterceptor(lim.UnaryServerInterceptor()),
//		grpc.ChainStreamInterceptor(lim.StreamServerInterceptor()),
//	)
//
// Each call takes its tokens in a short transaction of its own
// (txlimit.Limiter.Limit, or LimitAll for several limits) before the handler
// runs, and they stay spent whatever the handler does. A stream takes its
// tokens once, when it opens; to limit the messages of a long stream, call the
// limiter from the handler (Limit, or Wait to slow the stream down). A
// handler that takes its tokens in its own transaction (LimitTx), so that
// they are spent only if its work commits, answers a denial with
// DeniedError, as the interceptors would.
//
// # Keys
//
// The key of a call comes from a KeyFunc, which runs on the server. Key by
// what the server has established (the authenticated user from the context
// your auth interceptor filled, an API key it has checked, the peer
// address), never by a value the client picks freely: a client that chooses
// its key chooses its limit. PeerKey keys by the peer's IP address, an IPv6
// peer by its /64; ClientIPKey by the client's address behind trusted
// proxies, as httplimit.ClientIPKey; MetadataKey by a metadata value, for
// metadata the server has verified.
//
// # Which limit applies
//
// New applies one limit to every call. NewAll applies several, all or none,
// and a Rule's Method chooses its limit per method, or none (health checks,
// reflection): one limit for writes and another for reads, say.
//
// # Answers
//
// A denied call ends with status codes.ResourceExhausted, whose details are
// an errdetails.RetryInfo (RetryDelay: the time until every limit that denied
// would grant the same call) and an errdetails.QuotaFailure (one violation
// per limit that denied, its subject the limit's name), and with the trailer
// retry-after: that delay in whole seconds, rounded up. When the limits
// cannot be applied, the call ends with codes.Unavailable (the database
// failed) or codes.Internal (a configuration or key error), its cause logged
// with log/slog and never shown to the client; txlimit.Options.FailOpen lets
// calls through when the database fails instead. Options.Error replaces that
// mapping.
package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/txlimit/txlimit"
)

// KeyFunc returns the limit key of a call to fullMethod
// ("/package.Service/Method"). req is the request message of a unary call,
// and nil for a stream (its messages have not been read when the stream
// opens). An error ends the call: one that carries a gRPC status (made with
// status.Error, say codes.Unauthenticated) ends it with that status, any
// other as Options.Error says.
type KeyFunc func(ctx context.Context, fullMethod string, req any) (string, error)

// CountFunc returns the number of tokens a call takes from a limit. req is as
// for KeyFunc. A count the limit could never grant (above its Capacity, or
// negative) is an error, answered with codes.Internal.
type CountFunc func(ctx context.Context, fullMethod string, req any) float64

// Options configures a Limit. A nil *Options is the zero value: every field
// takes its default.
type Options struct {
	// Count returns the number of tokens a call takes. Defaults to 1 for
	// every call. NewAll takes it from each Rule instead.
	Count CountFunc
	// Error returns the error a call ends with when the limits cannot be
	// applied: a KeyFunc failed, the database failed, a limit is unknown
	// or a count invalid. Returning nil lets the call go on, unlimited.
	// Defaults to the mapping of the package documentation: a key error
	// that carries a gRPC status keeps it; a cancelled context or an
	// exceeded deadline ends the call with codes.Canceled or
	// codes.DeadlineExceeded; a database error with codes.Unavailable;
	// anything else (bad configuration, a plain key error) with
	// codes.Internal. The last two are logged to Logger and their cause is
	// not shown to the client.
	Error func(ctx context.Context, fullMethod string, err error) error
	// Logger receives, at level Error, what the default Error hides from
	// the client: the error, with the call's method and the limits' names.
	// Defaults to slog.Default() at the time of logging. Unused when Error
	// is set.
	Logger *slog.Logger
}

// A Rule is one limit of a Limit made by NewAll.
type Rule struct {
	// Name is the limit's name, which the limiter must have been given.
	// Set either Name or Method.
	Name string
	// Method chooses the limit per call: it maps the call's full method
	// ("/package.Service/Method") to the name of the limit this rule
	// applies, or to "" to apply none. It must return names the limiter
	// has been given (Limit.CheckServer verifies that for every method of
	// a server); an unknown name ends the call with codes.Internal. Set
	// either Name or Method.
	Method func(fullMethod string) string
	// Key returns the call's key for this limit. Required.
	Key KeyFunc
	// Count returns the number of tokens a call takes from this limit.
	// Defaults to 1.
	Count CountFunc
}

// Limit applies one limit, or several all or none, to gRPC calls. It is safe
// for concurrent use.
type Limit[TTx any] struct {
	limiter *txlimit.Limiter[TTx]
	rules   []Rule
	fail    func(ctx context.Context, fullMethod string, names []string, err error) error
}

// New returns a Limit that applies the limit name of l, which l must have
// been given (txlimit.New), to every call, keyed by key. opts may be nil.
func New[TTx any](l *txlimit.Limiter[TTx], name string, key KeyFunc, opts *Options) (*Limit[TTx], error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if name == "" {
		return nil, errors.New("grpclimit: the limit's name is empty; pass the name of a limit given to txlimit.New (NewAll's Rule.Method chooses one per method)")
	}
	return newLimit(l, []Rule{{Name: name, Key: key, Count: o.Count}}, o)
}

// NewAll returns a Limit that applies several limits of l to each call, all
// or none (txlimit.Limiter.LimitAll): a call that one of them denies takes
// nothing from any, and a granted one takes from all. A rule whose Method
// returns "" for a call does not apply to it, and a call no rule applies to
// goes on without touching the database. The (name, key) pairs the rules
// give one call must differ. opts may be nil; its Count must be nil (each
// Rule has its own).
//
// A denied call's RetryInfo carries the longest RetryAfter of the limits
// that denied: the time the client must wait before every one of them would
// grant it.
func NewAll[TTx any](l *txlimit.Limiter[TTx], rules []Rule, opts *Options) (*Limit[TTx], error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	switch {
	case len(rules) == 0:
		return nil, errors.New("grpclimit: NewAll has no rules; give it at least one Rule")
	case o.Count != nil:
		return nil, errors.New("grpclimit: Options.Count is set for NewAll; set the Count of each Rule instead")
	}
	return newLimit(l, rules, o)
}

func newLimit[TTx any](l *txlimit.Limiter[TTx], rules []Rule, o Options) (*Limit[TTx], error) {
	if l == nil {
		return nil, errors.New("grpclimit: the limiter is nil; pass the *txlimit.Limiter built with txlimit.New")
	}
	for i, r := range rules {
		switch {
		case r.Key == nil:
			return nil, fmt.Errorf("grpclimit: rule %d (%s) has no Key; pass grpclimit.PeerKey or a function that names the caller", i, ruleName(r))
		case r.Name != "" && r.Method != nil:
			return nil, fmt.Errorf("grpclimit: rule %d sets both Name (%q) and Method; set Name for one limit on every call, Method to choose one per method", i, r.Name)
		case r.Name == "" && r.Method == nil:
			return nil, fmt.Errorf("grpclimit: rule %d has neither Name nor Method; set the name of a limit given to txlimit.New", i)
		}
		if _, ok := l.Config(r.Name); r.Name != "" && !ok {
			return nil, fmt.Errorf("grpclimit: %q is not a limit of the limiter; give its Config to txlimit.New", r.Name)
		}
	}
	m := &Limit[TTx]{limiter: l, rules: append([]Rule(nil), rules...)}
	if o.Error != nil {
		m.fail = func(ctx context.Context, fullMethod string, _ []string, err error) error {
			return o.Error(ctx, fullMethod, err)
		}
	} else {
		m.fail = defaultError(o.Logger)
	}
	return m, nil
}

func ruleName(r Rule) string {
	if r.Method != nil {
		return "chosen by Method"
	}
	return strconv.Quote(r.Name)
}

// CheckServer reports, as one error, every method of s's services (a
// *grpc.Server after its services are registered) for which a Rule's Method
// returns the name of a limit the limiter has not been given. Call it at
// startup: such a call would otherwise end with codes.Internal.
func (m *Limit[TTx]) CheckServer(s interface {
	GetServiceInfo() map[string]grpc.ServiceInfo
}) error {
	var methods []string
	for service, info := range s.GetServiceInfo() {
		for _, mi := range info.Methods {
			methods = append(methods, "/"+service+"/"+mi.Name)
		}
	}
	sort.Strings(methods)
	var errs []error
	for _, full := range methods {
		for i, r := range m.rules {
			if r.Method == nil {
				continue
			}
			if name := r.Method(full); name != "" {
				if _, ok := m.limiter.Config(name); !ok {
					errs = append(errs, fmt.Errorf("grpclimit: rule %d maps %s to %q, which is not a limit of the limiter; give its Config to txlimit.New or return another name", i, full, name))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// UnaryServerInterceptor returns the interceptor that applies the limits to
// unary calls: grpc.ChainUnaryInterceptor(lim.UnaryServerInterceptor()).
func (m *Limit[TTx]) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		trailer, err := m.apply(ctx, info.FullMethod, req)
		if trailer != nil {
			_ = grpc.SetTrailer(ctx, trailer)
		}
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamServerInterceptor returns the interceptor that applies the limits to
// streams, once per stream when it opens:
// grpc.ChainStreamInterceptor(lim.StreamServerInterceptor()).
func (m *Limit[TTx]) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		trailer, err := m.apply(ss.Context(), info.FullMethod, nil)
		if trailer != nil {
			ss.SetTrailer(trailer)
		}
		if err != nil {
			return err
		}
		return handler(srv, ss)
	}
}

// apply takes the tokens of a call. It returns nil when the call may go on;
// for a denial, the status error and the trailer to send with it.
func (m *Limit[TTx]) apply(ctx context.Context, fullMethod string, req any) (metadata.MD, error) {
	reqs := make([]txlimit.Request, 0, len(m.rules))
	for _, r := range m.rules {
		name := r.Name
		if r.Method != nil {
			if name = r.Method(fullMethod); name == "" {
				continue
			}
		}
		key, err := r.Key(ctx, fullMethod, req)
		if err != nil {
			return nil, m.fail(ctx, fullMethod, []string{name}, &keyError{name: name, err: err})
		}
		var opts []txlimit.Option
		if r.Count != nil {
			opts = append(opts, txlimit.Count(r.Count(ctx, fullMethod, req)))
		}
		reqs = append(reqs, txlimit.Request{Name: name, Key: key, Options: opts})
	}
	var results []txlimit.Result
	var err error
	switch len(reqs) {
	case 0:
		return nil, nil
	case 1:
		// Limit has a faster path than LimitAll for sharded limits.
		var r txlimit.Result
		r, err = m.limiter.Limit(ctx, reqs[0].Name, reqs[0].Key, reqs[0].Options...)
		results = []txlimit.Result{r}
	default:
		var res txlimit.MultiResult
		res, err = m.limiter.LimitAll(ctx, reqs...)
		results = res.Results
	}
	if err != nil {
		names := make([]string, len(reqs))
		for i, q := range reqs {
			names[i] = q.Name
		}
		return nil, m.fail(ctx, fullMethod, names, err)
	}
	return denied(results)
}

// DeniedError returns the error a handler returns for a call that results
// deny, the answer the interceptors give: codes.ResourceExhausted with
// RetryInfo and QuotaFailure details; it also sets the retry-after trailer
// of the call of ctx (a server handler's context). It returns nil when every
// result is OK. Use it where a handler takes the tokens itself, in its own
// transaction (limiter.LimitTx, or LimitAllTx with MultiResult.Results...),
// so that they are spent only if its work commits.
func DeniedError(ctx context.Context, results ...txlimit.Result) error {
	trailer, err := denied(results)
	if trailer != nil {
		_ = grpc.SetTrailer(ctx, trailer)
	}
	return err
}

// denied is the answer to a call that results deny, or nil when they all
// grant it: ResourceExhausted with RetryInfo (the longest RetryAfter of the
// denials: the time until every limit would grant the call) and QuotaFailure
// details, and the retry-after trailer.
func denied(results []txlimit.Result) (metadata.MD, error) {
	var names []string
	var retry time.Duration
	quota := &errdetails.QuotaFailure{}
	for _, r := range results {
		if r.OK {
			continue
		}
		retry = max(retry, r.RetryAfter)
		names = append(names, r.Name)
		quota.Violations = append(quota.Violations, &errdetails.QuotaFailure_Violation{
			Subject:     r.Name,
			Description: fmt.Sprintf("rate limit %q exceeded; retry after %s", r.Name, r.RetryAfter),
		})
	}
	if names == nil {
		return nil, nil
	}
	secs := retrySeconds(retry)
	st := status.New(codes.ResourceExhausted, fmt.Sprintf("rate limit exceeded (%s); retry after %d seconds", strings.Join(names, ", "), secs))
	// WithDetails fails only for codes.OK.
	st, _ = st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(retry)}, quota)
	return metadata.Pairs(RetryAfterKey, strconv.FormatInt(secs, 10)), st.Err()
}

// RetryAfterKey is the trailer metadata key of a denied call's retry delay,
// in whole seconds, rounded up, as HTTP's Retry-After.
const RetryAfterKey = "retry-after"

// retrySeconds is d in whole seconds, rounded up, and at least 1: a client
// that waits that long is never early.
func retrySeconds(d time.Duration) int64 {
	return int64(max(1, (d+time.Second-1)/time.Second))
}

// keyError is the error of a KeyFunc, so that the default Error tells it
// from the limiter's.
type keyError struct {
	name string
	err  error
}

func (e *keyError) Error() string {
	return fmt.Sprintf("grpclimit: the key of limit %q: %v", e.name, e.err)
}

func (e *keyError) Unwrap() error { return e.err }

// defaultError returns the default Options.Error.
func defaultError(logger *slog.Logger) func(ctx context.Context, fullMethod string, names []string, err error) error {
	return func(ctx context.Context, fullMethod string, names []string, err error) error {
		var ke *keyError
		isKey := errors.As(err, &ke)
		if isKey {
			var gs interface{ GRPCStatus() *status.Status }
			if errors.As(ke.err, &gs) && gs.GRPCStatus() != nil {
				return gs.GRPCStatus().Err()
			}
		}
		var code codes.Code
		var msg string
		switch {
		case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
			// The client has gone, or its deadline has passed: nothing to
			// log (the limiter's Observer counts it).
			return status.FromContextError(err).Err()
		case !isKey && !errors.As(err, new(*txlimit.InvalidError)) && !errors.Is(err, txlimit.ErrNotMigrated):
			code, msg = codes.Unavailable, "the rate limit is unavailable; retry later"
		default:
			code, msg = codes.Internal, "the rate limit could not be applied"
		}
		l := logger
		if l == nil {
			l = slog.Default()
		}
		l.LogAttrs(ctx, slog.LevelError, "grpclimit: answered "+code.String()+": the limit could not be applied",
			slog.String("method", fullMethod), slog.Any("limits", names), slog.String("err", err.Error()))
		return status.Error(code, msg)
	}
}
