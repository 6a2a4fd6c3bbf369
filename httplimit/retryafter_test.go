package httplimit_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit/httplimit"
)

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 28, 9, 0, 0, 123456789, time.UTC)
	imf := time.Date(1994, 11, 6, 8, 49, 37, 0, time.UTC)
	for _, c := range []struct {
		value string
		want  time.Time
	}{
		{"120", now.Add(120 * time.Second)},
		{"0", now},
		{" 7 ", now.Add(7 * time.Second)},
		{"0003600", now.Add(time.Hour)},
		{"9223372036", now.Add(9223372036 * time.Second)},
		// RFC 9110's three forms of an HTTP-date, one instant.
		{"Sun, 06 Nov 1994 08:49:37 GMT", imf},
		{"Sunday, 06-Nov-94 08:49:37 GMT", imf},
		{"Sun Nov  6 08:49:37 1994", imf},
		{"Fri, 28 Nov 2026 09:02:00 GMT", time.Date(2026, 11, 28, 9, 2, 0, 0, time.UTC)},
	} {
		got, err := httplimit.RetryAfter(c.value, now)
		require.NoError(t, err, "%q", c.value)
		require.True(t, c.want.Equal(got), "%q: got %v, want %v", c.value, got, c.want)
	}
	for _, junk := range []string{
		"", "   ", "-1", "+5", "1.5", "1e3", "12 seconds", "0x10", "soon",
		"9223372037", "99999999999999999999999",
		"2026-11-28T09:00:00Z", "Sun, 06 Nov 1994 08:49:37 PST", "Sun, 06 Nov 1994",
	} {
		got, err := httplimit.RetryAfter(junk, now)
		require.Error(t, err, "%q parsed as %v", junk, got)
		require.True(t, got.IsZero())
		require.Contains(t, err.Error(), "Retry-After")
		if strings.TrimSpace(junk) != "" {
			require.Contains(t, err.Error(), junk)
		}
	}
}
