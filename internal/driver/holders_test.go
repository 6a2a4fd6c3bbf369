package driver

import (
	"testing"
	"time"
)

func TestDecideSlot(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	p := SlotParams{KeyRef: KeyRef{Name: "n", Key: "k"}, Holder: "me", Capacity: 2, HoldFor: time.Minute}
	holders := []Holder{
		{ID: "a", Expires: at(time.Second)},      // live
		{ID: "old", Expires: t0},                 // expired exactly now: not live
		{ID: "b", Expires: at(3 * time.Second)},  // live
		{ID: "older", Expires: at(-time.Second)}, // expired
		{ID: "c", Expires: at(2 * time.Second)},  // live
	}
	// Three live holders of a limit of 2 (its Capacity lowered): a slot comes
	// back once two have expired, a at 1s and c at 2s.
	res := DecideSlot(p, holders, t0)
	if res.OK || res.Live != 3 || !res.Free.Equal(at(2*time.Second)) || res.Reclaimed != nil {
		t.Fatalf("denial: %+v", res)
	}
	// A live holder is granted again, whatever the count, and takes no
	// second slot; the expired ones are reclaimed.
	res = DecideSlot(SlotParams{KeyRef: p.KeyRef, Holder: "b", Capacity: 2, HoldFor: time.Minute}, holders, t0)
	if !res.OK || res.Live != 3 || !res.Expires.Equal(at(time.Minute)) || len(res.Reclaimed) != 2 {
		t.Fatalf("again: %+v", res)
	}
	// Room: granted, the holder counted, every expired holder reclaimed but
	// the caller's own row, which the grant moves.
	mine := append(holders[:0:0], Holder{ID: "me", Expires: at(-time.Hour)}, Holder{ID: "x", Expires: at(-time.Hour)})
	res = DecideSlot(p, mine, t0)
	if !res.OK || res.Live != 1 || len(res.Reclaimed) != 1 || res.Reclaimed[0] != "x" {
		t.Fatalf("grant: %+v", res)
	}
	// Check: Live is the live holders now; Count(0) is always granted.
	if c := CheckSlot(p, holders, t0, 1); c.OK || c.Live != 3 || c.Reclaimed != nil || !c.Expires.IsZero() {
		t.Fatalf("check: %+v", c)
	}
	if c := CheckSlot(p, holders, t0, 0); !c.OK || c.Live != 3 {
		t.Fatalf("check, count 0: %+v", c)
	}
}
