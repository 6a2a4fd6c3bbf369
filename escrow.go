package txlimit

import (
	"context"
	"fmt"

	"github.com/txlimit/txlimit/driver"
)

// escrowStore is the Limiter's store's escrow mode, or nil when it has
// none.
func escrowStore[TTx any](store driver.Store[TTx]) driver.Escrower {
	e, _ := any(store).(driver.Escrower)
	return e
}

// checkEscrow rejects an Escrow config that the store e cannot serve.
func checkEscrow(e driver.Escrower, name string, c Config) error {
	if !c.Escrow {
		return nil
	}
	if e == nil {
		return &InvalidError{Limit: name, Field: "Escrow", Problem: "is not supported by this store: escrow mode " +
			"needs PostgreSQL through pgstore; leave Escrow off (and give a hot limit Shards instead)"}
	}
	if err := e.EscrowReady(); err != nil {
		return &InvalidError{Limit: name, Field: "Escrow", Problem: "needs a store that can debit outside the caller's transaction, but the store " + err.Error()}
	}
	return nil
}

// Settle settles the calls that escrow limits (Config.Escrow) took in
// transactions that have ended since: the tokens of a committed call stay
// taken, those of a call that did not commit go back to its limit, and the
// rows that recorded them are deleted. An escrow call settles nothing itself
// but, when it would be denied, the ended calls of its own key that may owe
// it tokens; pgstore settles the rest in the background about once a second
// while escrow calls are made (pgstore.EscrowSettleEvery). Settle is what
// settles the calls left when the calls stop, and bounds the escrow tables
// (two rows per call until it is settled) when the background is off. Run
// it every few seconds, from one process or from many (settlers skip each
// other's rows and never wait for a lock), for example in a goroutine:
//
//	go func() {
//		for range time.Tick(5 * time.Second) {
//			if _, err := limiter.Settle(ctx, 0); err != nil { log.Print(err) }
//		}
//	}()
//
// or as a periodic job of the application's scheduler (River's
// PeriodicJob). Settle needs no configuration of the limits: any Limiter on
// the database settles every escrow limit in it. It runs short transactions
// of its own on the store's pool (ErrNoPool without one) and returns
// ErrInvalid for a store without escrow mode.
//
// It returns what it did, a driver.SettleResult. max bounds the work of one call: the number of pending escrow calls it
// examines (in statements of at most 500); 0 means 10000.
func (l *Limiter[TTx]) Settle(ctx context.Context, max int) (driver.SettleResult, error) {
	if max < 0 {
		return driver.SettleResult{}, &InvalidError{Field: "max", Problem: fmt.Sprintf("must be >= 0 (0 means %d), got %d", driver.DefaultSettleMax, max)}
	}
	if max == 0 {
		max = driver.DefaultSettleMax
	}
	if l.escrow == nil {
		return driver.SettleResult{}, &InvalidError{Field: "store", Problem: "has no escrow mode, so there is nothing to settle: only pgstore has one"}
	}
	return l.escrow.Settle(ctx, driver.SettleParams{Max: max})
}
