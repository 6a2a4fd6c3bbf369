package driver

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit/algo"
)

func TestPause(t *testing.T) {
	now := time.UnixMicro(1_700_000_000_000_000)
	l := Limit{Name: "n", Key: "k", Shards: 2, Config: algo.Config{Kind: algo.TokenBucket, Rate: 8, Period: 60_000_000, Capacity: 8}}
	full := l.Full()
	row := func(shard int32, paused time.Time) Row {
		return Row{Shard: shard, Value: full.Value, TS: time.UnixMicro(full.TS), Paused: paused}
	}

	// The latest pause after now; ended ones and none are zero.
	require.True(t, LivePause(nil, now).IsZero())
	require.True(t, LivePause([]Row{row(0, now), row(1, now.Add(-time.Hour))}, now).IsZero(), "a pause ends at its instant")
	require.Equal(t, now.Add(2*time.Second), LivePause([]Row{row(0, now.Add(time.Second)), row(1, now.Add(2*time.Second))}, now))

	// RetryAfter is the time left, rounded up to the microsecond, bounded.
	require.Equal(t, algo.Decision{RetryAfter: 90_000_000}, PausedDecision(now.Add(90*time.Second), now))
	require.Equal(t, algo.Decision{RetryAfter: 1}, PausedDecision(now.Add(time.Nanosecond), now))
	require.Equal(t, algo.Decision{RetryAfter: algo.MaxWait}, PausedDecision(time.UnixMicro(1<<62), now))

	paused := []Row{row(0, now.Add(time.Minute)), row(1, now.Add(time.Minute))}
	for _, p := range []TakeParams{{Limit: l, Count: 1}, {Limit: l, Count: 3, Reserve: true}, {Limit: l, Count: 2, UpTo: true}} {
		res, write := Decide(p, paused, now)
		require.False(t, res.Decision.OK)
		require.True(t, res.Paused)
		require.Zero(t, res.Taken)
		require.Equal(t, int64(60_000_000), res.Decision.RetryAfter)
		require.False(t, write, "a denial of a paused key writes nothing")
		require.Equal(t, []algo.State{full, full}, res.States)
		checked := Check(p, ReadResult{Rows: paused, At: now})
		require.Equal(t, res, checked)
		// At the pause's instant the tokens decide.
		res, write = Decide(p, paused, now.Add(time.Minute))
		require.True(t, res.Decision.OK)
		require.False(t, res.Paused)
		require.True(t, write)
	}
	other := Limit{Name: "m", Key: "k", Shards: 1, Config: l.Config}
	all, writes := DecideAll(TakeAllParams{Takes: []TakeParams{{Limit: other, Count: 1}, {Limit: l, Count: 1}}}, [][]Row{nil, paused}, now)
	require.False(t, all.OK)
	require.Equal(t, [][]Row{nil, nil}, writes, "all or none: nothing is written")
	require.False(t, all.Results[0].Paused)
	require.True(t, all.Results[0].Decision.OK, "the other limit's own decision")
	require.True(t, all.Results[1].Paused)
	require.Zero(t, all.Results[1].Taken)

	// Prune keeps full rows while they are paused.
	prune := PruneParams{Limits: map[string]LimitConfig{"n": {Config: l.Config, Shards: 2}}}
	require.False(t, prune.Full("n", "k", paused, now))
	require.True(t, prune.Full("n", "k", paused, now.Add(time.Minute)))
}
