// Command databasesql shows txlimit in the *sql.Tx of three libraries built
// on database/sql: GORM, bun and sqlx. One *sql.DB (pgx's database/sql
// driver; lib/pq works the same) is shared by all three and by the limiter,
// whose store is pgsqlstore; each library begins a transaction its own way
// and hands the *sql.Tx under it to LimitTx, which consumes the limit in
// that transaction: the comment and the token commit or roll back together.
//
// A user may post 2 comments a minute. alice posts through GORM, bob through
// bun and carol through sqlx, 3 comments each: the third is denied, its
// transaction rolled back, and the comment is not stored.
//
// The program works in a schema of its own, created at the start (txlimit's
// goose migrations run there) and dropped at the end:
//
//	cd examples/databasesql && go run .
//
// TEST_DATABASE_URL selects the server, as it does for the tests (one
// variable for the PostgreSQL the repository's programs and tests use); it
// defaults to the local test server,
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable.
package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net/url"
	"os"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	"github.com/jmoiron/sqlx"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/pgsqlstore"
)

const defaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// commentLimit is the limit each comment takes a token from, per user.
const commentLimit = "postComment"

func main() {
	if err := run(context.Background(), cmp.Or(os.Getenv("TEST_DATABASE_URL"), defaultDatabaseURL), nil, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

// App is the example's database: one *sql.DB in a schema of its own, the
// three libraries on it, and the limiter.
type App struct {
	Schema  string
	DB      *sql.DB
	Gorm    *gorm.DB
	Bun     *bun.DB
	Sqlx    *sqlx.DB
	Limiter *txlimit.Limiter[*sql.Tx] // TTx is *sql.Tx: pgsqlstore's
	admin   *sql.DB
}

// Setup creates a schema, runs txlimit's migrations and a comments table in
// it, and opens the libraries and the limiter on it. clock, when not nil,
// replaces the database's clock (for tests).
func Setup(ctx context.Context, databaseURL string, clock func() time.Time) (*App, error) {
	admin, err := sql.Open("pgx", databaseURL)
	if err != nil {
		return nil, err
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	app := &App{Schema: "txlimit_example_" + hex.EncodeToString(b), admin: admin}
	if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+app.Schema); err != nil {
		_ = admin.Close()
		return nil, err
	}
	if err := app.open(ctx, databaseURL, clock); err != nil {
		app.Close(ctx)
		return nil, err
	}
	return app, nil
}

func (app *App) open(ctx context.Context, databaseURL string, clock func() time.Time) error {
	u, err := url.Parse(databaseURL)
	if err != nil {
		return err
	}
	q := u.Query()
	q.Set("search_path", app.Schema)
	u.RawQuery = q.Encode()
	if app.DB, err = sql.Open("pgx", u.String()); err != nil {
		return err
	}
	if err := migrations.Up(ctx, app.DB, migrations.Postgres); err != nil {
		return err
	}
	if _, err := app.DB.ExecContext(ctx, `CREATE TABLE comments (id bigserial PRIMARY KEY, author text NOT NULL, body text NOT NULL, via text NOT NULL)`); err != nil {
		return err
	}

	// The three libraries, each on the same *sql.DB.
	if app.Gorm, err = gorm.Open(postgres.New(postgres.Config{Conn: app.DB}), &gorm.Config{Logger: logger.Discard}); err != nil {
		return err
	}
	app.Bun = bun.NewDB(app.DB, pgdialect.New())
	app.Sqlx = sqlx.NewDb(app.DB, "pgx")

	var opts *txlimit.Options
	if clock != nil {
		opts = &txlimit.Options{Clock: clock}
	}
	app.Limiter, err = txlimit.New(pgsqlstore.New(app.DB), map[string]txlimit.Config{
		commentLimit: {Kind: txlimit.TokenBucket, Rate: 2, Period: time.Minute},
	}, opts)
	if err != nil {
		return err
	}
	return app.Limiter.Ping(ctx) // the table is there, and this is PostgreSQL
}

// Close drops the schema and closes the databases.
func (app *App) Close(ctx context.Context) {
	if app.DB != nil {
		_ = app.DB.Close()
	}
	_, _ = app.admin.ExecContext(ctx, "DROP SCHEMA IF EXISTS "+app.Schema+" CASCADE")
	_ = app.admin.Close()
}

// Comment is the GORM and bun model of a row of comments.
type Comment struct {
	bun.BaseModel `bun:"table:comments"`
	ID            int64  `bun:",pk,autoincrement"`
	Author        string `gorm:"column:author"`
	Body          string `gorm:"column:body"`
	Via           string `gorm:"column:via"`
}

// limited is the error a transaction function returns for a denial, so that
// the library rolls the transaction back.
func limited(res txlimit.Result) error {
	if !res.OK {
		return res.Err()
	}
	return nil
}

// PostWithGORM stores a comment in a GORM transaction. Inside
// db.Transaction, tx.Statement.ConnPool is the *sql.Tx GORM began (unless
// the session uses PrepareStmt, which wraps it).
func (app *App) PostWithGORM(ctx context.Context, author, body string) error {
	return app.Gorm.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		sqlTx, ok := tx.Statement.ConnPool.(*sql.Tx)
		if !ok {
			return fmt.Errorf("GORM's transaction is a %T, not a *sql.Tx (PrepareStmt sessions wrap it)", tx.Statement.ConnPool)
		}
		res, err := app.Limiter.LimitTx(ctx, sqlTx, commentLimit, author)
		if err != nil {
			return err
		}
		if err := limited(res); err != nil {
			return err
		}
		return tx.Table("comments").Create(&Comment{Author: author, Body: body, Via: "gorm"}).Error
	})
}

// PostWithBun stores a comment in a bun transaction: bun.Tx carries the
// *sql.Tx in its Tx field.
func (app *App) PostWithBun(ctx context.Context, author, body string) error {
	return app.Bun.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		res, err := app.Limiter.LimitTx(ctx, tx.Tx, commentLimit, author)
		if err != nil {
			return err
		}
		if err := limited(res); err != nil {
			return err
		}
		_, err = tx.NewInsert().Model(&Comment{Author: author, Body: body, Via: "bun"}).Exec(ctx)
		return err
	})
}

// PostWithSqlx stores a comment in an sqlx transaction: *sqlx.Tx embeds the
// *sql.Tx.
func (app *App) PostWithSqlx(ctx context.Context, author, body string) (err error) {
	tx, err := app.Sqlx.BeginTxx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	res, err := app.Limiter.LimitTx(ctx, tx.Tx, commentLimit, author)
	if err != nil {
		return err
	}
	if err := limited(res); err != nil {
		return err
	}
	if _, err := tx.NamedExecContext(ctx, `INSERT INTO comments (author, body, via) VALUES (:author, :body, :via)`,
		map[string]any{"author": author, "body": body, "via": "sqlx"}); err != nil {
		return err
	}
	return tx.Commit()
}

// Demo posts 3 comments per user, each user through one library, and
// reports what happened.
func (app *App) Demo(ctx context.Context, out io.Writer) error {
	fmt.Fprintf(out, "Limit %q: 2 comments a minute per user (token bucket), one pgsqlstore limiter on one *sql.DB.\n", commentLimit)
	for _, u := range []struct {
		user, via string
		post      func(ctx context.Context, author, body string) error
	}{
		{"alice", "GORM", app.PostWithGORM},
		{"bob", "bun", app.PostWithBun},
		{"carol", "sqlx", app.PostWithSqlx},
	} {
		fmt.Fprintf(out, "\n%s posts 3 comments through %s, each in one transaction:\n", u.user, u.via)
		for i := 1; i <= 3; i++ {
			err := u.post(ctx, u.user, fmt.Sprintf("comment %d", i))
			var rl *txlimit.RateLimitedError
			switch {
			case errors.As(err, &rl):
				fmt.Fprintf(out, "  comment %d denied, retry after %ds; the transaction was rolled back\n",
					i, int(math.Ceil(rl.RetryAfter.Seconds())))
			case err != nil:
				return err
			default:
				fmt.Fprintf(out, "  comment %d posted\n", i)
			}
		}
		var n int
		if err := app.DB.QueryRowContext(ctx, `SELECT count(*) FROM comments WHERE author = $1`, u.user).Scan(&n); err != nil {
			return err
		}
		read, err := app.Limiter.Check(ctx, commentLimit, u.user)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "  stored: %d comments; tokens left: %.0f\n", n, math.Floor(read.Remaining))
	}
	return nil
}

func run(ctx context.Context, databaseURL string, clock func() time.Time, out io.Writer) error {
	app, err := Setup(ctx, databaseURL, clock)
	if err != nil {
		return err
	}
	defer app.Close(context.WithoutCancel(ctx))
	return app.Demo(ctx, out)
}
