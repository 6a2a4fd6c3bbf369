package storetest

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
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
