package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/txlimit/txlimit"
)

// inheritances are the ways change -apply carries a key's tokens over to a
// new config, in Bucket4j's words (TokensInheritanceStrategy).
var inheritances = []string{"as_is", "proportionally", "additive", "reset"}

// inherit returns what a key that holds tokens under a config of capacity
// from holds under one of capacity to, by strategy. A full key stays full,
// as a key with no row (one Prune deleted) does; a debt (tokens below 0)
// is kept by as_is and additive, scaled by proportionally.
func inherit(strategy string, tokens, from, to float64) float64 {
	if tokens >= from-1e-9*math.Max(1, from) {
		return to
	}
	switch strategy {
	case "proportionally":
		return tokens * to / from
	case "additive":
		if to > from {
			return math.Min(tokens+to-from, to)
		}
	case "reset":
		return to
	}
	return math.Min(tokens, to)
}

// changeKey is one key in change's output.
type changeKey struct {
	Key  string `json:"key"`
	Rows int    `json:"rows"`
	// Now is the tokens the key holds now under the config today;
	// Deployed what the new config reads from its rows as they are (what
	// a deploy of the new config does, docs/config-changes.md); Inherited
	// what change -apply writes, under -inherit.
	Now       float64  `json:"now"`
	Deployed  float64  `json:"deployed"`
	Inherited *float64 `json:"inherited,omitempty"`
}

type changeOutput struct {
	Name         string      `json:"name"`
	At           time.Time   `json:"at"`
	From         string      `json:"from"` // the configs, described
	To           string      `json:"to"`
	FromCapacity float64     `json:"from_capacity"`
	ToCapacity   float64     `json:"to_capacity"`
	Inherit      string      `json:"inherit,omitempty"`
	Applied      int         `json:"applied"` // keys converted by -apply
	Total        int         `json:"total"`   // keys with state
	Keys         []changeKey `json:"keys"`    // the first -n
}

// change shows what a new config (-to) of limit NAME makes of the keys
// that have state, against the config today, and with -apply converts
// them by -inherit, each key in a transaction of its own.
func change[TTx any](ctx context.Context, inv *invocation, db *database[TTx], w io.Writer) error {
	name := inv.args[0]
	_, limits, err := limiter(inv, db)
	if err != nil {
		return err
	}
	from, ok := limits[name]
	if !ok {
		return usageError{fmt.Errorf("no config for limit %q today: give it as the application runs it now, with -config FILE or the config flags (-kind, -rate, …)", name)}
	}
	tos, err := readConfigs(inv.to)
	if err != nil {
		return err
	}
	toConfig, ok := tos[name]
	if !ok {
		return usageError{fmt.Errorf("-to %s has no config for limit %q", inv.to, name)}
	}
	if toConfig.Kind == txlimit.Concurrency || from.config.Kind == txlimit.Concurrency {
		return usageError{fmt.Errorf("limit %q: a Concurrency limit's holders keep their slots under any config (docs/config-changes.md); change converts tokens", name)}
	}
	// The conversion's Limiter has the new config without MaxReserved: a
	// key's debt is kept whatever the new cap, as a deploy keeps it.
	convert := toConfig
	convert.MaxReserved = 0
	lto, err := txlimit.New(db.store, map[string]txlimit.Config{name: convert}, nil)
	if err != nil {
		return usageError{fmt.Errorf("-to %s: %w", inv.to, err)}
	}
	c, _ := lto.Config(name)
	c.MaxReserved = toConfig.MaxReserved
	to, err := storedConfig(c)
	if err != nil {
		return err
	}
	out := changeOutput{
		Name: name, From: describe(from.config), To: describe(c),
		FromCapacity: from.config.Capacity, ToCapacity: c.Capacity, Inherit: inv.inherit,
	}

	var rows []row
	err = db.snapshot(ctx, func(tx TTx) (err error) {
		if out.At, err = db.now(ctx, tx); err != nil {
			return err
		}
		rows, err = db.rows(ctx, tx, name, nil, false)
		return err
	})
	if err != nil {
		return err
	}
	for i := 0; i < len(rows); {
		j := i + 1
		for j < len(rows) && rows[j].Key == rows[i].Key {
			j++
		}
		k := changeKey{Key: rows[i].Key, Rows: j - i}
		_, k.Now, _ = project(from.stored.Limit(name, k.Key), rows[i:j], out.At)
		_, k.Deployed, _ = project(to.Limit(name, k.Key), rows[i:j], out.At)
		if inv.inherit != "" {
			v := inherit(inv.inherit, k.Now, out.FromCapacity, out.ToCapacity)
			k.Inherited = &v
		}
		out.Keys = append(out.Keys, k)
		i = j
	}
	out.Total = len(out.Keys)

	if inv.apply {
		for _, k := range out.Keys {
			key := k.Key
			err := db.write(ctx, func(tx TTx) error {
				// The rows as they are now, locked: the conversion loses no
				// call that took since the preview.
				rows, err := db.rows(ctx, tx, name, &key, true)
				if err != nil || len(rows) == 0 {
					return err // a key with no row is full under any config
				}
				now, err := db.now(ctx, tx)
				if err != nil {
					return err
				}
				_, tokens, _ := project(from.stored.Limit(name, key), rows, now)
				return apply(ctx, lto, tx, name, key, inherit(inv.inherit, tokens, out.FromCapacity, out.ToCapacity), out.ToCapacity)
			})
			if err != nil {
				return fmt.Errorf("limit %s, key %s: %w (the keys before it are converted, this one and those after it are not)", name, quote(key), err)
			}
			out.Applied++
		}
	}
	if inv.n > 0 && len(out.Keys) > inv.n {
		out.Keys = out.Keys[:inv.n]
	}
	if inv.json {
		return writeJSON(w, out)
	}

	fmt.Fprintf(w, "limit %s\n  today: %s, capacity %s\n  -to:   %s, capacity %s\n\n", name, out.From, num(out.FromCapacity), out.To, num(out.ToCapacity))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	head := "KEY\tROWS\tNOW\tAFTER DEPLOY"
	if inv.inherit != "" {
		head += "\t" + strings.ToUpper(inv.inherit)
	}
	fmt.Fprintln(tw, head)
	for _, k := range out.Keys {
		line := fmt.Sprintf("%s\t%d\t%s\t%s", quote(k.Key), k.Rows, num(k.Now), num(k.Deployed))
		if k.Inherited != nil {
			line += "\t" + num(*k.Inherited)
		}
		fmt.Fprintln(tw, line)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\n%d key(s) with state, %d shown, at %s.\n", out.Total, len(out.Keys), out.At.UTC().Format(time.RFC3339))
	fmt.Fprint(w, "NOW: tokens under the config today. AFTER DEPLOY: what the -to config reads from the rows as they are\n(docs/config-changes.md).")
	switch {
	case inv.apply:
		fmt.Fprintf(w, " %s: what -apply wrote.\nConverted %d key(s); keys without state are full under any config.\n", strings.ToUpper(inv.inherit), out.Applied)
	case inv.inherit != "":
		fmt.Fprintf(w, " %s: what -apply would write.\nNothing written.\n", strings.ToUpper(inv.inherit))
	default:
		fmt.Fprintln(w, "\nNothing written.")
	}
	return nil
}

// apply leaves key of limit name holding target tokens under lto's config
// (of capacity capacity), in tx: it deletes the key's rows (full under any
// config, on the new config's windows and shards) and takes what the target
// lacks, as a reservation when the target is a debt.
func apply[TTx any](ctx context.Context, lto *txlimit.Limiter[TTx], tx TTx, name, key string, target, capacity float64) error {
	if err := lto.ResetTx(ctx, tx, name, key); err != nil {
		return err
	}
	take := capacity - target
	if take <= 1e-9*math.Max(1, capacity) {
		return nil
	}
	res, err := lto.LimitTx(ctx, tx, name, key, txlimit.Count(take), txlimit.Reserve())
	if err != nil {
		return err
	}
	if !res.OK {
		return fmt.Errorf("the new config refused to take %s of a full key: %w", num(take), res.Err())
	}
	return nil
}
