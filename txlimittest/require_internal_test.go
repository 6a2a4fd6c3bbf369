package txlimittest

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

func TestRollbackFuncOfAnotherType(t *testing.T) {
	if _, err := rollbackFunc(struct{}{}); err == nil || !strings.Contains(err.Error(), "struct {}") {
		t.Fatalf("rollbackFunc(struct{}{}) = %v, want an error naming the type", err)
	}
}

func TestExplain(t *testing.T) {
	err := fmt.Errorf("take: %w", context.DeadlineExceeded)
	if got := explain(err); !strings.Contains(got, "take: context deadline exceeded") || !strings.Contains(got, "use the Tx form") {
		t.Errorf("explain(%v) = %q, want the error and its likely cause", err, got)
	}
	if got := explain(context.Canceled); got != "context canceled" {
		t.Errorf("explain(context.Canceled) = %q, want the error alone", got)
	}
}

func TestEqual(t *testing.T) {
	for _, c := range []struct {
		got, want float64
		equal     bool
	}{
		{0.9999999999999999, 1, true},
		{1, 1 + 1e-8, false},
		{0, 1e-10, true},
		{0, 1e-8, false},
		{1e6, 1e6 + 1e-4, true},
		{1e6, 1e6 + 1e-2, false},
		{-2, -2 - 1e-10, true},
	} {
		if got := equal(c.got, c.want); got != c.equal {
			t.Errorf("equal(%v, %v) = %v, want %v", c.got, c.want, got, c.equal)
		}
	}
}
