package txlimit

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/txlimit/txlimit/internal/driver"
)

var (
	// ErrRateLimited matches (errors.Is) every *RateLimitedError.
	ErrRateLimited = errors.New("txlimit: rate limited")
	// ErrNotMigrated matches the error of every call on a database whose
	// txlimit table is missing or out of date: run migrations.Up first.
	// Options.FailOpen never grants on it.
	ErrNotMigrated = driver.ErrNotMigrated
	// ErrCommitUnknown matches the error of CommitTx and Commit when the
	// connection failed after the COMMIT was sent and before its answer
	// came: the transaction and its tokens may or may not have committed.
	// Find out from its own rows before running its work again.
	ErrCommitUnknown = driver.ErrCommitUnknown
)

// RateLimitedError is the error form of a denied Result.
type RateLimitedError struct {
	Name       string
	Key        string
	RetryAfter time.Duration
	Paused     bool // as Result.Paused
}

func (e *RateLimitedError) Error() string {
	if e.Paused {
		return fmt.Sprintf("txlimit: limit %q key %q: paused, retry after %v", e.Name, e.Key, e.RetryAfter)
	}
	return fmt.Sprintf("txlimit: limit %q key %q: rate limited, retry after %v", e.Name, e.Key, e.RetryAfter)
}

// Is makes errors.Is(err, ErrRateLimited) true.
func (e *RateLimitedError) Is(target error) bool { return target == ErrRateLimited }

// InvalidError reports bad input, and that nothing was written: a config, a
// name, a key, a count, an option a form cannot honour (it names the form
// that can), a store without the pool a form without Tx needs.
type InvalidError struct {
	Limit   string // the limit's name, when known
	Field   string // the offending field or argument
	Problem string // what is wrong and how to fix it
	kind    error  // a sentinel the error also matches, or nil
}

// Unwrap makes the error match the sentinel of its kind, when it has one
// (ErrIdempotencyMismatch).
func (e *InvalidError) Unwrap() error { return e.kind }

func (e *InvalidError) Error() string {
	var b strings.Builder
	b.WriteString("txlimit: ")
	if e.Limit != "" {
		fmt.Fprintf(&b, "limit %q: ", e.Limit)
	}
	b.WriteString(e.Field)
	b.WriteString(" ")
	b.WriteString(e.Problem)
	return b.String()
}

func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }

func validName(name string) error {
	if name == "" {
		return &InvalidError{Field: "name", Problem: "is empty; every limit needs a name"}
	}
	return validText("name", name, name)
}

// maxNameLen and maxKeyLen bound the bytes of a limit's name and key, so
// that (name, key, shard) fits one index entry on every store (PostgreSQL's
// B-tree takes at most 2704 bytes).
const (
	maxNameLen = 256
	maxKeyLen  = 2048
)

func validText(field, limit, s string) error {
	bound := maxKeyLen
	if field == "name" {
		bound = maxNameLen
	}
	if len(s) > bound {
		return &InvalidError{Limit: limit, Field: field, Problem: fmt.Sprintf(
			"is %d bytes long, more than the %d a limit's %s may have; hash it first (for example the hex of its SHA-256)", len(s), bound, field)}
	}
	if strings.IndexByte(s, 0) >= 0 {
		return &InvalidError{Limit: limit, Field: field, Problem: "contains a NUL byte, which PostgreSQL text cannot hold; encode it (hex, base64) first"}
	}
	if !utf8.ValidString(s) {
		return &InvalidError{Limit: limit, Field: field, Problem: "is not valid UTF-8; encode it (hex, base64) first"}
	}
	return nil
}

// storeErr is err as a caller sees it: a store without the pool a form
// without Tx needs is an *InvalidError.
func storeErr(err error) error {
	if errors.Is(err, driver.ErrNoPool) {
		return &InvalidError{Field: "store", Problem: "has no pool or database, which this form needs to run a " +
			"transaction of its own: pass one to the store's New, or use the …Tx form in a transaction of yours"}
	}
	return err
}

// invalid is the *InvalidError of limit's field, its problem formatted.
func invalid(limit, field, problem string, args ...any) *InvalidError {
	return &InvalidError{Limit: limit, Field: field, Problem: fmt.Sprintf(problem, args...)}
}
