// Command mysqlexp measures, on MariaDB or MySQL, what a limit's call costs
// on tables of different designs: the hand-written floor's two statements
// (SELECT … FOR UPDATE, UPDATE, as cmd/txlimit-bench runs them) on the
// floor's one-column table and on variants of txlimit's (its own, without
// the CHECK, shorter columns, one VARBINARY key), a minimal one-statement
// take (take_min: INSERT … ON DUPLICATE KEY UPDATE … RETURNING with no
// arithmetic, the bound of any one-statement take) and mysqlstore itself
// (txlimit), on the table its migrations create; and the business
// transaction as cmd/txlimit-bench runs it (BEGIN; INSERT an order;
// LimitTx; COMMIT), each client on its own key (biz) or every client on one
// (bizhot). It runs every variant for
// -d with -clients connections, one key each, round after round
// (interleaved), and prints calls/s, the server's CPU per call (utime+stime
// of -pid, the mysqld process, from /proc), its own CPU per call, and the
// CPU the rest of the machine used meanwhile ("other"); the medians skip
// rounds whose "other" exceeds -maxother. With -callgrind, -dsn is a server
// running under valgrind's callgrind with --dump-before='refresh_status*'
// and its out-file in that directory: each run is bracketed by FLUSH STATUS,
// which makes callgrind dump its counts, and the server's instructions per
// call, which do not move with the machine's load, are printed too
// (callgrind_control needs ptrace, which a container may not allow). It
// works in the database
// exp_mysqlperf, which it drops and creates.
//
//	go run . -pid $(pgrep -x mariadbd) -clients 8 -rounds 8 -only floor,cur,one,txlimit
//	go run . -pid $(pgrep -x mariadbd) -clients 32 -rounds 1 -d 3s -only biz,bizhot
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/measure"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/mysqlstore"
)

type variant struct {
	name   string
	ddl    string
	insert string // args: name, key, shard, id
	sel    string
	upd    string
}

func id(name, key string, shard int) []byte {
	b := []byte(name)
	b = append(b, 0)
	b = append(b, key...)
	b = append(b, 0, byte(shard>>24), byte(shard>>16), byte(shard>>8), byte(shard))
	return b
}

var variants = []variant{
	{"floor", "CREATE TABLE v_floor (k VARBINARY(600) PRIMARY KEY, value DOUBLE NOT NULL, ts DATETIME(6) NOT NULL)",
		"INSERT INTO v_floor VALUES (?, 1e9, UTC_TIMESTAMP(6))", "SELECT value, ts FROM v_floor WHERE k = ? FOR UPDATE", "UPDATE v_floor SET value = ?, ts = ? WHERE k = ?"},
	{"cur", "CREATE TABLE v_cur (name VARBINARY(256) NOT NULL, `key` VARBINARY(2048) NOT NULL, shard INT NOT NULL, value DOUBLE NOT NULL, prev DOUBLE NOT NULL DEFAULT 0, ts DATETIME(6) NOT NULL, PRIMARY KEY (name, `key`, shard), CONSTRAINT v_cur_c CHECK (shard >= 0)) ENGINE=InnoDB ROW_FORMAT=DYNAMIC",
		"INSERT INTO v_cur (name, `key`, shard, value, ts) VALUES (?, ?, ?, 1e9, UTC_TIMESTAMP(6))", "SELECT value, ts FROM v_cur WHERE name = ? AND `key` = ? AND shard = ? FOR UPDATE", "UPDATE v_cur SET value = ?, ts = ? WHERE name = ? AND `key` = ? AND shard = ?"},
	{"nocheck", "CREATE TABLE v_nocheck (name VARBINARY(256) NOT NULL, `key` VARBINARY(2048) NOT NULL, shard INT NOT NULL, value DOUBLE NOT NULL, prev DOUBLE NOT NULL DEFAULT 0, ts DATETIME(6) NOT NULL, PRIMARY KEY (name, `key`, shard)) ENGINE=InnoDB ROW_FORMAT=DYNAMIC",
		"INSERT INTO v_nocheck (name, `key`, shard, value, ts) VALUES (?, ?, ?, 1e9, UTC_TIMESTAMP(6))", "SELECT value, ts FROM v_nocheck WHERE name = ? AND `key` = ? AND shard = ? FOR UPDATE", "UPDATE v_nocheck SET value = ?, ts = ? WHERE name = ? AND `key` = ? AND shard = ?"},
	{"short", "CREATE TABLE v_short (name VARBINARY(64) NOT NULL, `key` VARBINARY(512) NOT NULL, shard INT NOT NULL, value DOUBLE NOT NULL, prev DOUBLE NOT NULL DEFAULT 0, ts DATETIME(6) NOT NULL, PRIMARY KEY (name, `key`, shard)) ENGINE=InnoDB ROW_FORMAT=DYNAMIC",
		"INSERT INTO v_short (name, `key`, shard, value, ts) VALUES (?, ?, ?, 1e9, UTC_TIMESTAMP(6))", "SELECT value, ts FROM v_short WHERE name = ? AND `key` = ? AND shard = ? FOR UPDATE", "UPDATE v_short SET value = ?, ts = ? WHERE name = ? AND `key` = ? AND shard = ?"},
	{"one", "CREATE TABLE v_one (id VARBINARY(2310) NOT NULL PRIMARY KEY, value DOUBLE NOT NULL, prev DOUBLE NOT NULL DEFAULT 0, ts DATETIME(6) NOT NULL) ENGINE=InnoDB ROW_FORMAT=DYNAMIC",
		"INSERT INTO v_one (id, value, ts) VALUES (?, 1e9, UTC_TIMESTAMP(6))", "SELECT value, ts FROM v_one WHERE id = ? FOR UPDATE", "UPDATE v_one SET value = ?, ts = ? WHERE id = ?"},
	{"floorprev", "CREATE TABLE v_floorprev (k VARBINARY(600) PRIMARY KEY, value DOUBLE NOT NULL, prev DOUBLE NOT NULL DEFAULT 0, ts DATETIME(6) NOT NULL)",
		"INSERT INTO v_floorprev (k, value, ts) VALUES (?, 1e9, UTC_TIMESTAMP(6))", "SELECT value, ts FROM v_floorprev WHERE k = ? FOR UPDATE", "UPDATE v_floorprev SET value = ?, ts = ? WHERE k = ?"},
	{"floor2310", "CREATE TABLE v_floor2310 (k VARBINARY(2310) PRIMARY KEY, value DOUBLE NOT NULL, ts DATETIME(6) NOT NULL)",
		"INSERT INTO v_floor2310 VALUES (?, 1e9, UTC_TIMESTAMP(6))", "SELECT value, ts FROM v_floor2310 WHERE k = ? FOR UPDATE", "UPDATE v_floor2310 SET value = ?, ts = ? WHERE k = ?"},
	{"one600", "CREATE TABLE v_one600 (id VARBINARY(600) NOT NULL PRIMARY KEY, value DOUBLE NOT NULL, prev DOUBLE NOT NULL DEFAULT 0, ts DATETIME(6) NOT NULL) ENGINE=InnoDB ROW_FORMAT=DYNAMIC",
		"INSERT INTO v_one600 (id, value, ts) VALUES (?, 1e9, UTC_TIMESTAMP(6))", "SELECT value, ts FROM v_one600 WHERE id = ? FOR UPDATE", "UPDATE v_one600 SET value = ?, ts = ? WHERE id = ?"},
	{"txlimit", "", "", "", ""},
	{"biz", "", "", "", ""},
	{"bizhot", "", "", "", ""},
	{"take_min", "", "", "INSERT INTO v_cur (name, `key`, shard, value, ts) VALUES (?, ?, 0, 1e9, UTC_TIMESTAMP(6)) ON DUPLICATE KEY UPDATE value = value - 1, ts = UTC_TIMESTAMP(6) RETURNING value, ts, 1, UTC_TIMESTAMP(6)", ""},
	{"onecols", "CREATE TABLE v_onecols (id VARBINARY(2310) NOT NULL PRIMARY KEY, name VARBINARY(256) NOT NULL, `key` VARBINARY(2048) NOT NULL, shard INT NOT NULL, value DOUBLE NOT NULL, prev DOUBLE NOT NULL DEFAULT 0, ts DATETIME(6) NOT NULL) ENGINE=InnoDB ROW_FORMAT=DYNAMIC",
		"INSERT INTO v_onecols (id, name, `key`, shard, value, ts) VALUES (?, ?, ?, ?, 1e9, UTC_TIMESTAMP(6))", "SELECT value, ts FROM v_onecols WHERE id = ? FOR UPDATE", "UPDATE v_onecols SET value = ?, ts = ? WHERE id = ?"},
}

// cpu is the CPU process pid ("self": this one) has used, in clock ticks.
func cpu(pid string) int64 {
	_, ticks, err := measure.ProcessTicks(pid)
	if err != nil {
		panic(err)
	}
	return ticks
}

func busy() int64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		panic(err)
	}
	f := strings.Fields(strings.SplitN(string(b), "\n", 2)[0])[1:]
	var t int64
	for i, x := range f {
		v, _ := strconv.ParseInt(x, 10, 64)
		if i != 3 && i != 4 {
			t += v
		}
	}
	return t
}

func main() {
	dsn := flag.String("dsn", "root:@tcp(127.0.0.1:3306)/", "")
	pid := flag.String("pid", "", "the pid of the server process (mariadbd or mysqld), required")
	clients := flag.Int("clients", 8, "")
	dur := flag.Duration("d", 2*time.Second, "")
	rounds := flag.Int("rounds", 3, "")
	maxOther := flag.Float64("maxother", 0.15, "drop samples where other processes used more CPUs")
	only := flag.String("only", "", "comma list")
	flag.StringVar(&cgDir, "callgrind", "", "callgrind's output directory, when -pid runs under valgrind --tool=callgrind")
	flag.Parse()
	if *pid == "" {
		fmt.Fprintln(os.Stderr, "mysqlexp: -pid is required (the server process: pgrep -x mariadbd)")
		os.Exit(2)
	}
	ctx := context.Background()
	admin, err := sql.Open("mysql", *dsn)
	must(err)
	admin.Exec("DROP DATABASE IF EXISTS exp_mysqlperf")
	_, err = admin.Exec("CREATE DATABASE exp_mysqlperf")
	must(err)
	db, err := sql.Open("mysql", strings.Replace(*dsn, ")/", ")/exp_mysqlperf", 1)+"?parseTime=true&interpolateParams=true")
	must(err)
	db.SetMaxOpenConns(*clients + 2)
	db.SetMaxIdleConns(*clients + 2)
	var vs []variant
	for _, v := range variants {
		if *only == "" || strings.Contains(","+*only+",", ","+v.name+",") {
			vs = append(vs, v)
		}
	}
	must(migrations.Up(ctx, db, migrations.MySQL))
	const name = "mysql-distinct"
	limiter, err = txlimit.New(mysqlstore.New(db), map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Hour, Capacity: 1e9}}, nil)
	must(err)
	_, err = db.Exec("CREATE TABLE bench_orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, k VARCHAR(600) NOT NULL, " +
		"amount INT NOT NULL, created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6))")
	must(err)
	for _, v := range variants {
		if v.ddl == "" {
			continue
		}
		_, err := db.Exec(v.ddl)
		must(err)
		for c := 0; c < *clients; c++ {
			key := fmt.Sprintf("client%d", c)
			args := argsFor(v, name, key, 0, true)
			_, err := db.Exec(v.insert, args...)
			must(err)
		}
	}
	res := map[string][][3]float64{}
	for r := 0; r < *rounds; r++ {
		for _, v := range vs {
			calls, us := run(ctx, db, v, name, *clients, *dur, *pid)
			if lastOther < *maxOther {
				res[v.name] = append(res[v.name], [3]float64{calls, us, lastSelf})
			}
			fmt.Printf("round %d %-12s %8.0f calls/s %6.1f µs/call  client %5.1f µs/call  other %.2f cpus  server %.0f instructions/call\n",
				r, v.name, calls, us, lastSelf, lastOther, lastInstr)
		}
	}
	fmt.Println("medians:")
	for _, v := range vs {
		var a, b, c []float64
		for _, x := range res[v.name] {
			a, b, c = append(a, x[0]), append(b, x[1]), append(c, x[2])
		}
		if len(a) == 0 {
			fmt.Printf("%-12s no clean sample\n", v.name)
			continue
		}
		fmt.Printf("%-12s %8.0f calls/s %6.1f µs/call server %6.1f client  n=%d (calls %v; µs %v)\n", v.name, med(a), med(b), med(c), len(a), fmtl(a), fmtl(b))
	}
}

func fmtl(a []float64) string {
	var s []string
	for _, x := range a {
		s = append(s, fmt.Sprintf("%.0f", x))
	}
	return strings.Join(s, " ")
}

func med(a []float64) float64 {
	s := append([]float64(nil), a...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func argsFor(v variant, name, key string, shard int, insert bool) []any {
	switch v.name {
	case "floor", "floorprev", "floor2310":
		return []any{name + "/" + key}
	case "take_min":
		return []any{[]byte(name), []byte(key)}
	case "one", "one600":
		return []any{id(name, key, shard)}
	case "onecols":
		if insert {
			return []any{id(name, key, shard), []byte(name), []byte(key), shard}
		}
		return []any{id(name, key, shard)}
	default:
		return []any{[]byte(name), []byte(key), shard}
	}
}

func run(ctx context.Context, db *sql.DB, v variant, name string, clients int, d time.Duration, pid string) (float64, float64) {
	var n atomic.Int64
	var wg sync.WaitGroup
	conns := make([]*sql.Conn, clients)
	for i := range conns {
		c, err := db.Conn(ctx)
		must(err)
		conns[i] = c
	}
	var before []string
	if cgDir != "" {
		_, err := db.ExecContext(ctx, "FLUSH STATUS")
		must(err)
		before, err = filepath.Glob(filepath.Join(cgDir, "cg.*"))
		must(err)
	}
	c0 := cpu(pid)
	s0, b0 := cpu("self"), busy()
	start := time.Now()
	stop := start.Add(d)
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			key := fmt.Sprintf("client%d", i)
			pk := argsFor(v, name, key, 0, false)
			for time.Now().Before(stop) {
				tx, err := conns[i].BeginTx(ctx, nil)
				must(err)
				var value float64
				var ts time.Time
				if v.name == "txlimit" || v.name == "biz" || v.name == "bizhot" {
					key := key
					if v.name == "bizhot" {
						key = "hot"
					}
					if v.name != "txlimit" {
						_, err := tx.ExecContext(ctx, "INSERT INTO bench_orders (k, amount) VALUES (?, ?)", key, 1)
						must(err)
					}
					res, err := limiter.LimitTx(ctx, tx, name, key)
					must(err)
					if !res.OK {
						panic("denied")
					}
					must(tx.Commit())
					n.Add(1)
					continue
				}
				if v.upd == "" {
					var ok sql.NullInt64
					var clock time.Time
					must(tx.QueryRowContext(ctx, v.sel, pk...).Scan(&value, &ts, &ok, &clock))
					must(tx.Commit())
					n.Add(1)
					continue
				}
				must(tx.QueryRowContext(ctx, v.sel, pk...).Scan(&value, &ts))
				_, err = tx.ExecContext(ctx, v.upd, append([]any{value - 1, time.Now().UTC()}, pk...)...)
				must(err)
				must(tx.Commit())
				n.Add(1)
			}
		}(i)
	}
	wg.Wait()
	el := time.Since(start)
	c1 := cpu(pid)
	other := float64((busy()-b0)-(cpu("self")-s0)-(c1-c0)) / 100 / time.Since(start).Seconds()
	lastOther = other
	lastSelf = float64(cpu("self")-s0) * 1e4 / float64(n.Load())
	for _, c := range conns {
		c.Close()
	}
	calls := float64(n.Load())
	if cgDir != "" {
		_, err := db.ExecContext(ctx, "FLUSH STATUS")
		must(err)
		dumps, err := filepath.Glob(filepath.Join(cgDir, "cg.*"))
		must(err)
		var total int64
		for _, d := range dumps {
			if !slices.Contains(before, d) {
				n, err := measure.CallgrindTotal(d)
				must(err)
				total += n
			}
		}
		lastInstr = float64(total) / calls
	}
	return calls / el.Seconds(), float64(c1-c0) * 1e4 / calls
}

var (
	lastOther, lastSelf float64
	lastInstr           float64
	cgDir               string
	limiter             *txlimit.Limiter[*sql.Tx]
)

func must(err error) {
	if err != nil {
		panic(err)
	}
}
