package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/driver"
)

// The commands of concurrency limits (txlimit.Concurrency): holders lists a
// key's holders, release gives one's slot back. Neither needs a config:
// a holder's expiry is in its row.

// holderState is one holder in holders' output.
type holderState struct {
	Holder    string    `json:"holder"`
	ExpiresAt time.Time `json:"expires_at"`
	// Live reports whether it holds a slot: its expiry is after At. An
	// expired holder holds none; the next acquire of the key deletes it.
	Live bool `json:"live"`
}

type holdersOutput struct {
	Name    string        `json:"name"`
	Key     string        `json:"key"`
	At      time.Time     `json:"at"`
	Live    int           `json:"live"`
	Holders []holderState `json:"holders"`
}

func holders[TTx any](ctx context.Context, inv *invocation, db *database[TTx], w io.Writer) error {
	name, key := inv.args[0], inv.args[1]
	// A Limiter checks the name and the key as the application's does.
	l, err := txlimit.New(db.store, nil, nil)
	if err != nil {
		return err
	}
	var read driver.HoldersResult
	err = db.snapshot(ctx, func(tx TTx) error {
		// Check refuses a name or key the application could not use, as it
		// does there; any Concurrency config will do for that.
		anyConfig := txlimit.Inline(txlimit.Config{Kind: txlimit.Concurrency, Capacity: 1, HoldFor: time.Second})
		if _, err := l.CheckTx(ctx, tx, name, key, anyConfig, txlimit.Count(0)); err != nil {
			return err
		}
		read, err = driver.OpsOf(db.store).Holders(ctx, tx, driver.ReadParams{Name: name, Key: key})
		return err
	})
	if err != nil {
		return err
	}
	out := holdersOutput{Name: name, Key: key, At: read.At.UTC(), Holders: []holderState{}}
	for _, h := range read.Holders {
		live := h.Expires.After(read.At)
		if live {
			out.Live++
		}
		out.Holders = append(out.Holders, holderState{Holder: h.ID, ExpiresAt: h.Expires.UTC(), Live: live})
	}
	if inv.json {
		return writeJSON(w, out)
	}
	fmt.Fprintf(w, "limit %s, key %s: %d live holder(s)", name, quote(key), out.Live)
	if n := len(out.Holders) - out.Live; n > 0 {
		fmt.Fprintf(w, ", %d expired (holding no slot; the next acquire of the key deletes them)", n)
	}
	fmt.Fprintf(w, "\nread at %s (the clock the limiter decides with)\n", out.At.Format(time.RFC3339Nano))
	if len(out.Holders) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HOLDER\tEXPIRES AT\tLEFT")
	for _, h := range out.Holders {
		left := "expired"
		if h.Live {
			left = h.ExpiresAt.Sub(out.At).Round(time.Millisecond).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", quote(h.Holder), h.ExpiresAt.Format(time.RFC3339Nano), left)
	}
	return tw.Flush()
}

func release[TTx any](ctx context.Context, inv *invocation, db *database[TTx], w io.Writer) error {
	name, key, holder := inv.args[0], inv.args[1], inv.args[2]
	l, err := txlimit.New(db.store, nil, nil)
	if err != nil {
		return err
	}
	var released bool
	err = db.write(ctx, func(tx TTx) (err error) {
		released, err = l.ReleaseTx(ctx, tx, name, key, holder)
		return err
	})
	if err != nil {
		return err
	}
	if !released {
		fmt.Fprintf(w, "limit %s, key %s: holder %s held no live slot (released already, expired or reclaimed): nothing to release\n",
			name, quote(key), quote(holder))
		return nil
	}
	fmt.Fprintf(w, "limit %s, key %s: released holder %s; its slot is free\n", name, quote(key), quote(holder))
	return nil
}
