package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
)

// exerciseHolders runs holders and release on the database dsn, where the
// application's Limiter l acquires slots of a concurrency limit: a live
// holder, an expired one, and a key with an awkward name.
func exerciseHolders[TTx any](t *testing.T, dsn string, l *txlimit.Limiter[TTx]) {
	ctx := context.Background()
	exports := txlimit.Inline(txlimit.Config{Kind: txlimit.Concurrency, Capacity: 3, HoldFor: time.Hour})
	gone := txlimit.Inline(txlimit.Config{Kind: txlimit.Concurrency, Capacity: 3, HoldFor: time.Millisecond})
	for _, holder := range []string{"job-1", "job 2"} {
		res, err := l.Limit(ctx, "exports", "acme", exports, txlimit.Holder(holder))
		require.NoError(t, err)
		require.True(t, res.OK)
	}
	res, err := l.Limit(ctx, "exports", "acme", gone, txlimit.Holder("job-0"))
	require.NoError(t, err)
	require.True(t, res.OK)
	time.Sleep(5 * time.Millisecond) // job-0's HoldFor has passed on the database's clock too

	out := ok(t, "holders", "exports", "acme", "-dsn", dsn)
	require.Contains(t, out, "limit exports, key acme: 2 live holder(s), 1 expired")
	require.Regexp(t, `(?m)^HOLDER\s+EXPIRES AT\s+LEFT$`, out)
	require.Regexp(t, `(?m)^job-0\s+\S+\s+expired$`, out)
	require.Regexp(t, `(?m)^"job 2"\s+\S+\s+(59m|1h)\S*$`, out)
	var got holdersOutput
	require.NoError(t, json.Unmarshal([]byte(ok(t, "holders", "exports", "acme", "-dsn", dsn, "-json")), &got))
	require.Equal(t, 2, got.Live)
	require.Len(t, got.Holders, 3)
	require.Equal(t, "job-0", got.Holders[0].Holder, "in order of expiry")
	require.False(t, got.Holders[0].Live)
	require.Contains(t, ok(t, "holders", "exports", "nobody", "-dsn", dsn), "limit exports, key nobody: 0 live holder(s)\n")

	require.Contains(t, ok(t, "release", "exports", "acme", "job 2", "-dsn", dsn), `limit exports, key acme: released holder "job 2"; its slot is free`)
	require.Contains(t, ok(t, "release", "exports", "acme", "job 2", "-dsn", dsn), "held no live slot")
	require.Contains(t, ok(t, "release", "exports", "acme", "job-0", "-dsn", dsn), "held no live slot (released already, expired or reclaimed)")
	checked, err := l.Check(ctx, "exports", "acme", exports, txlimit.Count(0))
	require.NoError(t, err)
	require.Equal(t, 2.0, checked.Remaining, "job-1 alone holds a slot")
	require.Contains(t, ok(t, "holders", "exports", "acme", "-dsn", dsn), "1 live holder(s)\n")

	require.Contains(t, fails(t, exitUsage, "release", "exports", "acme", "-dsn", dsn), "release takes three arguments, NAME KEY HOLDER")
	require.Contains(t, fails(t, exitUsage, "release", "exports", "acme", "", "-dsn", dsn), "Holder")
	require.Contains(t, fails(t, exitUsage, "holders", "exports", "bad\x00key", "-dsn", dsn), "key")
	// Reset deletes the holders too.
	require.NoError(t, l.Reset(ctx, "exports", "acme"))
	require.Contains(t, ok(t, "holders", "exports", "acme", "-dsn", dsn), "0 live holder(s)\n")
}
