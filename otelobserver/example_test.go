package otelobserver_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sort"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/otelobserver"
	"github.com/txlimit/txlimit/sqlitestore"
)

// Decisions by limit and outcome, read back with a ManualReader; in an
// application the MeterProvider has an exporter's reader instead (OTLP, or
// go.opentelemetry.io/otel/exporters/prometheus).
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "otelobserver")
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

	reader := sdkmetric.NewManualReader()
	obs, err := otelobserver.New(otelobserver.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
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

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		log.Fatal(err)
	}
	var lines []string
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if m.Name != "txlimit.decisions" {
			continue
		}
		for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
			name, _ := dp.Attributes.Value(otelobserver.AttrLimit)
			outcome, _ := dp.Attributes.Value(otelobserver.AttrOutcome)
			lines = append(lines, fmt.Sprintf("txlimit.decisions{txlimit.limit=%s, txlimit.outcome=%s} %d", name.AsString(), outcome.AsString(), dp.Value))
		}
	}
	sort.Strings(lines)
	for _, l := range lines {
		fmt.Println(l)
	}
	// Output:
	// txlimit.decisions{txlimit.limit=sendMessage, txlimit.outcome=allowed} 2
	// txlimit.decisions{txlimit.limit=sendMessage, txlimit.outcome=denied} 1
}
