package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/driver"
)

// The commands of pauses (txlimit's Limiter.Pause): pause pauses a key until
// an instant, lift lifts its pause, paused lists the keys paused now.

// anyConfig is a config for the commands that need none but go through a
// Limiter, which checks the name and the key as the application's does:
// lift creates no row and keeps the key's own.
var anyConfig = txlimit.Inline(txlimit.Config{Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second})

// pauseUntil reads the UNTIL argument of pause: an RFC 3339 instant, or a Go
// duration after now (2h, 30m).
func pauseUntil(arg string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(arg); err == nil {
		if d <= 0 {
			return time.Time{}, usageError{fmt.Errorf("pause: UNTIL %q is not after now; give a positive duration (2h) or a later instant, or use lift", arg)}
		}
		return now.Add(d), nil
	}
	t, err := time.Parse(time.RFC3339Nano, arg)
	if err != nil {
		return time.Time{}, usageError{fmt.Errorf("pause: UNTIL %q is neither an RFC 3339 instant (2026-12-24T18:00:00Z) nor a duration from now (2h, 90m)", arg)}
	}
	if !t.After(now) {
		return time.Time{}, usageError{fmt.Errorf("pause: UNTIL %s is not after the clock (%s); give a later instant, or use lift", t.Format(time.RFC3339Nano), now.Format(time.RFC3339Nano))}
	}
	return t, nil
}

func pause[TTx any](ctx context.Context, inv *invocation, db *database[TTx], w io.Writer) error {
	name, key := inv.args[0], inv.args[1]
	l, limits, err := limiter(inv, db)
	if err != nil {
		return err
	}
	if _, ok := limits[name]; !ok {
		return usageError{fmt.Errorf("no config for limit %q: pause creates the rows of a key that has none, full under the limit's config, "+
			"which the database does not keep; give -kind, -rate and -period (and -capacity, -shards, … as your application sets them), or -config FILE", name)}
	}
	var until, now time.Time
	err = db.write(ctx, func(tx TTx) (err error) {
		if now, err = db.now(ctx, tx); err != nil {
			return err
		}
		if until, err = pauseUntil(inv.args[2], now); err != nil {
			return err
		}
		return l.PauseTx(ctx, tx, name, key, until)
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "limit %s, key %s: paused until %s (%s from now): every call is denied until then; txlimit lift %s %s lifts it\n",
		name, quote(key), until.UTC().Format(time.RFC3339Nano), until.Sub(now).Round(time.Millisecond), name, quote(key))
	return nil
}

func lift[TTx any](ctx context.Context, inv *invocation, db *database[TTx], w io.Writer) error {
	name, key := inv.args[0], inv.args[1]
	l, err := txlimit.New(db.store, nil, nil)
	if err != nil {
		return err
	}
	var was time.Time
	err = db.write(ctx, func(tx TTx) error {
		now, err := db.now(ctx, tx)
		if err != nil {
			return err
		}
		rows, err := db.rows(ctx, tx, name, &key, false)
		if err != nil {
			// A key PostgreSQL cannot hold fails the SELECT; PauseTx
			// checks its arguments first, and says why.
			if invalid := l.PauseTx(ctx, tx, name, key, time.Time{}, anyConfig); invalid != nil {
				return invalid
			}
			return err
		}
		was = livePause(rows, now)
		return l.PauseTx(ctx, tx, name, key, time.Time{}, anyConfig)
	})
	if err != nil {
		return err
	}
	if was.IsZero() {
		fmt.Fprintf(w, "limit %s, key %s was not paused: nothing to lift (txlimit paused lists the paused keys)\n", name, quote(key))
		return nil
	}
	fmt.Fprintf(w, "limit %s, key %s: lifted the pause that would have ended at %s\n", name, quote(key), was.UTC().Format(time.RFC3339Nano))
	return nil
}

// livePause is the pause rows hold at now (zero for none).
func livePause(rows []row, now time.Time) time.Time {
	stored := make([]driver.Row, len(rows))
	for i, r := range rows {
		stored[i] = r.Row
	}
	return driver.LivePause(stored, now)
}

// pausedKey is one key in paused's output.
type pausedKey struct {
	Name  string    `json:"name"`
	Key   string    `json:"key"`
	Until time.Time `json:"until"`
}

type pausedOutput struct {
	At   time.Time   `json:"at"`
	Keys []pausedKey `json:"keys"` // the soonest to end first
}

func paused[TTx any](ctx context.Context, inv *invocation, db *database[TTx], w io.Writer) error {
	var name string
	if len(inv.args) == 1 {
		name = inv.args[0]
	}
	out := pausedOutput{Keys: []pausedKey{}}
	err := db.snapshot(ctx, func(tx TTx) (err error) {
		if out.At, err = db.now(ctx, tx); err != nil {
			return err
		}
		rows, err := db.rows(ctx, tx, name, nil, false)
		if err != nil {
			return err
		}
		for start := 0; start < len(rows); {
			end := start + 1
			for end < len(rows) && rows[end].Name == rows[start].Name && rows[end].Key == rows[start].Key {
				end++
			}
			if until := livePause(rows[start:end], out.At); !until.IsZero() {
				out.Keys = append(out.Keys, pausedKey{Name: rows[start].Name, Key: rows[start].Key, Until: until.UTC()})
			}
			start = end
		}
		return nil
	})
	if err != nil {
		return err
	}
	out.At = out.At.UTC()
	sortPaused(out.Keys)
	if inv.json {
		return writeJSON(w, out)
	}
	what := "every limit"
	if name != "" {
		what = "limit " + name
	}
	fmt.Fprintf(w, "%d paused key(s) of %s at %s (the clock the limiter decides with)\n", len(out.Keys), what, out.At.Format(time.RFC3339Nano))
	if len(out.Keys) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tKEY\tUNTIL\tLEFT")
	for _, k := range out.Keys {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", k.Name, quote(k.Key), k.Until.Format(time.RFC3339Nano), k.Until.Sub(out.At).Round(time.Millisecond))
	}
	return tw.Flush()
}

// sortPaused orders keys by the end of their pause, then name and key.
func sortPaused(keys []pausedKey) {
	slices.SortFunc(keys, func(a, b pausedKey) int {
		return cmp.Or(a.Until.Compare(b.Until), strings.Compare(a.Name, b.Name), strings.Compare(a.Key, b.Key))
	})
}
