package httplimit

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// RetryAfter is the instant an upstream's Retry-After field value asks a
// client to wait until (RFC 9110, section 10.2.3), for txlimit's
// Limiter.Pause: delta-seconds, a decimal number of whole seconds, after
// now, or an HTTP-date, in any of the three forms RFC 9110 has recipients
// accept (IMF-fixdate, the obsolete RFC 850 and asctime forms), returned as
// it is (one already past pauses nothing). Anything else (an empty value,
// a sign, a fraction, a number too large for a time.Duration, a date in
// another format) is an error that quotes it.
//
//	if resp.StatusCode == http.StatusTooManyRequests {
//		until, err := httplimit.RetryAfter(resp.Header.Get("Retry-After"), time.Now())
//		if err == nil {
//			err = limiter.PauseTx(ctx, tx, "upstream", account, until)
//		}
//	}
func RetryAfter(value string, now time.Time) (time.Time, error) {
	v := strings.TrimSpace(value)
	if v == "" {
		return time.Time{}, errors.New("httplimit: Retry-After is empty; want delta-seconds (\"120\") or an HTTP-date (\"Sun, 06 Nov 1994 08:49:37 GMT\")")
	}
	if strings.Trim(v, "0123456789") == "" {
		secs, err := strconv.ParseInt(v, 10, 64)
		if err != nil || secs > int64(maxDelay/time.Second) {
			return time.Time{}, fmt.Errorf("httplimit: Retry-After %q is more seconds than a time.Duration holds (at most %d)", value, int64(maxDelay/time.Second))
		}
		return now.Add(time.Duration(secs) * time.Second), nil
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return time.Time{}, fmt.Errorf("httplimit: Retry-After %q is neither delta-seconds (a whole number of seconds, \"120\") "+
			"nor an HTTP-date (\"Sun, 06 Nov 1994 08:49:37 GMT\", RFC 9110 section 5.6.7)", value)
	}
	return t, nil
}

// maxDelay is the longest delta-seconds RetryAfter takes: the whole seconds
// of a time.Duration.
const maxDelay = time.Duration(1<<63 - 1)
