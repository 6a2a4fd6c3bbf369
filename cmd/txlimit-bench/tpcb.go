package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/txlimit/txlimit/internal/testkit/benchfloor"
)

// work is what each transaction of a scenario does beside its limit step.
type work int

const (
	// noWork: the limit step alone, BEGIN; step; COMMIT.
	noWork work = iota
	// orderWork: the business transaction, BEGIN; INSERT an order; step;
	// COMMIT, the cheapest write an application guards with a limit.
	orderWork
	// tpcbWork: pgbench's built-in tpcb-like transaction and the step,
	// BEGIN; UPDATE an account; SELECT its balance; UPDATE a teller;
	// UPDATE the branch; INSERT the history row; step; COMMIT, on
	// pgbench's tables at scale tpcbScale: a heavier transaction, the
	// standard one.
	tpcbWork
)

// The tpcb-like scenarios run pgbench's tables at scale 1, in the bench's
// own schema (created by the command, not by the pgbench binary): one
// branch, 10 tellers, 100,000 accounts, the history growing with every
// transaction. At scale 1 every transaction updates the one branch row, as
// pgbench's do, so the clients queue on that row whatever the limit: the
// limit's cost is what it adds to a transaction that already serializes.
//
// Its limits: tpcb (a limit per account) gives each client an account of
// its own (accountOf), which its transactions update and whose limit they
// take, as distinct keys; tpcb-hot (a limit per branch) puts every client
// on the branch's limit, one hot key, each transaction updating a random
// account as pgbench's do.
const (
	tpcbScale        = 1
	tpcbBranches     = tpcbScale
	tpcbTellers      = 10 * tpcbScale
	tpcbAccounts     = 100_000 * tpcbScale
	tpcbBranchKey    = "branch1"
	tpcbAccountKey   = "account"
	tpcbAccountPrime = 7919 // spreads the clients' accounts over the table
)

// tpcbDDL creates and fills pgbench's four tables (pgbench -i's, with its
// default fillfactor of 100) and collects their statistics. The keys are
// added after the rows, as pgbench -i does.
var tpcbDDL = []string{
	`CREATE TABLE pgbench_branches (bid integer NOT NULL, bbalance integer, filler char(88))`,
	`CREATE TABLE pgbench_tellers (tid integer NOT NULL, bid integer, tbalance integer, filler char(84))`,
	`CREATE TABLE pgbench_accounts (aid integer NOT NULL, bid integer, abalance integer, filler char(84))`,
	`CREATE TABLE pgbench_history (tid integer, bid integer, aid integer, delta integer, mtime timestamp, filler char(22))`,
	fmt.Sprintf(`INSERT INTO pgbench_branches (bid, bbalance) SELECT b, 0 FROM generate_series(1, %d) AS b`, tpcbBranches),
	fmt.Sprintf(`INSERT INTO pgbench_tellers (tid, bid, tbalance) SELECT t, (t - 1) / 10 + 1, 0 FROM generate_series(1, %d) AS t`, tpcbTellers),
	fmt.Sprintf(`INSERT INTO pgbench_accounts (aid, bid, abalance, filler) SELECT a, (a - 1) / 100000 + 1, 0, '' FROM generate_series(1, %d) AS a`, tpcbAccounts),
	`ALTER TABLE pgbench_branches ADD PRIMARY KEY (bid)`,
	`ALTER TABLE pgbench_tellers ADD PRIMARY KEY (tid)`,
	`ALTER TABLE pgbench_accounts ADD PRIMARY KEY (aid)`,
	`VACUUM ANALYZE pgbench_branches, pgbench_tellers, pgbench_accounts, pgbench_history`,
}

// The statements of pgbench's tpcb-like script, in its order; their
// parameters are :aid, :tid, :bid and :delta as pgbench draws them.
const (
	tpcbUpdateAccount = `UPDATE pgbench_accounts SET abalance = abalance + $2 WHERE aid = $1`
	tpcbSelectAccount = `SELECT abalance FROM pgbench_accounts WHERE aid = $1`
	tpcbUpdateTeller  = `UPDATE pgbench_tellers SET tbalance = tbalance + $2 WHERE tid = $1`
	tpcbUpdateBranch  = `UPDATE pgbench_branches SET bbalance = bbalance + $2 WHERE bid = $1`
	tpcbInsertHistory = `INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES ($1, $2, $3, $4, CURRENT_TIMESTAMP)`
)

// accountOf is the account of client i in the tpcb scenario, and the key of
// its limit.
func accountOf(i int) string {
	return tpcbAccountKey + strconv.Itoa(1+i*tpcbAccountPrime%tpcbAccounts)
}

// pgWork is one client's work on PostgreSQL: what each of its
// transactions does beside the limit step.
type pgWork struct {
	kind work
	key  string // the limit's key, under which orders are inserted
	aid  int    // the tpcb client's account; 0 draws one per transaction
}

// newPgWork is the work of w for the client of key (nil for noWork).
func newPgWork(w work, key string) *pgWork {
	if w == noWork {
		return nil
	}
	p := &pgWork{kind: w, key: key}
	if n, ok := strings.CutPrefix(key, tpcbAccountKey); ok && w == tpcbWork {
		p.aid, _ = strconv.Atoi(n)
	}
	return p
}

// tpcbDraw is one transaction's parameters, drawn as pgbench's script
// draws them: a random teller and delta, the branch of the scale, and the
// client's account or a random one.
type tpcbDraw struct{ aid, tid, bid, delta int }

func (p *pgWork) draw() tpcbDraw {
	d := tpcbDraw{aid: p.aid, tid: 1 + rand.IntN(tpcbTellers), bid: 1 + rand.IntN(tpcbBranches), delta: rand.IntN(10001) - 5000}
	if d.aid == 0 {
		d.aid = 1 + rand.IntN(tpcbAccounts)
	}
	return d
}

// do runs the work in tx, one statement after another as an application
// (and pgbench) sends them. A nil work does nothing.
func (p *pgWork) do(ctx context.Context, tx pgx.Tx) error {
	switch {
	case p == nil:
		return nil
	case p.kind == orderWork:
		_, err := tx.Exec(ctx, benchfloor.PGBusinessInsert, p.key, 1)
		return err
	}
	d := p.draw()
	if _, err := tx.Exec(ctx, tpcbUpdateAccount, d.aid, d.delta); err != nil {
		return err
	}
	var balance int
	if err := tx.QueryRow(ctx, tpcbSelectAccount, d.aid).Scan(&balance); err != nil {
		return err
	}
	return p.rest(ctx, tx, d)
}

// rest is what the tpcb work does after its account's two statements.
func (p *pgWork) rest(ctx context.Context, tx pgx.Tx, d tpcbDraw) error {
	if _, err := tx.Exec(ctx, tpcbUpdateTeller, d.tid, d.delta); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, tpcbUpdateBranch, d.bid, d.delta); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, tpcbInsertHistory, d.tid, d.bid, d.aid, d.delta)
	return err
}

// batched splits the work for pgstore.SendBatch, whose take rides the
// caller's batch: first queues the work's first statement into b (the
// order's INSERT; the tpcb account's UPDATE), and then runs the rest, one
// statement after another, once the batch has granted. A nil work queues
// nothing.
func (p *pgWork) batched(b *pgx.Batch) (then func(ctx context.Context, tx pgx.Tx) error) {
	switch {
	case p == nil:
		return func(context.Context, pgx.Tx) error { return nil }
	case p.kind == orderWork:
		b.Queue(benchfloor.PGBusinessInsert, p.key, 1)
		return func(context.Context, pgx.Tx) error { return nil }
	}
	d := p.draw()
	b.Queue(tpcbUpdateAccount, d.aid, d.delta)
	return func(ctx context.Context, tx pgx.Tx) error {
		var balance int
		if err := tx.QueryRow(ctx, tpcbSelectAccount, d.aid).Scan(&balance); err != nil {
			return err
		}
		return p.rest(ctx, tx, d)
	}
}
