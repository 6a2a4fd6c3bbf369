package grpclimit_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/grpclimit"
)

const (
	checkMethod = "/grpc.health.v1.Health/Check"
	listMethod  = "/grpc.health.v1.Health/List"
	watchMethod = "/grpc.health.v1.Health/Watch"
)

// perMinute is a token bucket of n tokens a minute, n at most: on the frozen
// clock, a token is worth 60s/n of waiting.
func perMinute(n float64) txlimit.Config {
	return txlimit.Config{Kind: txlimit.TokenBucket, Rate: n, Period: time.Minute}
}

// interceptors returns the server options that install lim.
func interceptors[TTx any](lim *grpclimit.Limit[TTx]) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(lim.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(lim.StreamServerInterceptor()),
	}
}

// tenant returns ctx with the x-tenant metadata the tests key by.
func tenant(ctx context.Context, name string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "x-tenant", name)
}

// check makes one unary call as tenant and returns its error and trailer.
func check(client healthpb.HealthClient, who string) (metadata.MD, error) {
	var trailer metadata.MD
	_, err := client.Check(tenant(context.Background(), who), &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
	return trailer, err
}

// requireDenied checks that err is the answer to a denied call: ResourceExhausted,
// a RetryInfo of exactly retry, a QuotaFailure naming limits, and the
// retry-after trailer in whole seconds rounded up.
func requireDenied(t *testing.T, err error, trailer metadata.MD, retry time.Duration, limits ...string) {
	t.Helper()
	st, ok := status.FromError(err)
	require.True(t, ok, "not a status error: %v", err)
	require.Equal(t, codes.ResourceExhausted, st.Code(), st.Message())
	var info *errdetails.RetryInfo
	var quota *errdetails.QuotaFailure
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.RetryInfo:
			info = d
		case *errdetails.QuotaFailure:
			quota = d
		default:
			t.Fatalf("unexpected detail %T: %v", d, d)
		}
	}
	require.NotNil(t, info, "no RetryInfo detail")
	require.Equal(t, retry, info.GetRetryDelay().AsDuration())
	require.NotNil(t, quota, "no QuotaFailure detail")
	var subjects []string
	for _, v := range quota.GetViolations() {
		subjects = append(subjects, v.GetSubject())
	}
	require.Equal(t, limits, subjects)
	secs := int64((retry + time.Second - 1) / time.Second)
	require.Equal(t, []string{fmt.Sprint(secs)}, trailer.Get(grpclimit.RetryAfterKey))
	require.Contains(t, st.Message(), fmt.Sprintf("retry after %d seconds", secs))
}

func TestUnaryConcurrent(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) { t.Parallel(); testUnaryConcurrent(t, sqliteLimiter) })
	t.Run("postgres", func(t *testing.T) { t.Parallel(); testUnaryConcurrent(t, postgresLimiter) })
}

// testUnaryConcurrent sends 25 calls at once for each of two tenants to a
// limit of 10 per tenant: exactly 10 of each are admitted, the rest denied
// with the time until the next token, and the handler runs only for the
// admitted.
func testUnaryConcurrent[TTx any](t *testing.T, open opener[TTx]) {
	limiter := open(t, migrated, map[string]txlimit.Config{"api": perMinute(10)}, &txlimit.Options{Clock: frozen})
	lim, err := grpclimit.New(limiter, "api", grpclimit.MetadataKey("X-Tenant"), nil)
	require.NoError(t, err)
	var mu sync.Mutex
	handled := map[string]int{} // calls that reached the handler, by tenant
	count := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		mu.Lock()
		handled[md.Get("x-tenant")[0]]++
		mu.Unlock()
		return h(ctx, req)
	})
	client := serve(t, append(interceptors(lim), count)...)

	const calls = 25
	type outcome struct {
		who     string
		err     error
		trailer metadata.MD
	}
	out := make(chan outcome, 2*calls)
	var wg sync.WaitGroup
	for _, who := range []string{"acme", "globex"} {
		for range calls {
			wg.Go(func() {
				trailer, err := check(client, who)
				out <- outcome{who, err, trailer}
			})
		}
	}
	wg.Wait()
	close(out)
	admitted := map[string]int{}
	for o := range out {
		if o.err == nil {
			admitted[o.who]++
			continue
		}
		requireDenied(t, o.err, o.trailer, 6*time.Second, "api")
	}
	require.Equal(t, map[string]int{"acme": 10, "globex": 10}, admitted)
	require.Equal(t, admitted, handled, "calls that reached the handler")
	for _, who := range []string{"acme", "globex"} {
		read, err := limiter.Check(context.Background(), "api", who, txlimit.Count(0))
		require.NoError(t, err)
		require.InDelta(t, 0, read.Remaining, 1e-9)
	}
}

func TestStreamConcurrent(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) { t.Parallel(); testStreamConcurrent(t, sqliteLimiter) })
	t.Run("postgres", func(t *testing.T) { t.Parallel(); testStreamConcurrent(t, postgresLimiter) })
}

// testStreamConcurrent opens 20 streams at once under a limit of 5: exactly
// 5 open (their first message arrives), the other 15 end with the denial and
// its trailer before the handler runs.
func testStreamConcurrent[TTx any](t *testing.T, open opener[TTx]) {
	limiter := open(t, migrated, map[string]txlimit.Config{"streams": perMinute(5)}, &txlimit.Options{Clock: frozen})
	lim, err := grpclimit.New(limiter, "streams", grpclimit.MetadataKey("x-tenant"), nil)
	require.NoError(t, err)
	client := serve(t, interceptors(lim)...)

	const streams = 20
	type outcome struct {
		err     error
		trailer metadata.MD
	}
	out := make(chan outcome, streams)
	var wg sync.WaitGroup
	for range streams {
		wg.Go(func() {
			ctx, cancel := context.WithCancel(tenant(context.Background(), "acme"))
			defer cancel()
			stream, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
			if err != nil {
				out <- outcome{err: err}
				return
			}
			resp, err := stream.Recv()
			if err == nil && resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				err = fmt.Errorf("status %v", resp.GetStatus())
			}
			out <- outcome{err, stream.Trailer()}
		})
	}
	wg.Wait()
	close(out)
	var admitted, denied int
	for o := range out {
		if o.err == nil {
			admitted++
			continue
		}
		requireDenied(t, o.err, o.trailer, 12*time.Second, "streams")
		denied++
	}
	require.Equal(t, 5, admitted)
	require.Equal(t, 15, denied)
}

func TestAllOrNone(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) { t.Parallel(); testAllOrNone(t, sqliteLimiter) })
	t.Run("postgres", func(t *testing.T) { t.Parallel(); testAllOrNone(t, postgresLimiter) })
}

// testAllOrNone applies a per-tenant limit of 3 and a global one of 5 with
// NewAll: a call one of them denies takes nothing from the other.
func testAllOrNone[TTx any](t *testing.T, open opener[TTx]) {
	ctx := context.Background()
	limiter := open(t, migrated, map[string]txlimit.Config{"perTenant": perMinute(3), "global": perMinute(5)},
		&txlimit.Options{Clock: frozen})
	lim, err := grpclimit.NewAll(limiter, []grpclimit.Rule{
		{Name: "perTenant", Key: grpclimit.MetadataKey("x-tenant")},
		{Name: "global", Key: func(context.Context, string, any) (string, error) { return "", nil }},
	}, nil)
	require.NoError(t, err)
	client := serve(t, interceptors(lim)...)

	// acme: 3 granted, then denied by its own limit (20s a token); the
	// global limit keeps 2.
	for i := range 5 {
		trailer, err := check(client, "acme")
		if i < 3 {
			require.NoError(t, err, "call %d", i)
			continue
		}
		requireDenied(t, err, trailer, 20*time.Second, "perTenant")
	}
	global, err := limiter.Check(ctx, "global", "", txlimit.Count(0))
	require.NoError(t, err)
	require.InDelta(t, 2, global.Remaining, 1e-9, "acme's denied calls took from the global limit")

	// globex: 2 granted, then denied by the global limit (12s a token),
	// which took nothing from globex's own.
	for i := range 4 {
		trailer, err := check(client, "globex")
		if i < 2 {
			require.NoError(t, err, "call %d", i)
			continue
		}
		requireDenied(t, err, trailer, 12*time.Second, "global")
	}
	own, err := limiter.Check(ctx, "perTenant", "globex", txlimit.Count(0))
	require.NoError(t, err)
	require.InDelta(t, 1, own.Remaining, 1e-9, "globex's denied calls took from its own limit")

	// Both limits denied: the delay is the longer one, both are named.
	for range 3 {
		_, err := limiter.Limit(ctx, "perTenant", "initech")
		require.NoError(t, err)
	}
	trailer, err := check(client, "initech")
	requireDenied(t, err, trailer, 20*time.Second, "perTenant", "global")
}

func TestPerMethod(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) { t.Parallel(); testPerMethod(t, sqliteLimiter) })
	t.Run("postgres", func(t *testing.T) { t.Parallel(); testPerMethod(t, postgresLimiter) })
}

// testPerMethod chooses the limit by method: Check and List have limits of
// their own, Watch none. 10 calls of each at once: 2 Checks, 3 Lists and
// every Watch are admitted.
func testPerMethod[TTx any](t *testing.T, open opener[TTx]) {
	limiter := open(t, migrated, map[string]txlimit.Config{"check": perMinute(2), "list": perMinute(3)},
		&txlimit.Options{Clock: frozen})
	byMethod := func(fullMethod string) string {
		switch fullMethod {
		case checkMethod:
			return "check"
		case listMethod:
			return "list"
		}
		return "" // Watch: not limited
	}
	lim, err := grpclimit.NewAll(limiter, []grpclimit.Rule{{Method: byMethod, Key: grpclimit.MetadataKey("x-tenant")}}, nil)
	require.NoError(t, err)
	client := serve(t, interceptors(lim)...)

	const calls = 10
	type outcome struct {
		method  string
		err     error
		trailer metadata.MD
	}
	out := make(chan outcome, 3*calls)
	var wg sync.WaitGroup
	for range calls {
		ctx := tenant(context.Background(), "acme")
		wg.Go(func() {
			var trailer metadata.MD
			_, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
			out <- outcome{"check", err, trailer}
		})
		wg.Go(func() {
			var trailer metadata.MD
			_, err := client.List(ctx, &healthpb.HealthListRequest{}, grpc.Trailer(&trailer))
			out <- outcome{"list", err, trailer}
		})
		wg.Go(func() {
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			stream, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
			if err == nil {
				_, err = stream.Recv()
			}
			out <- outcome{"watch", err, nil}
		})
	}
	wg.Wait()
	close(out)
	admitted := map[string]int{}
	delay := map[string]time.Duration{"check": 30 * time.Second, "list": 20 * time.Second}
	for o := range out {
		if o.err == nil {
			admitted[o.method]++
			continue
		}
		require.Contains(t, delay, o.method, "%s: %v", o.method, o.err)
		requireDenied(t, o.err, o.trailer, delay[o.method], o.method)
	}
	require.Equal(t, map[string]int{"check": 2, "list": 3, "watch": calls}, admitted)
}

// TestCheckServer: a Method that names a limit the limiter lacks is reported
// by CheckServer, and a call it maps there ends with Internal, logged.
func TestCheckServer(t *testing.T) {
	limiter := sqliteLimiter(t, migrated, map[string]txlimit.Config{"check": perMinute(2)}, nil)
	logs := &logBuffer{}
	lim, err := grpclimit.NewAll(limiter, []grpclimit.Rule{{
		Method: func(fullMethod string) string {
			if fullMethod == checkMethod {
				return "check"
			}
			return "lists" // a typo: the limiter has no such limit
		},
		Key: grpclimit.MetadataKey("x-tenant"),
	}}, &grpclimit.Options{Logger: logs.logger()})
	require.NoError(t, err)

	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, healthServer{})
	err = lim.CheckServer(srv)
	require.Error(t, err)
	require.Contains(t, err.Error(), `maps /grpc.health.v1.Health/List to "lists", which is not a limit of the limiter`)
	require.Contains(t, err.Error(), `maps /grpc.health.v1.Health/Watch to "lists"`)
	require.NotContains(t, err.Error(), "/Check")

	good, err := grpclimit.NewAll(limiter, []grpclimit.Rule{{
		Method: func(fullMethod string) string {
			if fullMethod == checkMethod {
				return "check"
			}
			return ""
		},
		Key: grpclimit.MetadataKey("x-tenant"),
	}}, nil)
	require.NoError(t, err)
	require.NoError(t, good.CheckServer(srv))

	client := serve(t, interceptors(lim)...)
	_, err = client.List(tenant(context.Background(), "acme"), &healthpb.HealthListRequest{})
	require.Equal(t, codes.Internal, status.Code(err), "%v", err)
	require.NotContains(t, err.Error(), "lists", "the cause is shown to the client")
	rec := logs.only(t)
	require.Equal(t, listMethod, rec["method"])
	require.Equal(t, []any{"lists"}, rec["limits"])
	require.Contains(t, rec["err"], `limit "lists": name is not a limit given to txlimit.New`)
}

// healthServer is a health service whose methods are never called.
type healthServer struct {
	healthpb.UnimplementedHealthServer
}

func TestCount(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) { t.Parallel(); testCount(t, sqliteLimiter) })
	t.Run("postgres", func(t *testing.T) { t.Parallel(); testCount(t, postgresLimiter) })
}

// testCount takes 2 tokens for a call that names a service, 1 for one that
// does not, from the request message; a count above the capacity is
// Internal, logged, and takes nothing.
func testCount[TTx any](t *testing.T, open opener[TTx]) {
	limiter := open(t, migrated, map[string]txlimit.Config{"api": perMinute(5)}, &txlimit.Options{Clock: frozen})
	logs := &logBuffer{}
	lim, err := grpclimit.New(limiter, "api", grpclimit.MetadataKey("x-tenant"), &grpclimit.Options{
		Count: func(_ context.Context, _ string, req any) float64 {
			switch req.(*healthpb.HealthCheckRequest).GetService() {
			case "":
				return 1
			case "huge":
				return 6
			}
			return 2
		},
		Logger: logs.logger(),
	})
	require.NoError(t, err)
	client := serve(t, interceptors(lim)...)
	call := func(service string) (metadata.MD, error) {
		var trailer metadata.MD
		_, err := client.Check(tenant(context.Background(), "acme"), &healthpb.HealthCheckRequest{Service: service}, grpc.Trailer(&trailer))
		return trailer, err
	}

	_, err = client.Check(tenant(context.Background(), "acme"), &healthpb.HealthCheckRequest{Service: "huge"})
	require.Equal(t, codes.Internal, status.Code(err), "%v", err)
	rec := logs.only(t)
	require.Equal(t, checkMethod, rec["method"])
	require.Contains(t, rec["err"], "Capacity")

	// 2 + 2 of 5, then a call of 2 is denied (one token short: 12s), and
	// one of 1 is admitted.
	_, err = call("a")
	require.NotEqual(t, codes.ResourceExhausted, status.Code(err)) // NotFound: the health server knows no "a"
	_, err = call("b")
	require.NotEqual(t, codes.ResourceExhausted, status.Code(err))
	trailer, err := call("c")
	requireDenied(t, err, trailer, 12*time.Second, "api")
	_, err = call("")
	require.NoError(t, err)
	trailer, err = call("")
	requireDenied(t, err, trailer, 12*time.Second, "api")
	require.Empty(t, logs.records(t), "a denial is not logged")
}

func TestStoreErrors(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) { t.Parallel(); testStoreErrors(t, sqliteLimiter) })
	t.Run("postgres", func(t *testing.T) { t.Parallel(); testStoreErrors(t, postgresLimiter) })
}

// testStoreErrors: a closed database ends calls with Unavailable, a database
// without txlimit's table with Internal, both logged and hidden from the
// client; with txlimit.Options.FailOpen the closed database lets calls
// through, and the Observer gets the error; Options.Error replaces the
// answer.
func testStoreErrors[TTx any](t *testing.T, open opener[TTx]) {
	limits := map[string]txlimit.Config{"api": perMinute(5)}
	for _, tc := range []struct {
		state dbState
		code  codes.Code
	}{{closed, codes.Unavailable}, {unmigrated, codes.Internal}} {
		logs := &logBuffer{}
		lim, err := grpclimit.New(open(t, tc.state, limits, nil), "api", grpclimit.MetadataKey("x-tenant"),
			&grpclimit.Options{Logger: logs.logger()})
		require.NoError(t, err)
		client := serve(t, interceptors(lim)...)
		trailer, err := check(client, "acme")
		require.Equal(t, tc.code, status.Code(err), "%v", err)
		require.Empty(t, trailer.Get(grpclimit.RetryAfterKey))
		rec := logs.only(t)
		require.Equal(t, "ERROR", rec["level"])
		require.Equal(t, "grpclimit: answered "+tc.code.String()+": the limit could not be applied", rec["msg"])
		require.Equal(t, checkMethod, rec["method"])
		require.Equal(t, []any{"api"}, rec["limits"])
		require.NotEmpty(t, rec["err"])
		require.NotContains(t, status.Convert(err).Message(), rec["err"].(string), "the cause is shown to the client")
		if tc.state == unmigrated {
			require.Contains(t, rec["err"], "migrations.Up")
		}
	}

	// FailOpen: the call goes through, the Observer sees the error, nothing is logged.
	var mu sync.Mutex
	var events []txlimit.Event
	obs := func(_ context.Context, e txlimit.Event) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	}
	logs := &logBuffer{}
	lim, err := grpclimit.New(open(t, closed, limits, &txlimit.Options{FailOpen: true, Observer: obs}), "api",
		grpclimit.MetadataKey("x-tenant"), &grpclimit.Options{Logger: logs.logger()})
	require.NoError(t, err)
	client := serve(t, interceptors(lim)...)
	_, err = check(client, "acme")
	require.NoError(t, err)
	require.Empty(t, logs.records(t))
	mu.Lock()
	require.Len(t, events, 1)
	require.True(t, events[0].FailedOpen)
	require.Equal(t, "database", events[0].ErrorKind)
	mu.Unlock()

	// Options.Error: the application decides, here to let calls through.
	var seen []error
	lim, err = grpclimit.New(open(t, closed, limits, nil), "api", grpclimit.MetadataKey("x-tenant"),
		&grpclimit.Options{Error: func(_ context.Context, fullMethod string, err error) error {
			require.Equal(t, checkMethod, fullMethod)
			seen = append(seen, err)
			return nil
		}})
	require.NoError(t, err)
	client = serve(t, interceptors(lim)...)
	_, err = check(client, "acme")
	require.NoError(t, err)
	require.Len(t, seen, 1)
}

// TestKeyErrors: a key error that carries a status keeps it, unlogged; any
// other is Internal, logged; MetadataKey refuses missing, repeated and
// invalid values with InvalidArgument. Nothing is taken from the limit.
func TestKeyErrors(t *testing.T) {
	ctx := context.Background()
	limiter := sqliteLimiter(t, migrated, map[string]txlimit.Config{"api": perMinute(5)}, &txlimit.Options{Clock: frozen})
	logs := &logBuffer{}
	opts := &grpclimit.Options{Logger: logs.logger()}

	unauth, err := grpclimit.New(limiter, "api", func(context.Context, string, any) (string, error) {
		return "", fmt.Errorf("session: %w", status.Error(codes.Unauthenticated, "sign in first"))
	}, opts)
	require.NoError(t, err)
	client := serve(t, interceptors(unauth)...)
	_, err = client.Check(ctx, &healthpb.HealthCheckRequest{})
	require.Equal(t, codes.Unauthenticated, status.Code(err))
	require.Equal(t, "sign in first", status.Convert(err).Message())
	stream, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	_, err = stream.Recv()
	require.Equal(t, codes.Unauthenticated, status.Code(err))
	require.Empty(t, logs.records(t))

	plain, err := grpclimit.New(limiter, "api", func(context.Context, string, any) (string, error) {
		return "", errors.New("no user in the context")
	}, opts)
	require.NoError(t, err)
	client = serve(t, interceptors(plain)...)
	_, err = client.Check(ctx, &healthpb.HealthCheckRequest{})
	require.Equal(t, codes.Internal, status.Code(err))
	rec := logs.only(t)
	require.Equal(t, `grpclimit: the key of limit "api": no user in the context`, rec["err"])

	byTenant, err := grpclimit.New(limiter, "api", grpclimit.MetadataKey("x-tenant"), opts)
	require.NoError(t, err)
	client = serve(t, interceptors(byTenant)...)
	for _, tc := range []struct {
		md   metadata.MD
		want string
	}{
		{metadata.MD{}, `missing metadata "x-tenant"`},
		{metadata.Pairs("x-tenant", ""), `missing metadata "x-tenant"`},
		{metadata.Pairs("x-tenant", "acme", "x-tenant", "globex"), `metadata "x-tenant" is given 2 times`},
		{metadata.Pairs("x-tenant", strings.Repeat("a", 2048+1)), `is 2049 bytes long`},
	} {
		_, err = client.Check(metadata.NewOutgoingContext(ctx, tc.md), &healthpb.HealthCheckRequest{})
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", tc.md)
		require.Contains(t, status.Convert(err).Message(), tc.want)
	}
	require.Empty(t, logs.records(t))
	read, err := limiter.Check(ctx, "api", "acme", txlimit.Count(0))
	require.NoError(t, err)
	require.InDelta(t, 5, read.Remaining, 1e-9)
}

// TestNewErrors: invalid arguments are errors that name the fix.
func TestNewErrors(t *testing.T) {
	limiter := sqliteLimiter(t, migrated, map[string]txlimit.Config{"api": perMinute(5)}, nil)
	key := grpclimit.MetadataKey("x-tenant")
	method := func(string) string { return "api" }
	cases := []struct {
		err  string
		make func() error
	}{
		{"the limiter is nil", func() error {
			_, err := grpclimit.New[any](nil, "api", key, nil)
			return err
		}},
		{"the limit's name is empty", func() error { _, err := grpclimit.New(limiter, "", key, nil); return err }},
		{`"nosuch" is not a limit of the limiter`, func() error { _, err := grpclimit.New(limiter, "nosuch", key, nil); return err }},
		{"has no Key", func() error { _, err := grpclimit.New(limiter, "api", nil, nil); return err }},
		{"NewAll has no rules", func() error { _, err := grpclimit.NewAll(limiter, nil, nil); return err }},
		{"Options.Count is set for NewAll", func() error {
			_, err := grpclimit.NewAll(limiter, []grpclimit.Rule{{Name: "api", Key: key}},
				&grpclimit.Options{Count: func(context.Context, string, any) float64 { return 1 }})
			return err
		}},
		{"sets both Name", func() error {
			_, err := grpclimit.NewAll(limiter, []grpclimit.Rule{{Name: "api", Method: method, Key: key}}, nil)
			return err
		}},
		{"has neither Name nor Method", func() error {
			_, err := grpclimit.NewAll(limiter, []grpclimit.Rule{{Key: key}}, nil)
			return err
		}},
		{"rule 1 (chosen by Method) has no Key", func() error {
			_, err := grpclimit.NewAll(limiter, []grpclimit.Rule{{Name: "api", Key: key}, {Method: method}}, nil)
			return err
		}},
	}
	for _, tc := range cases {
		err := tc.make()
		require.Error(t, err, tc.err)
		require.Contains(t, err.Error(), tc.err)
	}
}

// logBuffer collects JSON log records; it is safe for concurrent use.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) logger() *slog.Logger { return slog.New(slog.NewJSONHandler(b, nil)) }

// records returns the records logged since the last call, and forgets them.
func (b *logBuffer) records(t *testing.T) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for line := range strings.Lines(b.buf.String()) {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec))
		out = append(out, rec)
	}
	b.buf.Reset()
	return out
}

// only returns the one record logged since the last call.
func (b *logBuffer) only(t *testing.T) map[string]any {
	t.Helper()
	recs := b.records(t)
	require.Len(t, recs, 1, "%v", recs)
	return recs[0]
}

// txHealth is a health service whose Check takes a token in its own
// transaction, and rolls it back for the service "fail".
type txHealth struct {
	healthpb.UnimplementedHealthServer
	db      *sql.DB
	limiter *txlimit.Limiter[*sql.Tx]
}

func (h txHealth) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	tx, err := h.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback() }()
	res, err := h.limiter.LimitTx(ctx, tx, "api", "acme")
	if err != nil {
		return nil, err
	}
	if !res.OK {
		return nil, grpclimit.DeniedError(ctx, res)
	}
	if req.GetService() == "fail" {
		return nil, status.Error(codes.Aborted, "the work failed; its token comes back")
	}
	if err := tx.Commit(); err != nil {
		return nil, err
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// TestDeniedError: a handler that takes its token in its own transaction
// answers a denial as the interceptors do, and a rolled-back call costs
// nothing.
func TestDeniedError(t *testing.T) {
	limiter, db := sqliteLimiterDB(t, migrated, map[string]txlimit.Config{"api": perMinute(2)}, &txlimit.Options{Clock: frozen})
	client := serveHealth(t, txHealth{db: db, limiter: limiter})
	call := func(service string) (metadata.MD, error) {
		var trailer metadata.MD
		_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{Service: service}, grpc.Trailer(&trailer))
		return trailer, err
	}
	_, err := call("")
	require.NoError(t, err)
	_, err = call("fail")
	require.Equal(t, codes.Aborted, status.Code(err))
	_, err = call("")
	require.NoError(t, err)
	trailer, err := call("")
	requireDenied(t, err, trailer, 30*time.Second, "api")

	require.NoError(t, grpclimit.DeniedError(context.Background(), txlimit.Result{Name: "api", OK: true}))
}

// TestContextErrors: a call whose context is cancelled or past its deadline
// when the limit is applied ends with Canceled or DeadlineExceeded, unlogged,
// and takes nothing.
func TestContextErrors(t *testing.T) {
	limiter := sqliteLimiter(t, migrated, map[string]txlimit.Config{"api": perMinute(5)}, &txlimit.Options{Clock: frozen})
	logs := &logBuffer{}
	lim, err := grpclimit.New(limiter, "api", grpclimit.MetadataKey("x-tenant"), &grpclimit.Options{Logger: logs.logger()})
	require.NoError(t, err)
	for _, tc := range []struct {
		end  func(context.Context) context.Context
		code codes.Code
	}{
		{func(ctx context.Context) context.Context {
			ctx, cancel := context.WithCancel(ctx)
			cancel()
			return ctx
		}, codes.Canceled},
		{func(ctx context.Context) context.Context {
			ctx, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
			t.Cleanup(cancel)
			return ctx
		}, codes.DeadlineExceeded},
	} {
		// An interceptor before the limit ends the call's context, as a
		// client that goes away would, but the client still reads the answer.
		end := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			return h(tc.end(ctx), req)
		})
		client := serve(t, append([]grpc.ServerOption{end}, interceptors(lim)...)...)
		trailer, err := check(client, "acme")
		require.Equal(t, tc.code, status.Code(err), "%v", err)
		require.Empty(t, trailer.Get(grpclimit.RetryAfterKey))
	}
	require.Empty(t, logs.records(t))
	read, err := limiter.Check(context.Background(), "api", "acme", txlimit.Count(0))
	require.NoError(t, err)
	require.InDelta(t, 5, read.Remaining, 1e-9)
}
