// Package benchfloor is the hand-written SQL that txlimit's benchmarks
// measure it against, the floor: one row a key with the columns of
// txlimit's own table, read with SELECT … FOR UPDATE and written with
// UPDATE in the caller's transaction, the token bucket computed in Go. The
// root package's Go benchmarks and cmd/txlimit-bench both run these
// statements.
package benchfloor

// PostgreSQL: Insert's parameters are the key, the value and the ts;
// Update's the key, the new value and the new ts.
const (
	PGDDL    = `CREATE TABLE floor_table (k text PRIMARY KEY, value double precision NOT NULL, ts timestamptz NOT NULL)`
	PGInsert = `INSERT INTO floor_table (k, value, ts) VALUES ($1, $2, $3) ON CONFLICT (k) DO NOTHING`
	PGSelect = `SELECT value, ts FROM floor_table WHERE k = $1 FOR UPDATE`
	PGUpdate = `UPDATE floor_table SET value = $2, ts = $3 WHERE k = $1`

	// The business write of a business transaction: an order, inserted by
	// the transaction the limit guards, as an application does.
	// PGBusinessInsert's parameters are the key and the amount.
	PGBusinessDDL = `CREATE TABLE bench_orders (id bigserial PRIMARY KEY, k text NOT NULL,
		amount integer NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`
	PGBusinessInsert = `INSERT INTO bench_orders (k, amount) VALUES ($1, $2)`
)

// SQLite, whose transaction holds the write lock from BEGIN IMMEDIATE: the
// same table with ts in microseconds; Update's parameters are the new
// value, the new ts and the key.
const (
	SQLiteDDL    = `CREATE TABLE floor_table (k TEXT PRIMARY KEY, value REAL NOT NULL, ts INTEGER NOT NULL) WITHOUT ROWID`
	SQLiteInsert = `INSERT INTO floor_table (k, value, ts) VALUES (?, ?, ?) ON CONFLICT (k) DO NOTHING`
	SQLiteSelect = `SELECT value, ts FROM floor_table WHERE k = ?`
	SQLiteUpdate = `UPDATE floor_table SET value = ?, ts = ? WHERE k = ?`
)
