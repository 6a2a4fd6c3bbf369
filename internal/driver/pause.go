package driver

import (
	"time"

	"github.com/txlimit/txlimit/algo"
)

// PauseParams is one Pause: every row of the key, in Limit's layout (its
// rows created full when the key has none), gets paused_until Until. A zero
// Until, or one not after the clock, lifts the pause (NULL), creating
// nothing.
type PauseParams struct {
	Limit
	Until time.Time
	Now   *time.Time
}

// LivePause is the pause rows hold at now: the latest Paused after now, or
// the zero time when none is.
func LivePause(rows []Row, now time.Time) time.Time {
	var until time.Time
	for _, r := range rows {
		if r.Paused.After(now) && r.Paused.After(until) {
			until = r.Paused
		}
	}
	return until
}

// PausedDecision is the denial of every call on a key paused until until,
// at now: RetryAfter is the time left, in whole microseconds rounded up.
func PausedDecision(until, now time.Time) algo.Decision {
	left := until.Sub(now) // saturates: never beyond MaxWait's bound below
	us := int64(left / time.Microsecond)
	if left%time.Microsecond != 0 {
		us++
	}
	return algo.Decision{RetryAfter: min(us, algo.MaxWait)}
}

// pausedResult is the denial of p on rows paused at now, whose states are
// states, and whether they are paused.
func pausedResult(rows []Row, states []algo.State, now time.Time) (TakeResult, bool) {
	until := LivePause(rows, now)
	if until.IsZero() {
		return TakeResult{}, false
	}
	return TakeResult{Decision: PausedDecision(until, now), At: now, States: states, Paused: true}, true
}
