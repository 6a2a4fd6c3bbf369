package promobserver_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/promobserver"
	"github.com/txlimit/txlimit/sqlitestore"
)

// An Observer on a registry served at /metrics, scraped after three calls.
// With prometheus.DefaultRegisterer, promhttp.Handler() serves the same.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "promobserver")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+"?_pragma=busy_timeout(5000)&_txlock=immediate")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if err := migrations.Up(ctx, db, migrations.SQLite); err != nil {
		log.Fatal(err)
	}

	reg := prometheus.NewRegistry()
	obs, err := promobserver.New(reg, nil)
	if err != nil {
		log.Fatal(err)
	}
	limiter, err := txlimit.New(sqlitestore.New(db), map[string]txlimit.Config{
		"sendMessage": {Kind: txlimit.TokenBucket, Rate: 2, Period: time.Minute},
	}, &txlimit.Options{Observer: obs.Observe})
	if err != nil {
		log.Fatal(err)
	}
	for range 3 {
		if _, err := limiter.Limit(ctx, "sendMessage", "alice"); err != nil {
			log.Fatal(err)
		}
	}

	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	lines := bufio.NewScanner(resp.Body)
	for lines.Scan() {
		if l := lines.Text(); strings.HasPrefix(l, "txlimit_decisions_total") || strings.HasPrefix(l, "txlimit_lock_wait_seconds_count") {
			fmt.Println(l)
		}
	}
	// Output:
	// txlimit_decisions_total{limit="sendMessage",op="limit",outcome="allowed"} 2
	// txlimit_decisions_total{limit="sendMessage",op="limit",outcome="denied"} 1
	// txlimit_lock_wait_seconds_count{limit="sendMessage",op="limit"} 3
}
