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
	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/migrations"
)

// execute opens the database and runs the command, writing its output to
// w and which store the DSN selected to info.
func (inv *invocation) execute(w, info io.Writer) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, inv.timeout)
	defer cancel()
	switch storeOf(inv.dsn) {
	case postgresStore:
		db, err := openPostgres(ctx, inv.dsn)
		if err != nil {
			return err
		}
		defer db.close()
		return runOn(ctx, inv, db, w, info)
	case mysqlStore:
		db, err := openMySQL(ctx, inv.dsn)
		if err != nil {
			return err
		}
		defer db.close()
		return runOn(ctx, inv, db, w, info)
	}
	db, err := openSQLite(inv.dsn, inv.command == "migrate" && inv.args[0] == "up")
	if err != nil {
		return err
	}
	defer db.close()
	return runOn(ctx, inv, db, w, info)
}

// runOn runs inv on db, after telling info which store the DSN selected.
func runOn[TTx any](ctx context.Context, inv *invocation, db *database[TTx], w, info io.Writer) error {
	fmt.Fprintf(info, "txlimit: %s\n", db.opened)
	err := dispatch(ctx, inv, db, w)
	if err != nil && inv.command != "migrate" {
		err = unmigrated(ctx, db, err)
	}
	return err
}

func dispatch[TTx any](ctx context.Context, inv *invocation, db *database[TTx], w io.Writer) error {
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
	case "holders":
		return holders(ctx, inv, db, w)
	case "release":
		return release(ctx, inv, db, w)
	case "change":
		return change(ctx, inv, db, w)
	case "pause":
		return pause(ctx, inv, db, w)
	case "lift":
		return lift(ctx, inv, db, w)
	case "paused":
		return paused(ctx, inv, db, w)
	}
	return usageError{fmt.Errorf("unknown command %q", inv.command)}
}

// unmigrated adds the fix to err when the table txlimit lacks a migration:
// the rows are read with every column of the library's state (prev
// included), so an older table fails the SELECT with the database's own
// error, which the store's Ping turns into txlimit.ErrNotMigrated.
func unmigrated[TTx any](ctx context.Context, db *database[TTx], err error) error {
	var usage usageError
	if errors.As(err, &usage) || errors.As(err, new(*txlimit.InvalidError)) || ctx.Err() != nil {
		return err
	}
	if !errors.Is(err, txlimit.ErrNotMigrated) {
		ping := driver.OpsOf(db.store).Ping(ctx)
		if !errors.Is(ping, txlimit.ErrNotMigrated) {
			return err
		}
		err = ping
	}
	return fmt.Errorf("%w; txlimit migrate up applies the missing migrations (migrate status lists them)", err)
}

// limit is one limit of the invocation: its config as the Limiter
// normalized it (defaults filled in), and as the stores see it.
type limit struct {
	config txlimit.Config
	stored driver.LimitConfig
}

// limiter returns a Limiter on db with the configs of the invocation, and
// those configs. txlimit.New validates them: its *txlimit.InvalidError is
// told with the flag or file field the operator gave.
func limiter[TTx any](inv *invocation, db *database[TTx]) (*txlimit.Limiter[TTx], map[string]limit, error) {
	cfgs, err := inv.configs()
	if err != nil {
		return nil, nil, err
	}
	l, err := txlimit.New(db.store, cfgs, nil)
	if err != nil {
		return nil, nil, usageError{inv.invalidConfig(err)}
	}
	limits := make(map[string]limit, len(cfgs))
	for name := range cfgs {
		c, _ := l.Config(name)
		stored, err := storedConfig(c)
		if err != nil {
			return nil, nil, err
		}
		limits[name] = limit{config: c, stored: stored}
	}
	return l, limits, nil
}

// storedConfig is c, a config txlimit.New normalized, as the Limiter hands
// it to its store (the root keeps that conversion, and the calendar's
// *time.Location, unexported): the whole limit's Rate, Capacity and
// MaxReserved, which driver.Limit.Shard divides among the shards, and a
// calendar kind as the FixedWindow of a calendar unit that algo computes.
func storedConfig(c txlimit.Config) (driver.LimitConfig, error) {
	kind, unit := algo.Kind(c.Kind), kindOf(c.Kind).unit
	var loc *time.Location
	if unit != 0 {
		kind = algo.FixedWindow
		var err error
		// txlimit.New loaded it too: it is there.
		if loc, err = time.LoadLocation(c.Zone); err != nil {
			return driver.LimitConfig{}, err
		}
	}
	return driver.LimitConfig{
		Config: algo.Config{
			Kind: kind, Rate: c.Rate, Period: c.Period.Microseconds(),
			Capacity: c.Capacity, MaxReserved: c.MaxReserved,
			Calendar: algo.Calendar{Unit: unit, Weekday: c.WeekStart, Location: loc},
		},
		Shards: c.Shards, Start: c.Start.UnixMicro(), Aligned: !c.Start.IsZero(),
	}, nil
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

// project returns the tokens of each of l's shards at now, and their total
// (Remaining, as Limiter.Check says), from every row of l's key, read as the Limiter
// reads them (driver.Limit.States): a missing shard is full, and rows
// written under another number of shards are pooled and spread over l's
// (resharded is then set). A shard's tokens are algo.Pooled of it alone:
// the tokens of a token bucket or a fixed window, Rate less the weighted
// counts of a sliding window.
func project(l driver.Limit, rows []row, now time.Time) (tokens []float64, total float64, resharded bool) {
	at := now.UnixMicro()
	stored := make([]driver.Row, len(rows))
	for i, r := range rows {
		stored[i] = r.Row
	}
	states, resharded := l.States(stored, at)
	shard := l.Shard(l.Shards)
	tokens = make([]float64, len(states))
	for i, s := range states {
		tokens[i] = algo.Pooled(shard, []algo.State{s}, at)
	}
	return tokens, algo.Pooled(shard, states, at), resharded
}

// describe is c's kind and rate: "token bucket, 10 per 1m0s", "fixed
// window, 1000 per calendar month in Europe/Berlin".
func describe(c txlimit.Config) string {
	k := kindOf(c.Kind)
	if k.unit == 0 {
		return fmt.Sprintf("%s, %s per %v", k.text, num(c.Rate), c.Period)
	}
	per := "calendar " + k.text
	if c.Kind == txlimit.Weekly {
		per += " from " + c.WeekStart.String()
	}
	return fmt.Sprintf("fixed window, %s per %s in %s", num(c.Rate), per, c.Zone)
}

// valueShard is one shard in value's output.
type valueShard struct {
	Shard int32    `json:"shard"`
	Now   float64  `json:"now"`              // tokens now
	Row   bool     `json:"row"`              // whether it has a row (else it is full, unless resharded)
	Value *float64 `json:"stored,omitempty"` // the stored value: a sliding window's count
	// Prev is the stored count of a sliding window's previous window,
	// when not 0.
	Prev *float64 `json:"prev,omitempty"`
	// TS is the stored ts: the last update of a token bucket or a
	// calendar window, the start of the window of a fixed or sliding one.
	TS      *time.Time `json:"ts,omitempty"`
	Ignored bool       `json:"ignored,omitempty"` // beyond the config's Shards
}

type valueOutput struct {
	Name     string    `json:"name"`
	Key      string    `json:"key"`
	At       time.Time `json:"at"`
	Total    float64   `json:"total"`
	Capacity float64   `json:"capacity"`
	// Resharded reports rows written under another number of shards: the
	// limiter pools them and spreads them over the config's Shards, and
	// Now is each shard's share.
	Resharded bool         `json:"resharded,omitempty"`
	Shards    []valueShard `json:"shards"`
}

func value[TTx any](ctx context.Context, inv *invocation, db *database[TTx], w io.Writer) error {
	name, key := inv.args[0], inv.args[1]
	l, limits, err := limiter(inv, db)
	if err != nil {
		return err
	}
	lim, ok := limits[name]
	if !ok {
		return usageError{fmt.Errorf("no config for limit %q: the database keeps none; give -kind, -rate and -period (and -capacity, -shards, … as your application sets them), or -config FILE", name)}
	}
	c := lim.config
	var read txlimit.Result
	var rows []row
	err = db.snapshot(ctx, func(tx TTx) (err error) {
		if read, err = l.CheckTx(ctx, tx, name, key, txlimit.Count(0)); err != nil {
			return err
		}
		rows, err = db.rows(ctx, tx, name, &key, false)
		return err
	})
	if err != nil {
		return err
	}
	tokens, _, resharded := project(lim.stored.Limit(name, key), rows, read.At)
	out := valueOutput{Name: name, Key: key, At: read.At.UTC(), Total: read.Remaining, Capacity: c.Capacity, Resharded: resharded}
	for i, t := range tokens {
		out.Shards = append(out.Shards, valueShard{Shard: int32(i), Now: t})
	}
	written := 0 // the shards of the config the rows were written under
	for _, r := range rows {
		written = max(written, int(r.Shard)+1)
		ts := r.TS.UTC()
		s := valueShard{Shard: r.Shard, Row: true, Value: &r.Value, TS: &ts}
		if r.Prev != 0 {
			s.Prev = &r.Prev
		}
		if int(r.Shard) >= c.Shards {
			s.Ignored = true
			out.Shards = append(out.Shards, s)
			continue
		}
		s.Now = out.Shards[r.Shard].Now
		out.Shards[r.Shard] = s
	}
	if inv.json {
		return writeJSON(w, out)
	}

	fmt.Fprintf(w, "limit %s, key %s: %s, capacity %s", name, quote(key), describe(c), num(c.Capacity))
	if c.MaxReserved > 0 {
		fmt.Fprintf(w, ", reservations up to %s", num(c.MaxReserved))
	}
	fmt.Fprintf(w, ", %d shard(s)\nread at %s (the clock the limiter decides with)\n", c.Shards, out.At.Format(time.RFC3339Nano))
	sliding := c.Kind == txlimit.SlidingWindow
	if sliding {
		fmt.Fprintln(w, "a sliding window stores counts, not tokens: a shard's tokens are its rate, less its count, less its\n"+
			"previous window's count (prev) times the part of that window the sliding window still covers")
	}
	if resharded {
		fmt.Fprintf(w, "the rows were written under %d shard(s): the limiter pools them and spreads them over %d, as TOKENS NOW shows\n", written, c.Shards)
	}
	fmt.Fprintln(w)

	// ts is the last update of a token bucket and of a calendar window
	// (shown in its zone), and the start of the window of a fixed or
	// sliding window of Period.
	tsHeader := "UPDATED AT"
	if c.Kind == txlimit.FixedWindow || c.Kind == txlimit.SlidingWindow {
		tsHeader = "WINDOW START"
	}
	loc := lim.stored.Config.Calendar.Location
	stamp := func(t *time.Time) string {
		if loc != nil {
			return t.In(loc).Format(time.RFC3339Nano)
		}
		return t.Format(time.RFC3339Nano)
	}
	storedHeader, none := "STORED", "-"
	stored := func(s valueShard) string { return num(*s.Value) }
	if sliding {
		storedHeader, none = "STORED COUNT\tSTORED PREV", "-\t-"
		stored = func(s valueShard) string {
			prev := 0.0
			if s.Prev != nil {
				prev = *s.Prev
			}
			return num(*s.Value) + "\t" + num(prev)
		}
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "SHARD\tTOKENS NOW\t%s\t%s\n", storedHeader, tsHeader)
	for _, s := range out.Shards {
		switch {
		case s.Ignored:
			fmt.Fprintf(tw, "%d\t-\t%s\t%s (beyond shards %d: pooled into the shards above)\n", s.Shard, stored(s), stamp(s.TS), c.Shards)
		case s.Row:
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", s.Shard, num(s.Now), stored(s), stamp(s.TS))
		case resharded:
			fmt.Fprintf(tw, "%d\t%s\t%s\t(no row)\n", s.Shard, num(s.Now), none)
		default:
			fmt.Fprintf(tw, "%d\t%s\t%s\t(no row: full)\n", s.Shard, num(s.Now), none)
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
		rows, err := db.rows(ctx, tx, name, &key, false)
		if err != nil {
			// A key PostgreSQL cannot hold fails the SELECT; ResetTx
			// checks its arguments before it uses tx, and says why.
			if invalid := l.ResetTx(ctx, tx, name, key); errors.As(invalid, new(*txlimit.InvalidError)) {
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
	// Stored is the sum of the stored values (a sliding window's counts),
	// not projected.
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
	_, limits, err := limiter(inv, db)
	if err != nil {
		return err
	}
	var rows []row
	var now time.Time
	err = db.snapshot(ctx, func(tx TTx) (err error) {
		if now, err = db.now(ctx, tx); err != nil {
			return err
		}
		rows, err = db.rows(ctx, tx, name, nil, false)
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
		if lim, ok := limits[k.Name]; ok {
			k.Configured, k.Capacity = true, lim.config.Capacity
			_, k.Tokens, _ = project(lim.stored.Limit(k.Name, k.Key), rows[i:j], now)
			k.Fill = k.Tokens / k.Capacity
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
	l, limits, err := limiter(inv, db)
	if err != nil {
		return err
	}
	if len(limits) == 0 {
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
