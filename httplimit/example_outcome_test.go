package httplimit_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"time"

	_ "modernc.org/sqlite"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/httplimit"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/sqlitestore"
)

// Three failed logins an hour per account: a login that succeeds is given
// its token back, so a user who signs in is never locked out by it, and a
// password guesser is after three failures, right password or not.
func ExampleStatuses() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "httplimit-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+
		"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if err := migrations.Up(ctx, db, migrations.SQLite); err != nil {
		log.Fatal(err)
	}
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC) // a clock that stands still
	limiter, err := txlimit.New(sqlitestore.New(db), map[string]txlimit.Config{
		"failedLogins": {Kind: txlimit.TokenBucket, Rate: 3, Period: time.Hour},
	}, &txlimit.Options{Clock: func() time.Time { return now }})
	if err != nil {
		log.Fatal(err)
	}
	account := func(r *http.Request) (string, error) { return r.FormValue("account"), nil }
	lim, err := httplimit.New(limiter, "failedLogins", account, &httplimit.Options{
		Charge: httplimit.Statuses(http.StatusUnauthorized), // Mode: httplimit.Refund, the default
	})
	if err != nil {
		log.Fatal(err)
	}
	login := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.FormValue("password") != "hunter2" {
			http.Error(w, "wrong password", http.StatusUnauthorized)
			return
		}
		fmt.Fprintln(w, "welcome")
	}))

	for _, password := range []string{"hunter2", "123456", "hunter2", "password", "qwerty", "hunter2"} {
		r := httptest.NewRequest("POST", "/login?account=alice&password="+password, nil)
		w := httptest.NewRecorder()
		login.ServeHTTP(w, r)
		res, _ := limiter.Check(ctx, "failedLogins", "alice", txlimit.Count(0))
		fmt.Printf("%-8s %d RateLimit: %s failures left: %v\n", password, w.Code, w.Header().Get("RateLimit"), res.Remaining)
	}
	// Output:
	// hunter2  200 RateLimit: "failedLogins";r=2;t=1200 failures left: 3
	// 123456   401 RateLimit: "failedLogins";r=2;t=1200 failures left: 2
	// hunter2  200 RateLimit: "failedLogins";r=1;t=1200 failures left: 2
	// password 401 RateLimit: "failedLogins";r=1;t=1200 failures left: 1
	// qwerty   401 RateLimit: "failedLogins";r=0;t=1200 failures left: 0
	// hunter2  429 RateLimit: "failedLogins";r=0;t=1200 failures left: 0
}
