package httplimit_test

import (
	"context"
	"database/sql"
	"errors"
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

type exampleUser struct{}

// Two limits on every request, all or none: 2 a minute per user and 3 a
// minute for everyone together. The header fields are those of the limit
// that binds.
func ExampleNewAll() {
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
		"perUser": {Kind: txlimit.TokenBucket, Rate: 2, Period: time.Minute},
		"global":  {Kind: txlimit.TokenBucket, Rate: 3, Period: time.Minute},
	}, &txlimit.Options{Clock: func() time.Time { return now }})
	if err != nil {
		log.Fatal(err)
	}

	// The user your authentication middleware put in the context.
	userKey := func(r *http.Request) (string, error) {
		if u, ok := r.Context().Value(exampleUser{}).(string); ok {
			return u, nil
		}
		return "", errors.New("not signed in")
	}
	api, err := httplimit.NewAll(limiter, []httplimit.Rule{
		{Name: "perUser", Key: userKey},
		{Name: "global", Key: func(*http.Request) (string, error) { return "", nil }},
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	h := api.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))

	for _, user := range []string{"alice", "alice", "alice", "bob", "carol"} {
		r := httptest.NewRequest("GET", "/api/", nil)
		r = r.WithContext(context.WithValue(r.Context(), exampleUser{}, user))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Printf("%-5s %d RateLimit: %s", user, w.Code, w.Header().Get("RateLimit"))
		if ra := w.Header().Get("Retry-After"); ra != "" {
			fmt.Printf(" Retry-After: %s", ra)
		}
		fmt.Println()
	}
	perUser, _ := limiter.Check(ctx, "perUser", "carol", txlimit.Count(0))
	fmt.Println("carol's own limit, untouched by the denial:", perUser.Remaining)
	// Output:
	// alice 200 RateLimit: "perUser";r=1;t=30
	// alice 200 RateLimit: "perUser";r=0;t=30
	// alice 429 RateLimit: "perUser";r=0;t=30 Retry-After: 30
	// bob   200 RateLimit: "global";r=0;t=20
	// carol 429 RateLimit: "global";r=0;t=20 Retry-After: 20
	// carol's own limit, untouched by the denial: 2
}
