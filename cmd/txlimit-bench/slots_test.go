package main

import (
	"bytes"
	"context"
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit/internal/testkit/testdb"
)

// TestCheckHeldRejectsWrongAnswers feeds the slots check the outcomes of
// right and wrong semaphores: it passes a run that filled the slots, never
// held more, denied some call and ended with every slot free; it fails the
// rest.
func TestCheckHeldRejectsWrongAnswers(t *testing.T) {
	for name, tc := range map[string]struct {
		most   int64
		denied bool
		free   float64
		ok     bool
	}{
		"right":                            {slotCapacity, true, slotCapacity, true},
		"one held too many":                {slotCapacity + 1, true, slotCapacity, false},
		"never filled":                     {slotCapacity - 1, true, slotCapacity, false},
		"no call denied":                   {slotCapacity, false, slotCapacity, false},
		"a slot left taken at the end":     {slotCapacity, true, slotCapacity - 1, false},
		"a slot given back twice":          {slotCapacity, true, slotCapacity + 1, false},
		"every slot held, none given back": {slotCapacity, true, 0, false},
	} {
		t.Run(name, func(t *testing.T) {
			spec := slotSpec("slots")
			spec.held.most.Store(tc.most)
			admitted := int64(40)
			if !tc.denied {
				admitted = 100
			}
			st := runStats{ops: 100, admitted: admitted,
				perKey: map[string]int64{"hot": 40}, values: map[string]float64{"hot": tc.free}}
			c := checkHeld("slots", spec, st)
			require.Equal(t, tc.ok, c.OK, c.Detail)
		})
	}
}

// TestCheckAllReleased: a timed run of a slot subject passes when every
// call was granted and every key has all its slots free again.
func TestCheckAllReleased(t *testing.T) {
	spec := timedSpec("timed", 1)
	st := func(admitted int64, free float64) runStats {
		return runStats{ops: 50, admitted: admitted, perKey: map[string]int64{"k": admitted}, values: map[string]float64{"k": free}}
	}
	require.True(t, checkAllReleased("ok", spec, st(50, spec.Capacity)).OK)
	require.False(t, checkAllReleased("denied", spec, st(49, spec.Capacity)).OK)
	require.False(t, checkAllReleased("kept", spec, st(50, spec.Capacity-1)).OK)
}

// TestSlotSubjects runs only the slot subjects (-subjects), at 8 clients:
// their rows are compared with the Redis semaphore and with distinct keys,
// every timed run released every slot, and on the hot key at most 3 slots
// were held at once, and at some point all 3.
func TestSlotSubjects(t *testing.T) {
	if testing.Short() {
		t.Skip("a short run against PostgreSQL and Redis; skipped under -short")
	}
	addr := testRedis(t)
	cfg, err := parseFlags([]string{"-dsn", testdb.URL(t), "-redis", addr, "-sqlite=false", "-quick",
		"-clients", "8", "-shards", "", "-subjects", "txlimit/slot,redis/semaphore"}, io.Discard)
	require.NoError(t, err)
	var stdout bytes.Buffer
	rep, err := run(context.Background(), cfg, &stdout)
	t.Log(stdout.String())
	require.NoError(t, err)
	cells := map[string]int{}
	for _, r := range rep.Rows {
		cells[r.Scenario+" "+r.Impl]++
		if r.Impl == implSlot {
			require.Positive(t, r.VsSemaphore, r.Scenario)
		}
		if r.Scenario == "slots-hot" {
			require.Positive(t, r.VsDistinct, r.Impl)
		}
	}
	require.Equal(t, map[string]int{"slots txlimit/slot": 1, "slots redis/semaphore": 1, "slots-hot txlimit/slot": 1, "slots-hot redis/semaphore": 1}, cells)
	// A timed check per row, the slots check for each subject on the hot
	// key.
	require.Len(t, rep.Checks, 4+2)
	for _, c := range rep.Checks {
		require.True(t, c.OK, "%s: %s", c.Name, c.Detail)
	}
	require.Contains(t, stdout.String(), "concurrency slots around a business transaction")
	require.Zero(t, redisKeys(t, addr, rep.redisKeys), "every Redis key of the run is deleted")
}
