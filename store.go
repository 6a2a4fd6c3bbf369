package txlimit

import "github.com/txlimit/txlimit/driver"

// Store is what New takes: a database's store, pgstore.New(pool),
// pgsqlstore.New(db) or sqlitestore.New(db), whose transaction type TTx the Limiter takes on. It is
// an alias of driver.Store, so that code generic over the transaction type
// can name it; its methods are not a stable API, and it is not meant to be
// implemented outside this module (see package driver).
type Store[TTx any] = driver.Store[TTx]
