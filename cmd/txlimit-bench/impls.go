package main

import (
	"fmt"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/txlimit/txlimit"

	"github.com/txlimit/txlimit/internal/testkit/benchfloor"
	"github.com/txlimit/txlimit/pgsqlstore"
	"github.com/txlimit/txlimit/pgstore"
	"github.com/txlimit/txlimit/sqlitestore"
)

// The implementations every ratio is taken against.
const (
	implFloor   = "floor"   // the hand-written SQL
	implTxlimit = "txlimit" // LimitTx on the database's default store
	// LimitTx on PostgreSQL through database/sql (pgsqlstore)
	implTxlimitSQL = "txlimit/pgsqlstore"
	implRedis      = "redis" // seed 003's Lua script, beside the transaction
	implNone       = "none"  // the business transaction with no limit
	// LimitTx on pgstore with Config.Shards 16, on the business hot key
	implShards16 = "txlimit/shards16"
)

// impl is one implementation measured on one kind of database: a row of the
// tables for every scenario it runs in and every client count. E is what it
// opens its subject on, the connections of one client count.
//
// A txlimit variant is one entry more in pgImpls or sqliteImpls: another
// store on the same connections (pgLimit{p: c.pg, store: …}, or for a
// database/sql store sqlLimit on stdlib.OpenDBFromPool(c.pg.pool) with
// benchfloor.PGBusinessInsert), or the same store with another Config
// (tune: func(cfg *txlimit.Config) {…}). Its rows get the ratios to the
// floor and to Redis of their scenario, and it takes the admission checks
// its checks function lists.
type impl[E any] struct {
	name string
	open func(E) subject
	// runs reports whether the timed cells of a scenario measure it.
	runs func(scenario) bool
	// checks lists the saturating admission checks it takes in a scenario,
	// at the largest client count (nil: none).
	checks func(scenario) []saturation
	// unlimited marks the subject with no limit: its timed runs are not
	// checked and its step is not timed.
	unlimited bool
	// slots marks a subject of the concurrency slots: it runs in the slot
	// scenarios only, and the others never do.
	slots bool
}

// in reports whether im's timed cells measure scenario s.
func (im impl[E]) in(s scenario) bool { return im.slots == s.slots && im.runs(s) }

// saturation is a saturating admission check: clients call until denied.
type saturation int

const (
	// frozenExact: on a frozen clock exactly Capacity is admitted per key.
	frozenExact saturation = iota
	// realBounded: on the real clock, Capacity <= admitted <= Capacity +
	// refill per key.
	realBounded
	// windowExact: a fixed window on the server's clock admits exactly
	// Capacity per key, or at most Capacity per window touched, and counts
	// every call.
	windowExact
	// heldAtOnce: the slots of one hot key, acquired and released by more
	// clients than it has, some of them denied, are held by at most (and at
	// some point exactly) Capacity calls at once, and all free at the end.
	heldAtOnce
)

func (s saturation) String() string {
	switch s {
	case frozenExact:
		return "exact"
	case realBounded:
		return "bounded"
	case windowExact:
		return "window"
	case heldAtOnce:
		return "slots"
	}
	return fmt.Sprintf("saturation(%d)", int(s))
}

func always(scenario) bool        { return true }
func businessHot(s scenario) bool { return s.work == orderWork && s.hot && s.shards <= 1 }
func inBusiness(s scenario) bool  { return s.business() }

// notTpcb: the tpcb-like scenarios measure no limit, txlimit's modes on
// pgstore and the Redis limiters, the rest of the subjects only the others.
func notTpcb(s scenario) bool { return s.work != tpcbWork }

// notBusinessHot leaves out the hot key inside a business transaction,
// which measures the answers for a hot key against the floor and Redis,
// and the tpcb-like scenarios.
func notBusinessHot(s scenario) bool { return s.work == noWork || s.work == orderWork && !s.hot }

// businessChecks are the token bucket's checks, in the business scenarios.
func businessChecks(s scenario) []saturation {
	if !inBusiness(s) {
		return nil
	}
	return bucketChecks(s)
}

// bucketChecks are the token bucket's checks, in every scenario.
func bucketChecks(scenario) []saturation { return []saturation{frozenExact, realBounded} }

// unpooledFloorChecks leaves the sharded floor out: it does not pool its
// rows, so it cannot admit exactly the limit.
func unpooledFloorChecks(s scenario) []saturation {
	if s.shards > 1 || !notTpcb(s) {
		return nil
	}
	return bucketChecks(s)
}

// pgConns are the connections of one client count on PostgreSQL: a pool of
// that size and Redis when -redis is set.
type pgConns struct {
	pg    *pgPool
	redis *redisEnv // nil without -redis
}

// pgImpls are the implementations measured on PostgreSQL.
func pgImpls(withRedis bool) []impl[*pgConns] {
	impls := []impl[*pgConns]{
		// No limit: on distinct keys, which is where the key does not
		// matter, and in tpcb-hot, whose transaction draws its account.
		{name: implNone, runs: func(s scenario) bool { return s.business() && (!s.hot || s.work == tpcbWork) }, checks: nil, unlimited: true,
			open: func(c *pgConns) subject { return pgNone{c.pg} }},
		{name: implFloor, runs: notTpcb, checks: unpooledFloorChecks,
			open: func(c *pgConns) subject { return pgFloor{c.pg} }},
		{name: implTxlimit, runs: always, checks: bucketChecks,
			open: func(c *pgConns) subject { return pgLimit{p: c.pg, store: pgstore.New(c.pg.pool)} }},
		// The same statements on database/sql (pgx's stdlib on the same pool).
		{name: implTxlimitSQL, runs: notBusinessHot,
			checks: func(s scenario) []saturation {
				if !notBusinessHot(s) {
					return nil
				}
				return bucketChecks(s)
			},
			open: func(c *pgConns) subject {
				db := stdlib.OpenDBFromPool(c.pg.pool)
				return sqlLimit{db: db, store: pgsqlstore.New(db), businessSQL: benchfloor.PGBusinessInsert}
			}},
	}
	// LimitTx on the hot key spread over 16 shards: the answer before the
	// work for a hot key.
	impls = append(impls, impl[*pgConns]{name: implShards16, runs: businessHot,
		checks: func(s scenario) []saturation {
			if !businessHot(s) {
				return nil
			}
			return bucketChecks(s)
		},
		open: func(c *pgConns) subject {
			return pgLimit{p: c.pg, store: pgstore.New(c.pg.pool), tune: func(c *txlimit.Config) { c.Shards = 16 }}
		}})
	// The take at commit: Commit, the take riding the COMMIT.
	impls = append(impls, impl[*pgConns]{name: implCommit, runs: inBusiness, checks: businessChecks,
		open: func(c *pgConns) subject { return newPgCommit(c.pg, false) }},
		impl[*pgConns]{name: implCommitLease, runs: inBusiness, checks: businessChecks,
			open: func(c *pgConns) subject { return newPgCommit(c.pg, true) }})
	// The take in the caller's batch: SendBatch, the take queued ahead of
	// the INSERT.
	impls = append(impls, impl[*pgConns]{name: implBatch, runs: inBusiness, checks: businessChecks,
		open: func(c *pgConns) subject { return pgBatch{c.pg} }})
	if withRedis {
		// redis_rate reads Redis's clock: the bounded check only.
		impls = append(impls, impl[*pgConns]{name: implRedisRate, runs: inBusiness,
			checks: func(s scenario) []saturation {
				if !inBusiness(s) {
					return nil
				}
				return []saturation{realBounded}
			},
			open: func(c *pgConns) subject { return redisRate{env: c.redis, p: c.pg} }})
		impls = append(impls, impl[*pgConns]{name: implRedis, runs: inBusiness,
			// Also on the hot key: one counter under every client at once.
			checks: func(s scenario) []saturation {
				if s.shards > 1 {
					return nil
				}
				return []saturation{windowExact}
			},
			open: func(c *pgConns) subject { return redisLimit{env: c.redis, p: c.pg} }})
	}
	// A concurrency slot around the business transaction.
	impls = append(impls, impl[*pgConns]{name: implSlot, runs: always, checks: slotChecks, slots: true,
		open: func(c *pgConns) subject { return pgSlot{c.pg} }})
	if withRedis {
		impls = append(impls, impl[*pgConns]{name: implRedisSemaphore, runs: always, checks: slotChecks, slots: true,
			open: func(c *pgConns) subject { return redisSemaphore{env: c.redis, p: c.pg} }})
	}
	return impls
}

// sqliteImpls are the implementations measured on SQLite.
func sqliteImpls() []impl[*sqliteEnv] {
	return []impl[*sqliteEnv]{
		{name: implFloor, runs: always, checks: bucketChecks,
			open: func(e *sqliteEnv) subject { return sqliteFloor{e.db} }},
		{name: implTxlimit, runs: always, checks: bucketChecks,
			open: func(e *sqliteEnv) subject {
				return sqlLimit{db: e.db, store: sqlitestore.New(e.db), businessSQL: sqliteBusinessInsert}
			}},
	}
}

// selected is the impls that -subjects names, in their order.
func selected[E any](impls []impl[E], cfg config) []impl[E] {
	var out []impl[E]
	for _, im := range impls {
		if cfg.wants(im.name) {
			out = append(out, im)
		}
	}
	return out
}

// opened is an impl's subject on one client count's connections.
type opened struct {
	subject
	name      string
	checks    func(scenario) []saturation
	unlimited bool
}

func openAll[E any](impls []impl[E], e E) []opened {
	out := make([]opened, len(impls))
	for i, im := range impls {
		checks := func(s scenario) []saturation {
			if im.checks == nil || im.slots != s.slots {
				return nil
			}
			return im.checks(s)
		}
		out[i] = opened{subject: im.open(e), name: im.name, checks: checks, unlimited: im.unlimited}
	}
	return out
}

// cellsOf lists the cells of one client count: every scenario, every impl
// that runs in it.
func cellsOf[E any](db string, scenarios []scenario, impls []impl[E], clients int) []cell {
	var cells []cell
	for _, s := range scenarios {
		for _, im := range impls {
			if im.in(s) {
				cells = append(cells, cell{db, s, im.name, clients})
			}
		}
	}
	return cells
}
