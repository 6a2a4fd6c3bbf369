package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCheckHeldRejectsWrongAnswers feeds the slots check the outcomes of
// right and wrong semaphores: it passes a run that filled the slots, never
// held more, saw every client denied and ended with every slot free; it
// fails the rest.
func TestCheckHeldRejectsWrongAnswers(t *testing.T) {
	for name, tc := range map[string]struct {
		most      int64
		allDenied bool
		free      float64
		ok        bool
	}{
		"right":                            {slotCapacity, true, slotCapacity, true},
		"one held too many":                {slotCapacity + 1, true, slotCapacity, false},
		"never filled":                     {slotCapacity - 1, true, slotCapacity, false},
		"a client never denied":            {slotCapacity, false, slotCapacity, false},
		"a slot left taken at the end":     {slotCapacity, true, slotCapacity - 1, false},
		"a slot given back twice":          {slotCapacity, true, slotCapacity + 1, false},
		"every slot held, none given back": {slotCapacity, true, 0, false},
	} {
		t.Run(name, func(t *testing.T) {
			spec := slotSpec("slots")
			spec.held.most.Store(tc.most)
			st := runStats{ops: 100, admitted: 40, allDenied: tc.allDenied,
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
