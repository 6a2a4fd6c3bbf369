package storetest

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/algo"
)

// T0 is the instant a Clock starts at.
var T0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// Clock is an injectable clock (txlimit.Options.Clock: its Now) that only
// moves when told to. It is safe for concurrent use.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a Clock at T0.
func NewClock() *Clock { return &Clock{t: T0} }

// Now is the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock by d, backwards when d is negative.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

var limitSeq atomic.Int64

// UniqueName gives every test its own limit names in a shared table: base
// after the test's name and a number no other call of the test binary gets.
func UniqueName(t testing.TB, base string) string {
	return fmt.Sprintf("%s#%d/%s", t.Name(), limitSeq.Add(1), base)
}

// KindName is kind as Go spells it ("TokenBucket", "Daily"), for the names
// of subtests and keys.
func KindName(kind txlimit.Kind) string {
	switch kind {
	case txlimit.TokenBucket:
		return "TokenBucket"
	case txlimit.FixedWindow:
		return "FixedWindow"
	case txlimit.SlidingWindow:
		return "SlidingWindow"
	case txlimit.Daily:
		return "Daily"
	case txlimit.Weekly:
		return "Weekly"
	case txlimit.Monthly:
		return "Monthly"
	case txlimit.Yearly:
		return "Yearly"
	}
	return fmt.Sprintf("Kind(%d)", uint8(kind))
}

// MaxWait is the longest wait a Result reports (txlimit's own is
// unexported; its docs say "about 146 years"): 2^62 ns in whole
// microseconds.
const MaxWait = time.Duration(algo.MaxWait) * time.Microsecond

// MaxKeyLen is the longest key in bytes every store takes (txlimit's
// bound, unexported; its docs say 2048 bytes).
const MaxKeyLen = 2048
