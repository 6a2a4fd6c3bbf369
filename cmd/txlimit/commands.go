package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/pressly/goose/v3"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/migrations"
)

// execute opens the database and runs the command.
func (inv *invocation) execute(w io.Writer) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, inv.timeout)
	defer cancel()
	if isPostgres(inv.dsn) {
		db, err := openPostgres(ctx, inv.dsn)
		if err != nil {
			return err
		}
		defer db.close()
		return runOn(ctx, inv, db, w)
	}
	db, err := openSQLite(inv.dsn, inv.command == "migrate" && inv.args[0] == "up")
	if err != nil {
		return err
	}
	defer db.close()
	return runOn(ctx, inv, db, w)
}

func runOn[TTx any](ctx context.Context, inv *invocation, db *database[TTx], w io.Writer) error {
	switch inv.command {
	case "migrate":
		return migrate(ctx, inv, db, w)
	case "value":
		return value(ctx, inv, db, w)
	case "reset":
		return reset(ctx, inv, db, w)
	case "keys":
		return keys(ctx, inv, db, w)
	case "prune":
		return prune(ctx, inv, db, w)
	}
	return usageError{fmt.Errorf("unknown command %q", inv.command)}
}

// limiter returns a Limiter on db with the configs of the invocation.
func limiter[TTx any](inv *invocation, db *database[TTx]) (*txlimit.Limiter[TTx], map[string]txlimit.Config, error) {
	cfgs, err := inv.configs()
	if err != nil {
		return nil, nil, err
	}
	l, err := txlimit.New(db.store, cfgs, nil)
	if err != nil {
		return nil, nil, usageError{fmt.Errorf("config: %w", err)}
	}
	for name := range cfgs {
		cfgs[name], _ = l.Config(name) // with defaults filled in
	}
	return l, cfgs, nil
}

func migrate[TTx any](ctx context.Context, inv *invocation, db *database[TTx], w io.Writer) error {
	p, err := migrations.Provider(db.sqlDB, db.dialect)
	if err != nil {
		return err
	}
	switch inv.args[0] {
	case "up":
		results, err := p.Up(ctx)
		for _, r := range results {
			if r.Error == nil {
				fmt.Fprintf(w, "applied %s (%v)\n", r.Source.Path, r.Duration.Round(time.Millisecond))
			}
		}
		if err != nil {
			return fmt.Errorf("migrate up: %w", err)
		}
		if len(results) == 0 {
			fmt.Fprintln(w, "txlimit's table is up to date: nothing to apply")
		}
	case "down":
		r, err := p.Down(ctx)
		if errors.Is(err, goose.ErrNoNextVersion) {
			fmt.Fprintln(w, "nothing to roll back: no txlimit migration is applied")
			return nil
		}
		if err != nil {
			return fmt.Errorf("migrate down: %w", err)
		}
		fmt.Fprintf(w, "rolled back %s (%v)\n", r.Source.Path, r.Duration.Round(time.Millisecond))
	case "status":
		status, err := p.Status(ctx)
		if err != nil {
			return fmt.Errorf("migrate status: %w", err)
		}
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "VERSION\tSTATE\tAPPLIED AT\tFILE")
		for _, s := range status {
			at := "-"
			if !s.AppliedAt.IsZero() {
				at = s.AppliedAt.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", s.Source.Version, s.State, at, s.Source.Path)
		}
		return tw.Flush()
	}
	v, err := p.GetDBVersion(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "version %d (recorded in %s)\n", v, migrations.VersionTable)
	return nil
}

// shardConfig is the configuration of one shard of c, as the Limiter uses
// it: each shard holds Rate/Shards, Capacity/Shards and MaxReserved/Shards.
func shardConfig(c txlimit.Config) algo.Config {
	n := float64(c.Shards)
	return algo.Config{
		Kind: algo.Kind(c.Kind), Rate: c.Rate / n, Period: c.Period.Microseconds(),
		Capacity: c.Capacity / n, MaxReserved: c.MaxReserved / n,
	}
}

// project returns the tokens of every shard of c at now, from the rows of
// one key: a stored shard projected to now, a missing one full. Rows of
// shards beyond c.Shards (left by a config with more) are not counted, as
// the Limiter does not read them.
func project(c txlimit.Config, rows []row, now time.Time) []float64 {
	sc := shardConfig(c)
	out := make([]float64, c.Shards)
	for i := range out {
		out[i] = sc.Capacity
	}
	for _, r := range rows {
		if int(r.Shard) < c.Shards {
			out[r.Shard] = algo.Project(sc, algo.State{Value: r.Value, TS: r.TS.UnixMicro()}, now.UnixMicro()).Value
		}
	}
	return out
}

// valueShard is one shard in value's output.
type valueShard struct {
	Shard int32    `json:"shard"`
	Now   float64  `json:"now"`              // tokens now
	Row   bool     `json:"row"`              // whether it has a row (else it is full)
	Value *float64 `json:"stored,omitempty"` // the stored value
	// TS is the stored ts: the last update of a token bucket, the start
	// of the window of a fixed window.
	TS      *time.Time `json:"ts,omitempty"`
	Ignored bool       `json:"ignored,omitempty"` // beyond the config's Shards
}

type valueOutput struct {
	Name     string       `json:"name"`
	Key      string       `json:"key"`
	At       time.Time    `json:"at"`
	Total    float64      `json:"total"`
	Capacity float64      `json:"capacity"`
	Shards   []valueShard `json:"shards"`
}

func value[TTx any](ctx context.Context, inv *invocation, db *database[TTx], w io.Writer) error {
	name, key := inv.args[0], inv.args[1]
	l, cfgs, err := limiter(inv, db)
	if err != nil {
		return err
	}
	c, ok := cfgs[name]
	if !ok {
		return usageError{fmt.Errorf("no config for limit %q: the database keeps none; give -kind, -rate and -period (and -capacity, -shards, … as your application sets them), or -config FILE", name)}
	}
	var snap txlimit.Snapshot
	var rows []row
	err = db.snapshot(ctx, func(tx TTx) (err error) {
		if snap, err = l.ValueTx(ctx, tx, name, key); err != nil {
			return err
		}
		rows, err = db.rows(ctx, tx, name, &key)
		return err
	})
	if err != nil {
		return err
	}
	tokens := project(c, rows, snap.At)
	out := valueOutput{Name: name, Key: key, At: snap.At.UTC(), Total: snap.Value, Capacity: c.Capacity}
	for i, t := range tokens {
		out.Shards = append(out.Shards, valueShard{Shard: int32(i), Now: t})
	}
	for _, r := range rows {
		ts := r.TS.UTC()
		if int(r.Shard) >= c.Shards {
			out.Shards = append(out.Shards, valueShard{Shard: r.Shard, Row: true, Value: &r.Value, TS: &ts, Ignored: true})
			continue
		}
		s := &out.Shards[r.Shard]
		s.Row, s.Value, s.TS = true, &r.Value, &ts
	}
	if inv.json {
		return writeJSON(w, out)
	}

	fmt.Fprintf(w, "limit %s, key %s: %s, %s per %v, capacity %s", name, quote(key), c.Kind, num(c.Rate), c.Period, num(c.Capacity))
	if c.MaxReserved > 0 {
		fmt.Fprintf(w, ", reservations up to %s", num(c.MaxReserved))
	}
	fmt.Fprintf(w, ", %d shard(s)\nread at %s (the clock the limiter decides with)\n\n", c.Shards, out.At.Format(time.RFC3339Nano))
	tsHeader := "UPDATED AT"
	if c.Kind == txlimit.FixedWindow {
		tsHeader = "WINDOW START"
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "SHARD\tTOKENS NOW\tSTORED\t%s\n", tsHeader)
	for _, s := range out.Shards {
		switch {
		case s.Ignored:
			fmt.Fprintf(tw, "%d\t-\t%s\t%s (beyond shards %d: not read by the limiter)\n", s.Shard, num(*s.Value), s.TS.Format(time.RFC3339Nano), c.Shards)
		case s.Row:
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", s.Shard, num(s.Now), num(*s.Value), s.TS.Format(time.RFC3339Nano))
		default:
			fmt.Fprintf(tw, "%d\t%s\t-\t(no row: full)\n", s.Shard, num(s.Now))
		}
	}
	fmt.Fprintf(tw, "TOTAL\t%s\tof %s\n", num(out.Total), num(c.Capacity))
	return tw.Flush()
}

func reset[TTx any](ctx context.Context, inv *invocation, db *database[TTx], w io.Writer) error {
	name, key := inv.args[0], inv.args[1]
	l, err := txlimit.New(db.store, nil, nil)
	if err != nil {
		return err
	}
	var deleted int
	err = db.write(ctx, func(tx TTx) error {
		rows, err := db.rows(ctx, tx, name, &key)
		if err != nil {
			// A key PostgreSQL cannot hold fails the SELECT; ResetTx
			// checks its arguments before it uses tx, and says why.
			if invalid := l.ResetTx(ctx, tx, name, key); errors.Is(invalid, txlimit.ErrInvalid) {
				return invalid
			}
			return err
		}
		deleted = len(rows)
		return l.ResetTx(ctx, tx, name, key)
	})
	if err != nil {
		return err
	}
	if deleted == 0 {
		fmt.Fprintf(w, "limit %s, key %s had no state: nothing to reset (txlimit keys lists the keys that have state)\n", name, quote(key))
		return nil
	}
	fmt.Fprintf(w, "limit %s, key %s: deleted %d row(s); the limit is full again\n", name, quote(key), deleted)
	return nil
}

// keyState is one key in keys' output.
type keyState struct {
	Name string `json:"name"`
	Key  string `json:"key"`
	Rows int    `json:"rows"`
	// Configured reports whether the limit's config is known; Tokens,
	// Capacity and Fill are 0 when it is not.
	Configured bool    `json:"configured"`
	Tokens     float64 `json:"tokens"`
	Capacity   float64 `json:"capacity"`
	Fill       float64 `json:"fill"` // Tokens / Capacity
	// Stored is the sum of the stored values, not projected.
	Stored float64 `json:"stored"`
}

type keysOutput struct {
	At    time.Time  `json:"at"`
	Total int        `json:"total"` // keys with state
	Keys  []keyState `json:"keys"`  // the first -n, emptiest first
}

func keys[TTx any](ctx context.Context, inv *invocation, db *database[TTx], w io.Writer) error {
	var name string
	if len(inv.args) == 1 {
		name = inv.args[0]
	}
	_, cfgs, err := limiter(inv, db)
	if err != nil {
		return err
	}
	var rows []row
	var now time.Time
	err = db.snapshot(ctx, func(tx TTx) (err error) {
		if now, err = db.now(ctx, tx); err != nil {
			return err
		}
		rows, err = db.rows(ctx, tx, name, nil)
		return err
	})
	if err != nil {
		return err
	}
	var states []keyState
	for i := 0; i < len(rows); {
		j := i + 1
		for j < len(rows) && rows[j].Name == rows[i].Name && rows[j].Key == rows[i].Key {
			j++
		}
		k := keyState{Name: rows[i].Name, Key: rows[i].Key, Rows: j - i}
		for _, r := range rows[i:j] {
			k.Stored += r.Value
		}
		if c, ok := cfgs[k.Name]; ok {
			k.Configured, k.Capacity = true, c.Capacity
			for _, t := range project(c, rows[i:j], now) {
				k.Tokens += t
			}
			k.Fill = k.Tokens / c.Capacity
		}
		states = append(states, k)
		i = j
	}
	slices.SortStableFunc(states, func(a, b keyState) int {
		if a.Configured != b.Configured {
			if a.Configured {
				return -1
			}
			return 1
		}
		if a.Configured {
			return cmp.Compare(a.Fill, b.Fill)
		}
		return 0 // already by name and key
	})
	out := keysOutput{At: now, Total: len(states), Keys: states}
	if inv.n > 0 && len(states) > inv.n {
		out.Keys = states[:inv.n]
	}
	if inv.json {
		return writeJSON(w, out)
	}

	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "LIMIT\tKEY\tTOKENS NOW\tCAPACITY\tFULL\tROWS")
	unknown := 0
	for _, k := range states {
		if !k.Configured {
			unknown++
		}
	}
	for _, k := range out.Keys {
		if k.Configured {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.0f%%\t%d\n", k.Name, quote(k.Key), num(k.Tokens), num(k.Capacity), 100*k.Fill, k.Rows)
		} else {
			fmt.Fprintf(tw, "%s\t%s\t?\t?\t?\t%d\n", k.Name, quote(k.Key), k.Rows)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\n%d key(s) with state, %d shown, at %s", out.Total, len(out.Keys), now.UTC().Format(time.RFC3339))
	if unknown > 0 {
		fmt.Fprintf(w, "; %d of limits with no config (?): give their configs with -config to project them", unknown)
	}
	fmt.Fprintln(w)
	return nil
}

func prune[TTx any](ctx context.Context, inv *invocation, db *database[TTx], w io.Writer) error {
	l, cfgs, err := limiter(inv, db)
	if err != nil {
		return err
	}
	if len(cfgs) == 0 {
		return usageError{errors.New("prune needs your limits' configs (-config FILE): it deletes a limit's rows only when they are full under the config your application uses")}
	}
	res, err := l.Prune(ctx, &txlimit.PruneOptions{BatchSize: inv.batch})
	fmt.Fprintf(w, "deleted %d row(s); examined %d key(s) in %d transaction(s)", res.Deleted, res.Keys, res.Batches)
	if res.Unknown > 0 {
		fmt.Fprintf(w, "; kept %d key(s) of limits not in the config", res.Unknown)
	}
	fmt.Fprintln(w)
	return err
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// num formats a number of tokens: at most 4 decimals, no trailing zeros.
func num(v float64) string {
	s := strconv.FormatFloat(v, 'f', 4, 64)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	if s == "-0" {
		return "0"
	}
	return s
}

// quote returns key as it is, or Go-quoted when it is empty or holds
// spaces, quotes or characters that are not printable.
func quote(key string) string {
	if key == "" || strings.ContainsFunc(key, func(r rune) bool {
		return unicode.IsSpace(r) || !unicode.IsPrint(r) || r == '"' || r == '\'' || r == '\\'
	}) {
		return strconv.Quote(key)
	}
	return key
}
