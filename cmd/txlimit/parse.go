package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/txlimit/txlimit"
)

var errHelp = errors.New("help")

// invocation is a parsed command line.
type invocation struct {
	command string   // migrate, value, reset, keys, prune
	args    []string // the command's positional arguments
	dsn     string
	config  string // -config file
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
	fs.StringVar(&inv.limit.kind, "kind", "", "")
	fs.Float64Var(&inv.limit.rate, "rate", 0, "")
	fs.StringVar(&inv.limit.period, "period", "", "")
	fs.Float64Var(&inv.limit.capacity, "capacity", 0, "")
	fs.Float64Var(&inv.limit.maxReserved, "max-reserved", 0, "")
	fs.IntVar(&inv.limit.shards, "shards", 0, "")
	fs.StringVar(&inv.limit.start, "start", "", "")
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
	}
	n, ok := want[inv.command]
	switch {
	case !ok:
		return nil, fmt.Errorf("unknown command %q; the commands are migrate, value, reset, keys and prune", inv.command)
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
		return nil, errors.New("no database: give -dsn (postgres://… or a SQLite file) or set TXLIMIT_DSN")
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
	if inv.limit.given() && !(inv.command == "value" || inv.command == "keys" && len(inv.args) == 1) {
		return nil, errors.New("the config flags (-kind, -rate, …) define the limit NAME of value and keys NAME; for other commands use -config")
	}
	return inv, nil
}

var argsWanted = map[string]string{
	"migrate": "one argument (up, down or status)",
	"value":   "two arguments, NAME KEY",
	"reset":   "two arguments, NAME KEY",
	"keys":    "at most one argument, NAME",
	"prune":   "no arguments",
}

var configFlags = []string{"kind", "rate", "period", "capacity", "max-reserved", "shards", "start"}

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
	if !f.set["kind"] || !f.set["rate"] || !f.set["period"] {
		return txlimit.Config{}, errors.New("a limit given by flags needs at least -kind, -rate and -period")
	}
	return fileConfig{
		Kind: f.kind, Rate: f.rate, Period: f.period, Capacity: f.capacity,
		MaxReserved: f.maxReserved, Shards: f.shards, Start: f.start,
	}.config("flag -")
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
}

// config converts c; prefix names where a field comes from in errors.
func (c fileConfig) config(prefix string) (txlimit.Config, error) {
	var out txlimit.Config
	switch strings.ReplaceAll(c.Kind, "-", "_") {
	case "token_bucket":
		out.Kind = txlimit.TokenBucket
	case "fixed_window":
		out.Kind = txlimit.FixedWindow
	default:
		return out, fmt.Errorf("%skind must be token_bucket or fixed_window, got %q", prefix, c.Kind)
	}
	period, err := time.ParseDuration(c.Period)
	if err != nil {
		return out, fmt.Errorf("%speriod must be a Go duration such as 1m or 24h, got %q", prefix, c.Period)
	}
	out.Rate, out.Period, out.Capacity, out.MaxReserved, out.Shards = c.Rate, period, c.Capacity, c.MaxReserved, c.Shards
	if c.Start != "" {
		out.Start, err = time.Parse(time.RFC3339Nano, c.Start)
		if err != nil {
			return out, fmt.Errorf("%sstart must be an RFC 3339 time such as 2026-01-01T00:00:00Z, got %q", prefix, c.Start)
		}
	}
	return out, nil
}

// configs returns the limits of the -config file (none without one),
// replaced for the command's NAME by the config flags when given. The
// configs are validated by txlimit.New later.
func (inv *invocation) configs() (map[string]txlimit.Config, error) {
	out := map[string]txlimit.Config{}
	if inv.config != "" {
		data, err := os.ReadFile(inv.config)
		if err != nil {
			return nil, err
		}
		var file map[string]fileConfig
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&file); err != nil {
			return nil, usageError{fmt.Errorf("%s: %v (the file maps each limit's name to its config; see txlimit -help)", inv.config, err)}
		}
		for name, fc := range file {
			c, err := fc.config(fmt.Sprintf("%s: limit %s: ", inv.config, strconv.Quote(name)))
			if err != nil {
				return nil, usageError{err}
			}
			out[name] = c
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
