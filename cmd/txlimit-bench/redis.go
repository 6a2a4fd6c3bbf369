package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// fixedWindowScript is the limiter a user runs today beside the database
// (seed document 003): a fixed window per key on Redis's own clock, one
// EVAL, so the check and the count are atomic and app servers with skewed
// clocks agree. KEYS[1] is the key's prefix, ARGV[1] the window in seconds,
// ARGV[2] the calls admitted per window. It counts every call, admitted or
// not, and answers {admitted (1 or 0), calls this window, seconds to the
// window's end}.
const fixedWindowScript = `
local window_seconds = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local now = redis.call('TIME')
local key = KEYS[1] .. ':' .. math.floor(tonumber(now[1]) / window_seconds)
local calls = redis.call('INCR', key)
if calls == 1 then
  redis.call('EXPIRE', key, window_seconds)
end
local ttl = redis.call('TTL', key)
if calls > limit then
  return {0, calls, ttl}
end
return {1, calls, ttl}
`

// keyPrefix starts every key the bench writes to Redis, which may be shared:
// txlimit-bench:<run id>:<limit name>:<key>:<window>.
const keyPrefix = "txlimit-bench:"

// redisEnv is the Redis of one run: a client whose pool serves every bench
// client a connection of its own, and the windows each key was first seen
// in, to read its counters back.
type redisEnv struct {
	rdb     *redis.Client
	runID   string
	version string
	script  *redis.Script
	// semaphore is the sorted-set semaphore's acquire (slots.go).
	semaphore *redis.Script
	// trace is the tracer of the pool being measured: the Redis commands
	// are counted and timed with its PostgreSQL statements.
	trace atomic.Pointer[tracer]

	mu    sync.Mutex
	first map[string]int64 // window of each key when its first client opened
	last  map[string]int64 // window of each key at its last value read
}

// openRedis connects to the Redis at addr with room for conns clients at
// once. cleanup deletes every key of the run and closes the client.
func openRedis(ctx context.Context, addr string, conns int) (env *redisEnv, cleanup func(), err error) {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	env = &redisEnv{
		runID:     hex.EncodeToString(b),
		script:    redis.NewScript(fixedWindowScript),
		semaphore: redis.NewScript(semaphoreScript),
		first:     map[string]int64{},
		last:      map[string]int64{},
	}
	env.rdb = redis.NewClient(&redis.Options{
		Addr:     addr,
		PoolSize: conns,
		// The bench clients hold their connections for a whole run.
		PoolTimeout: time.Minute,
	})
	env.rdb.AddHook(redisHook{env})
	info, err := env.rdb.Info(ctx, "server").Result()
	if err != nil {
		_ = env.rdb.Close()
		return nil, nil, fmt.Errorf("redis at -redis %s does not answer (%w); start one (scripts/redis.sh) or leave Redis out with -redis=", addr, err)
	}
	env.version = "Redis"
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			env.version = "Redis " + v
		}
	}
	cleanup = func() {
		// The run's context may be cancelled by now; the keys go anyway.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if n, err := env.deleteKeys(ctx); err != nil {
			fmt.Fprintf(os.Stderr, "txlimit-bench: could not delete Redis keys %s (%d deleted): %v\n", env.pattern(), n, err)
		}
		_ = env.rdb.Close()
	}
	return env, cleanup, nil
}

// pattern matches every key of the run.
func (e *redisEnv) pattern() string { return keyPrefix + e.runID + ":*" }

// deleteKeys deletes every key of the run, redis_rate's ("rate:" before
// the run's own) too, and returns how many it deleted.
func (e *redisEnv) deleteKeys(ctx context.Context) (int64, error) {
	var deleted int64
	for _, pattern := range []string{e.pattern(), "rate:" + e.pattern()} {
		n, err := e.deleteMatching(ctx, pattern)
		deleted += n
		if err != nil {
			return deleted, err
		}
	}
	return deleted, nil
}

func (e *redisEnv) deleteMatching(ctx context.Context, pattern string) (int64, error) {
	var deleted int64
	iter := e.rdb.Scan(ctx, 0, pattern, 1000).Iterator()
	var batch []string
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		n, err := e.rdb.Unlink(ctx, batch...).Result()
		deleted += n
		batch = batch[:0]
		return err
	}
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 500 {
			if err := flush(); err != nil {
				return deleted, err
			}
		}
	}
	if err := iter.Err(); err != nil {
		return deleted, err
	}
	return deleted, flush()
}

// key is the prefix of spec's key on Redis; the script appends the window.
func (e *redisEnv) key(spec limitSpec, key string) string {
	return keyPrefix + e.runID + ":" + spec.Name + ":" + key
}

// window is the window Redis's clock is in now, as the script computes it.
func (e *redisEnv) window(ctx context.Context, spec limitSpec) (int64, error) {
	now, err := e.rdb.Time(ctx).Result()
	if err != nil {
		return 0, err
	}
	return now.Unix() / windowSeconds(spec), nil
}

func windowSeconds(spec limitSpec) int64 { return int64(spec.Period / time.Second) }

// redisLimit is the Redis limiter called beside a business transaction on
// PostgreSQL, as its users do today: BEGIN; INSERT …; EVALSHA (EVAL when the
// script is not cached yet); COMMIT. Its limit is a fixed window: Capacity
// calls per Period (whole seconds) on Redis's clock; Rate is not used.
type redisLimit struct {
	env *redisEnv
	p   *pgPool
}

func (s redisLimit) newClient(ctx context.Context, spec limitSpec, key string, wk work) (client, error) {
	switch {
	case spec.Clock != nil:
		return nil, errors.New("the Redis limiter reads Redis's clock: it cannot run on an injected one")
	case spec.Period < time.Second || spec.Period%time.Second != 0:
		return nil, fmt.Errorf("the Redis limiter's window is whole seconds, got %v", spec.Period)
	}
	k := s.env.key(spec, key)
	w, err := s.env.window(ctx, spec)
	if err != nil {
		return nil, err
	}
	s.env.mu.Lock()
	if _, seen := s.env.first[k]; !seen {
		s.env.first[k] = w
	}
	s.env.mu.Unlock()
	conn, err := s.p.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	rc := s.env.rdb.Conn()
	keys, args := []string{k}, []any{windowSeconds(spec), int64(spec.Capacity)}
	c := newPgClient(conn, key, wk, func(ctx context.Context, _ pgx.Tx) (bool, error) {
		res, err := s.env.script.Run(ctx, rc, keys, args...).Int64Slice()
		if err != nil {
			return false, err
		}
		if len(res) != 3 {
			return false, fmt.Errorf("the script answered %v; want {admitted, calls, ttl}", res)
		}
		return res[0] == 1, nil
	})
	c.release = func() { _ = rc.Close() }
	return c, nil
}

// value is Capacity minus the calls Redis counted for key in every window
// since its first client opened: Capacity - admitted when every call was
// admitted, as for the other subjects.
func (s redisLimit) value(ctx context.Context, spec limitSpec, key string) (float64, error) {
	k := s.env.key(spec, key)
	w, err := s.env.window(ctx, spec)
	if err != nil {
		return 0, err
	}
	s.env.mu.Lock()
	first, ok := s.env.first[k]
	s.env.last[k] = w
	s.env.mu.Unlock()
	if !ok {
		return 0, fmt.Errorf("no client of %q opened", k)
	}
	var calls int64
	for i := first; i <= w; i++ {
		n, err := s.env.rdb.Get(ctx, fmt.Sprintf("%s:%d", k, i)).Int64()
		if err != nil && !errors.Is(err, redis.Nil) {
			return 0, err
		}
		calls += n
	}
	return spec.Capacity - float64(calls), nil
}

func (s redisLimit) windows(spec limitSpec, key string) int {
	k := s.env.key(spec, key)
	s.env.mu.Lock()
	defer s.env.mu.Unlock()
	return int(s.env.last[k]-s.env.first[k]) + 1
}

// redisHook counts (and with -profile times) every command sent to Redis in
// the tracer of the pool being measured, so that rt/op counts the EVALSHA
// beside the PostgreSQL statements.
type redisHook struct{ env *redisEnv }

func (redisHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h redisHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		t := h.env.trace.Load()
		if t == nil {
			return next(ctx, cmd)
		}
		t.redis.Add(1)
		ctx = t.start(ctx, "redis "+strings.ToUpper(cmd.Name()))
		err := next(ctx, cmd)
		t.end(ctx)
		return err
	}
}

func (redisHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
