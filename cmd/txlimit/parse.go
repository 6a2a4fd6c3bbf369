package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/algo"
)

var errHelp = errors.New("help")

// invocation is a parsed command line.
type invocation struct {
	command string   // migrate, value, reset, keys, prune, holders, release, change, pause, lift, paused
	args    []string // the command's positional arguments
	dsn     string
	config  string // -config file
	to      string // change: the -to file, the new configs
	inherit string // change: the -inherit strategy
	apply   bool   // change: write the conversion
	limit   limitFlags
	n       int
	batch   int
	json    bool
	yes     bool
	timeout time.Duration
}

// limitFlags is one limit's config given as flags.
type limitFlags struct {
	kind, period, start         string
	calendar, zone, weekStart   string
	rate, capacity, maxReserved float64
	shards                      int
	set                         map[string]bool // the flags given
}

// parse reads args. Flags may come before, between or after the positional
// arguments; after "--", everything is positional.
func parse(args []string) (*invocation, error) {
	inv := &invocation{}
	fs := flag.NewFlagSet("txlimit", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are reported by run, usage by -help
	fs.StringVar(&inv.dsn, "dsn", os.Getenv("TXLIMIT_DSN"), "")
	fs.StringVar(&inv.config, "config", "", "")
	fs.StringVar(&inv.to, "to", "", "")
	fs.StringVar(&inv.inherit, "inherit", "", "")
	fs.BoolVar(&inv.apply, "apply", false, "")
	fs.StringVar(&inv.limit.kind, "kind", "", "")
	fs.Float64Var(&inv.limit.rate, "rate", 0, "")
	fs.StringVar(&inv.limit.period, "period", "", "")
	fs.Float64Var(&inv.limit.capacity, "capacity", 0, "")
	fs.Float64Var(&inv.limit.maxReserved, "max-reserved", 0, "")
	fs.IntVar(&inv.limit.shards, "shards", 0, "")
	fs.StringVar(&inv.limit.start, "start", "", "")
	fs.StringVar(&inv.limit.calendar, "calendar", "", "")
	fs.StringVar(&inv.limit.zone, "zone", "", "")
	fs.StringVar(&inv.limit.weekStart, "week-start", "", "")
	fs.IntVar(&inv.n, "n", 20, "")
	fs.IntVar(&inv.batch, "batch", 0, "")
	fs.BoolVar(&inv.json, "json", false, "")
	fs.BoolVar(&inv.yes, "yes", false, "")
	fs.DurationVar(&inv.timeout, "timeout", time.Minute, "")

	// Everything after "--" is positional, for keys that begin with "-".
	var rest []string
	for i, a := range args {
		if a == "--" {
			args, rest = args[:i], args[i+1:]
			break
		}
	}
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, errHelp
			}
			return nil, err
		}
		if fs.NArg() == 0 {
			break
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
	}
	positional = append(positional, rest...)
	inv.limit.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { inv.limit.set[f.Name] = true })

	if len(positional) == 0 {
		return nil, errors.New("no command given")
	}
	inv.command, inv.args = positional[0], positional[1:]
	want := map[string][2]int{ // the command's fewest and most arguments
		"help": {0, 0}, "migrate": {1, 1}, "value": {2, 2}, "reset": {2, 2}, "keys": {0, 1}, "prune": {0, 0},
		"holders": {2, 2}, "release": {3, 3}, "change": {1, 1}, "pause": {3, 3}, "lift": {2, 2}, "paused": {0, 1},
	}
	n, ok := want[inv.command]
	switch {
	case !ok:
		return nil, fmt.Errorf("unknown command %q; the commands are migrate, value, reset, keys, prune, holders, release, change, pause, lift and paused", inv.command)
	case inv.command == "help":
		return nil, errHelp
	case len(inv.args) < n[0] || len(inv.args) > n[1]:
		return nil, fmt.Errorf("%s takes %s, got %d: %q", inv.command, argsWanted[inv.command], len(inv.args), inv.args)
	}
	if inv.command == "migrate" {
		switch inv.args[0] {
		case "up", "down", "status":
		default:
			return nil, fmt.Errorf("migrate takes up, down or status, got %q", inv.args[0])
		}
		if inv.args[0] == "down" && !inv.yes {
			return nil, errors.New("migrate down rolls back the last migration, and rolling back the first one drops the table txlimit with the state of every limit; add -yes to do it")
		}
	}
	if inv.dsn == "" {
		return nil, errors.New("no database: give -dsn (postgres://…, user:pass@tcp(host:3306)/db or mysql://… for MySQL and MariaDB, or a SQLite file) or set TXLIMIT_DSN")
	}
	if inv.n < 0 {
		return nil, fmt.Errorf("-n must be 0 (all) or more, got %d", inv.n)
	}
	if inv.batch < 0 {
		return nil, fmt.Errorf("-batch must be 0 (the default, %d) or more, got %d", 1000, inv.batch)
	}
	if inv.timeout <= 0 {
		return nil, fmt.Errorf("-timeout must be > 0, got %v", inv.timeout)
	}
	if inv.limit.given() && !(inv.command == "value" || inv.command == "change" || inv.command == "pause" || inv.command == "keys" && len(inv.args) == 1) {
		return nil, errors.New("the config flags (-kind, -rate, …) define the limit NAME of value, pause, keys NAME and change NAME; for other commands use -config")
	}
	return inv, inv.checkChange()
}

// checkChange checks the flags that belong to change.
func (inv *invocation) checkChange() error {
	if inv.command != "change" {
		if inv.to != "" || inv.inherit != "" || inv.apply {
			return errors.New("-to, -inherit and -apply belong to change")
		}
		return nil
	}
	switch {
	case inv.to == "":
		return errors.New("change needs -to FILE: the new configs (JSON as for -config), among them NAME's; the config today comes from -config or the config flags")
	case inv.inherit != "" && !slices.Contains(inheritances, inv.inherit):
		return fmt.Errorf("-inherit must be %s, got %q", strings.Join(inheritances, ", "), inv.inherit)
	case inv.apply && inv.inherit == "":
		return errors.New("change -apply needs -inherit (as_is, proportionally, additive or reset): how the stored tokens carry over")
	}
	return nil
}

var argsWanted = map[string]string{
	"migrate": "one argument (up, down or status)",
	"value":   "two arguments, NAME KEY",
	"reset":   "two arguments, NAME KEY",
	"keys":    "at most one argument, NAME",
	"prune":   "no arguments",
	"holders": "two arguments, NAME KEY",
	"release": "three arguments, NAME KEY HOLDER",
	"change":  "one argument, NAME",
	"pause":   "three arguments, NAME KEY UNTIL",
	"lift":    "two arguments, NAME KEY",
	"paused":  "at most one argument, NAME",
}

var configFlags = []string{"kind", "rate", "period", "capacity", "max-reserved", "shards", "start", "calendar", "zone", "week-start"}

func (f limitFlags) given() bool {
	for _, n := range configFlags {
		if f.set[n] {
			return true
		}
	}
	return false
}

// config returns the limit the flags define.
func (f limitFlags) config() (txlimit.Config, error) {
	if f.set["calendar"] {
		return txlimit.Config{}, calendarGone(source{}, f.calendar)
	}
	// An unknown kind is for fileConfig.config to name.
	if k, known := kindNamed(f.kind); !f.set["kind"] || !f.set["rate"] || known && k.unit == 0 && !f.set["period"] {
		return txlimit.Config{}, errors.New("a limit given by flags needs at least -kind, -rate and -period (a calendar kind, daily, weekly, monthly or yearly, takes -zone instead of -period)")
	}
	return fileConfig{
		Kind: f.kind, Rate: f.rate, Period: f.period, Capacity: f.capacity,
		MaxReserved: f.maxReserved, Shards: f.shards, Start: f.start,
		Zone: f.zone, WeekStart: f.weekStart,
	}.config(source{})
}

// source is where a limit's config was given: flags, or a limit of the
// -config file.
type source struct {
	file  string // "" for the flags
	limit string
}

// field names a field (as the JSON file spells it: week_start) where the
// operator wrote it: "flag -week-start", or "limits.json: limit "x": week_start".
func (s source) field(name string) string {
	if s.file == "" {
		return "flag -" + strings.ReplaceAll(name, "_", "-")
	}
	return fmt.Sprintf("%s: limit %s: %s", s.file, strconv.Quote(s.limit), name)
}

// fileConfig is one limit in a -config file.
type fileConfig struct {
	Kind        string  `json:"kind"`
	Rate        float64 `json:"rate"`
	Period      string  `json:"period"`
	Capacity    float64 `json:"capacity"`
	MaxReserved float64 `json:"max_reserved"`
	Shards      int     `json:"shards"`
	Start       string  `json:"start"`
	Zone        string  `json:"zone"`
	WeekStart   string  `json:"week_start"`
	// Calendar is the field of a calendar window before calendar windows
	// were kinds of their own: it is refused with the kind to give instead.
	Calendar string `json:"calendar"`
}

// kindName is a txlimit.Kind as the flags and the file name it.
type kindName struct {
	name string // -kind and the file's kind: token_bucket, daily, ...
	kind txlimit.Kind
	unit algo.CalendarUnit // a calendar kind's window, 0 for the others
	text string            // how value describes it: "fixed window", "day"
}

var kindNames = []kindName{
	{"token_bucket", txlimit.TokenBucket, 0, "token bucket"},
	{"fixed_window", txlimit.FixedWindow, 0, "fixed window"},
	{"sliding_window", txlimit.SlidingWindow, 0, "sliding window"},
	{"daily", txlimit.Daily, algo.Day, "day"},
	{"weekly", txlimit.Weekly, algo.Week, "week"},
	{"monthly", txlimit.Monthly, algo.Month, "month"},
	{"yearly", txlimit.Yearly, algo.Year, "year"},
}

// kindNamed returns the kind named s (fixed_window, fixed-window, Daily, ...).
func kindNamed(s string) (kindName, bool) {
	for _, k := range kindNames {
		if strings.EqualFold(strings.ReplaceAll(s, "-", "_"), k.name) {
			return k, true
		}
	}
	return kindName{}, false
}

// kindOf returns k's kindName.
func kindOf(k txlimit.Kind) kindName {
	for _, n := range kindNames {
		if n.kind == k {
			return n
		}
	}
	return kindName{name: fmt.Sprintf("kind %d", k), kind: k, text: fmt.Sprintf("kind %d", k)}
}

// calendarGone is the error of the calendar field or flag, given at src:
// a calendar window is a kind of its own.
func calendarGone(src source, unit string) error {
	for _, k := range kindNames {
		if k.unit != 0 && strings.EqualFold(unit, k.text) {
			return fmt.Errorf("%s is gone: a calendar window is a kind of its own; give %s %s and its %s (UTC included), and no calendar",
				src.field("calendar"), src.field("kind"), k.name, src.field("zone"))
		}
	}
	return fmt.Errorf("%s is gone: a calendar window is a kind of its own; give %s daily, weekly, monthly or yearly and its %s (UTC included), and no calendar",
		src.field("calendar"), src.field("kind"), src.field("zone"))
}

// config converts c, given at src. It only reads the fields: whether they
// go together (a Period with a calendar kind, a Zone that exists, ...) is
// for txlimit.New to say.
func (c fileConfig) config(src source) (txlimit.Config, error) {
	var out txlimit.Config
	if c.Calendar != "" {
		return out, calendarGone(src, c.Calendar)
	}
	k, ok := kindNamed(c.Kind)
	if !ok {
		return out, fmt.Errorf("%s must be token_bucket, fixed_window, sliding_window, daily, weekly, monthly or yearly, got %q", src.field("kind"), c.Kind)
	}
	out.Kind = k.kind
	var err error
	if c.Period != "" { // none is Period 0: a calendar kind's
		if out.Period, err = time.ParseDuration(c.Period); err != nil {
			return out, fmt.Errorf("%s must be a Go duration such as 1m or 24h, got %q", src.field("period"), c.Period)
		}
	}
	out.Rate, out.Capacity, out.MaxReserved, out.Shards = c.Rate, c.Capacity, c.MaxReserved, c.Shards
	if c.Start != "" {
		out.Start, err = time.Parse(time.RFC3339Nano, c.Start)
		if err != nil {
			return out, fmt.Errorf("%s must be an RFC 3339 time such as 2026-01-01T00:00:00Z, got %q", src.field("start"), c.Start)
		}
	}
	out.Zone = c.Zone
	if c.WeekStart != "" {
		day, ok := weekday(c.WeekStart)
		if !ok {
			return out, fmt.Errorf("%s must be a day of the week, sunday to saturday, got %q", src.field("week_start"), c.WeekStart)
		}
		out.WeekStart = day
	}
	return out, nil
}

// weekday returns the day of the week named s (Monday, monday, ...).
func weekday(s string) (time.Weekday, bool) {
	for d := time.Sunday; d <= time.Saturday; d++ {
		if strings.EqualFold(s, d.String()) {
			return d, true
		}
	}
	return 0, false
}

// configs returns the limits of the -config file (none without one),
// replaced for the command's NAME by the config flags when given. The
// configs are validated by txlimit.New later.
func (inv *invocation) configs() (map[string]txlimit.Config, error) {
	out := map[string]txlimit.Config{}
	if inv.config != "" {
		var err error
		if out, err = readConfigs(inv.config); err != nil {
			return nil, err
		}
	}
	if inv.limit.given() {
		c, err := inv.limit.config()
		if err != nil {
			return nil, usageError{err}
		}
		out[inv.args[0]] = c
	}
	return out, nil
}

// readConfigs reads a file of configs (-config, -to).
func readConfigs(path string) (map[string]txlimit.Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var file map[string]fileConfig
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&file); err != nil {
		return nil, usageError{fmt.Errorf("%s: %v (the file maps each limit's name to its config; see txlimit -help)", path, err)}
	}
	out := make(map[string]txlimit.Config, len(file))
	for name, fc := range file {
		c, err := fc.config(source{file: path, limit: name})
		if err != nil {
			return nil, usageError{err}
		}
		out[name] = c
	}
	return out, nil
}

// source returns where the config of limit name was given: the flags stand
// for the command's NAME, the file for every other limit.
func (inv *invocation) source(name string) source {
	if inv.limit.given() && name == inv.args[0] {
		return source{}
	}
	return source{file: inv.config, limit: name}
}

// configFields are the fields of the configs, as the file spells them, by
// the name of the txlimit.Config field an *txlimit.InvalidError reports.
var configFields = map[string]string{
	"Kind": "kind", "Rate": "rate", "Period": "period", "Capacity": "capacity", "MaxReserved": "max_reserved",
	"Shards": "shards", "Start": "start", "Zone": "zone", "WeekStart": "week_start",
}

// configError is txlimit.New's verdict on a config, told where the operator
// gave the field: "flag -period: Period must be 0 for a calendar window …".
type configError struct {
	invalid *txlimit.InvalidError
	where   string // the flag or file field, or "" when none has the field
}

// invalidConfig returns err, txlimit.New's error on the invocation's configs,
// as the operator gave them.
func (inv *invocation) invalidConfig(err error) error {
	var invalid *txlimit.InvalidError
	if !errors.As(err, &invalid) {
		return fmt.Errorf("invalid config: %w", err)
	}
	e := configError{invalid: invalid}
	if field, ok := configFields[invalid.Field]; ok && invalid.Limit != "" {
		e.where = inv.source(invalid.Limit).field(field)
	}
	return e
}

func (e configError) Error() string {
	where := e.where
	if where == "" && e.invalid.Limit != "" {
		where = "limit " + strconv.Quote(e.invalid.Limit)
	}
	if where != "" {
		where += ": "
	}
	return fmt.Sprintf("invalid config: %s%s %s", where, e.invalid.Field, e.invalid.Problem)
}

// Unwrap makes errors.As(err, new(*txlimit.InvalidError)) true.
func (e configError) Unwrap() error { return e.invalid }
