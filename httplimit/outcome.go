package httplimit

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"

	"github.com/txlimit/txlimit"
)

// Mode is how a limit with a Charge holds back requests whose outcome is
// not yet known. Either way, a request the limit cannot grant now is
// denied before its handler runs, and the charge is settled when the
// handler commits its response, before the response's header goes out.
type Mode int

const (
	// Refund takes the request's tokens before the handler runs, as a limit
	// without Charge does, and gives them back (txlimit.Limiter.Credit)
	// when the response is one Charge does not charge. A request holds its
	// tokens while it runs, so no more requests of a key run at once than
	// its limit has tokens, and the responses charged never exceed the
	// limit, however many requests arrive together. The price: a request
	// that will not be charged holds its tokens too while it runs, so a
	// request may be denied because of others that are running and will
	// give theirs back. It is the default, and the mode for limits that
	// guard something (failed logins).
	Refund Mode = iota
	// TakeAfter checks the limit before the handler runs
	// (txlimit.Limiter.Check, which takes nothing) and takes the tokens
	// when the response is one Charge charges. A request holds nothing
	// while it runs, so requests that are not charged never count against
	// the limit; but requests that arrive together all pass the check
	// before any of them is charged. The responses charged can exceed the
	// limit by the requests running when it ran out, and the take never
	// takes more than the limit holds (txlimit.UpTo): a response charged
	// after the tokens ran out is charged what was left, the rest of it
	// is not carried over. It is the mode for limits that meter something
	// frequent that is rarely charged (the 404s of a busy client).
	TakeAfter
)

// Statuses returns a Charge that charges the responses with one of the
// status codes given: Statuses(401, 403) charges failed logins only.
func Statuses(codes ...int) func(r *http.Request, status int, header http.Header) bool {
	codes = slices.Clone(codes)
	return func(_ *http.Request, status int, _ http.Header) bool { return slices.Contains(codes, status) }
}

// errTxByOutcome is Tx's error for a Limit that charges by outcome.
var errTxByOutcome = errors.New("httplimit: Tx cannot apply a limit with a Charge: it sees no response to charge by, " +
	"and the handler's transaction already decides whether the tokens are spent (if and only if it commits); " +
	"give Tx a Limit without Charge, or use Handler")

// checkMode checks the Charge and Mode of r.
func checkMode(r Rule) error {
	switch {
	case r.Mode != Refund && r.Mode != TakeAfter:
		return fmt.Errorf("httplimit: limit %q has Mode %d, which is neither Refund nor TakeAfter", r.Name, int(r.Mode))
	case r.Charge == nil && r.Mode == TakeAfter:
		return fmt.Errorf("httplimit: limit %q has Mode TakeAfter but no Charge; set Charge to the responses it charges "+
			"(httplimit.Statuses, say), or leave Mode unset to charge every request before the handler", r.Name)
	}
	return nil
}

// takesAfter reports whether ru is checked before the handler and taken
// after it.
func (ru rule) takesAfter() bool { return ru.Charge != nil && ru.Mode == TakeAfter }

// serveByOutcome is Handler for a Limit with a rule that has a Charge.
func (m *Limit[TTx]) serveByOutcome(w http.ResponseWriter, r *http.Request, next http.Handler) {
	reqs, holder, err := m.requests(r)
	if err == nil {
		err = r.Context().Err() // the client has gone: take nothing for it
	}
	if err != nil {
		m.fail(w, r, err)
		return
	}
	// The take before the handler and the charge or refund after it run
	// to the end even when the client goes away: a take cancelled during
	// its commit may have committed all the same, and a refund or a charge
	// cut short would lose the request's tokens or forgive them.
	ctx := context.WithoutCancel(r.Context())
	res, err := m.admit(r.Context(), ctx, reqs)
	if err != nil {
		m.acquireFailed(r, reqs, holder, err)
		m.fail(w, r, err)
		return
	}
	if !m.respond(w, r, res) {
		return
	}
	if m.slots {
		// Released after the charge is settled (defers run last first).
		var release func()
		r, release = m.hold(r, reqs, holder, res)
		defer release()
	}
	ow := &outcomeWriter{ResponseWriter: w}
	ow.settle = func(status int) { m.settle(ctx, r, ow.Header(), status, reqs, res) }
	// Reached without a commit only when next panicked (or called
	// runtime.Goexit) before committing its response: the client gets a
	// broken connection, or the 500 of a recovering middleware outside,
	// and the request is charged as a 500. The panic goes on.
	defer ow.commit(http.StatusInternalServerError)
	next.ServeHTTP(ow, r)
	// A handler that wrote nothing is answered 200 by net/http.
	ow.commit(http.StatusOK)
}

// admit decides whether the request may run: it checks the limits taken
// after the handler, taking nothing, and then takes the others all or none
// in ctx. A denial by a check takes nothing at all. Each Result is that of
// the check or the take, and OK for a limit not asked because a check
// denied.
func (m *Limit[TTx]) admit(reqCtx, ctx context.Context, reqs []txlimit.Request) (txlimit.MultiResult, error) {
	res := txlimit.MultiResult{OK: true, Results: make([]txlimit.Result, len(reqs))}
	var before []txlimit.Request
	var at []int
	for i, ru := range m.rules {
		if !ru.takesAfter() {
			before, at = append(before, reqs[i]), append(at, i)
			continue
		}
		q := reqs[i]
		c, err := m.limiter.Check(reqCtx, q.Name, q.Key, q.Options...)
		if err != nil {
			return res, err
		}
		res.Results[i] = c
		if !c.OK {
			res.OK = false
			res.RetryAfter = max(res.RetryAfter, c.RetryAfter)
		}
	}
	if !res.OK || len(before) == 0 {
		for _, i := range at {
			res.Results[i].OK = true
		}
		return res, nil
	}
	taken, err := m.limit(ctx, before, nil)
	if err != nil {
		return res, err
	}
	for j, i := range at {
		res.Results[i] = taken.Results[j]
	}
	res.OK = taken.OK
	res.RetryAfter = max(res.RetryAfter, taken.RetryAfter)
	return res, nil
}

// settle charges the request by its response, of status and header h, for
// every rule with a Charge: Refund gives back what was taken unless the
// response is charged, TakeAfter takes what the request counts (as much as
// the limit holds) if it is. When a take changed a result, the fields on h
// are set again. An error is logged: the response goes out as it is.
func (m *Limit[TTx]) settle(ctx context.Context, r *http.Request, h http.Header, status int, reqs []txlimit.Request, res txlimit.MultiResult) {
	took := false
	for i, ru := range m.rules {
		if ru.Charge == nil {
			continue
		}
		q, b := reqs[i], res.Results[i]
		charged := ru.Charge(r, status, h)
		switch {
		case ru.Mode == Refund && !charged && b.Taken > 0:
			// Taken is 0 for a grant that FailOpen made: nothing to give back.
			if err := m.limiter.Credit(ctx, q.Name, q.Key, b.Taken); err != nil {
				m.logSettle(ctx, r, ru.Name, status, "give back the tokens of a response not charged", err)
			}
		case ru.Mode == TakeAfter && charged && b.Count > 0:
			t, err := m.limiter.Limit(ctx, q.Name, q.Key, txlimit.UpTo(b.Count))
			if err != nil {
				m.logSettle(ctx, r, ru.Name, status, "charge a response", err)
				continue
			}
			res.Results[i], took = t, true
		}
	}
	if took {
		m.setFields(h, txlimit.MultiResult{OK: true, Results: res.Results})
	}
}

// logSettle logs an error of settle to Options.Logger.
func (m *Limit[TTx]) logSettle(ctx context.Context, r *http.Request, limit string, status int, what string, err error) {
	m.log(ctx, "httplimit: could not "+what+" after the handler; the response went out as the handler wrote it",
		slog.String("method", r.Method), slog.String("path", r.URL.Path),
		slog.String("limit", limit), slog.Int("status", status), slog.String("err", err.Error()))
}

// log logs msg at level Error to Options.Logger, or to slog.Default().
func (m *Limit[TTx]) log(ctx context.Context, msg string, attrs ...slog.Attr) {
	l := m.logger
	if l == nil {
		l = slog.Default()
	}
	l.LogAttrs(ctx, slog.LevelError, msg, attrs...)
}

// outcomeWriter is the ResponseWriter of a handler whose request is charged
// by its response: the first WriteHeader of a final status, Write, Flush or
// Hijack commits the response, and settles the charge before passing the
// call on.
type outcomeWriter struct {
	http.ResponseWriter
	settle    func(status int)
	committed bool
}

// commit settles the charge as a response of status, once.
func (w *outcomeWriter) commit(status int) {
	if w.committed {
		return
	}
	w.committed = true
	w.settle(status)
}

func (w *outcomeWriter) WriteHeader(status int) {
	// An informational status (103 Early Hints) comes before the final
	// one; 101 Switching Protocols is final.
	if status < 100 || status >= 200 || status == http.StatusSwitchingProtocols {
		w.commit(status)
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *outcomeWriter) Write(b []byte) (int, error) {
	w.commit(http.StatusOK)
	return w.ResponseWriter.Write(b)
}

// Flush is http.Flusher's: a handler that flushes before writing sends a
// 200 header.
func (w *outcomeWriter) Flush() { _ = w.FlushError() }

// FlushError is what http.ResponseController.Flush calls.
func (w *outcomeWriter) FlushError() error {
	w.commit(http.StatusOK)
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Hijack hands the connection to the handler, which answers on it as it
// likes: the response is charged as a 101 Switching Protocols, what a
// WebSocket handshake answers.
func (w *outcomeWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, rw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil {
		w.commit(http.StatusSwitchingProtocols)
	}
	return c, rw, err
}

// Unwrap lets http.ResponseController reach the methods outcomeWriter does
// not have (deadlines, full duplex).
func (w *outcomeWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
