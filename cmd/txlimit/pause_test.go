package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
)

// exercisePause runs pause, paused and lift on the database dsn, where the
// application's Limiter l (with the limits of config) takes from the keys
// the command pauses.
func exercisePause[TTx any](t *testing.T, dsn, config string, l *txlimit.Limiter[TTx]) {
	ctx := context.Background()
	require.Contains(t, ok(t, "paused", "-dsn", dsn), "0 paused key(s) of every limit")

	// A key with state (alice, of a sharded limit) and one without (erin).
	out := ok(t, "pause", "send", "alice", "2h", "-dsn", dsn, "-config", config)
	require.Regexp(t, `limit send, key alice: paused until \S+ \(2h0m0s from now\): every call is denied until then; txlimit lift send alice lifts it`, out)
	until := time.Now().Add(30 * time.Minute).UTC().Truncate(time.Second)
	out = ok(t, "pause", "tb", "erin", until.Format(time.RFC3339), "-dsn", dsn, "-kind", "token_bucket", "-rate", "5", "-period", "1h", "-shards", "4")
	require.Contains(t, out, "limit tb, key erin: paused until "+until.Format(time.RFC3339Nano))
	for key, left := range map[string]time.Duration{"alice": 2 * time.Hour, "erin": 30 * time.Minute} {
		name := map[string]string{"alice": "send", "erin": "tb"}[key]
		res, err := l.Limit(ctx, name, key)
		require.NoError(t, err)
		require.False(t, res.OK, "%s %s", name, key)
		require.True(t, res.Paused)
		require.InDelta(t, float64(left), float64(res.RetryAfter), float64(time.Minute), "%s %s: %v", name, key, res.RetryAfter)
	}

	// paused lists them, the soonest to end first.
	out = ok(t, "paused", "-dsn", dsn)
	require.Contains(t, out, "2 paused key(s) of every limit")
	require.Regexp(t, `(?m)^NAME\s+KEY\s+UNTIL\s+LEFT$`, out)
	require.Regexp(t, `(?m)^tb\s+erin\s+`+until.Format(time.RFC3339)+`\s+(29m|30m)\S*\n^send\s+alice\s+\S+\s+(1h59m|2h)\S*$`, out)
	var got pausedOutput
	require.NoError(t, json.Unmarshal([]byte(ok(t, "paused", "send", "-dsn", dsn, "-json")), &got))
	require.Len(t, got.Keys, 1)
	require.Equal(t, "alice", got.Keys[0].Key)
	require.WithinDuration(t, got.At.Add(2*time.Hour), got.Keys[0].Until, time.Minute)

	// lift: the application takes again; a second lift has nothing to do.
	require.Contains(t, ok(t, "lift", "send", "alice", "-dsn", dsn), "limit send, key alice: lifted the pause that would have ended at ")
	res, err := l.Limit(ctx, "send", "alice")
	require.NoError(t, err)
	require.True(t, res.OK, "%+v", res)
	require.Contains(t, ok(t, "lift", "send", "alice", "-dsn", dsn), "limit send, key alice was not paused: nothing to lift")
	require.Contains(t, ok(t, "lift", "send", "nobody", "-dsn", dsn), "was not paused")
	require.Contains(t, ok(t, "paused", "-dsn", dsn), "1 paused key(s) of every limit")
	require.Contains(t, ok(t, "lift", "tb", "erin", "-dsn", dsn), "lifted the pause")
	require.Contains(t, ok(t, "paused", "-dsn", dsn), "0 paused key(s)")

	// Bad input pauses nothing.
	require.Contains(t, fails(t, exitUsage, "pause", "send", "bob", "-dsn", dsn, "-config", config, "--", "-1h"), "is not after now")
	require.Contains(t, fails(t, exitUsage, "pause", "send", "bob", "2001-01-01T00:00:00Z", "-dsn", dsn, "-config", config), "is not after the clock")
	require.Contains(t, fails(t, exitUsage, "pause", "send", "bob", "tomorrow", "-dsn", dsn, "-config", config), "neither an RFC 3339 instant")
	require.Contains(t, fails(t, exitUsage, "pause", "unknown", "bob", "1h", "-dsn", dsn, "-config", config), `no config for limit "unknown"`)
	require.Contains(t, fails(t, exitUsage, "pause", "send", "bob", "-dsn", dsn), "pause takes three arguments, NAME KEY UNTIL")
	require.Contains(t, fails(t, exitUsage, "lift", "send", "bad\x00key", "-dsn", dsn), "key")
	require.Contains(t, ok(t, "paused", "-dsn", dsn), "0 paused key(s)")
}
