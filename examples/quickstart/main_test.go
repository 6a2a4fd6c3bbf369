package main

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// want is the whole output of the quickstart. The README quotes it, so a
// change here is a change to the README too.
const want = `Limit "sendMessage": 3 messages per minute per user, bursts of up to 3 (token bucket).
The limiter's clock stands at 2026-03-01 12:00:00 UTC and moves only when told to.

alice sends 4 messages in a row; each send is one transaction:
  message 1 sent, 2 tokens left
  message 2 sent, 1 token left
  message 3 sent, 0 tokens left
  message 4 denied, retry after 20s; the transaction was rolled back

bob sends 1 message, then rolls back a second send after LimitTx:
  before the second send: 2 tokens
  inside its transaction, after LimitTx: 1 token
  after the rollback: 2 tokens (the token came back)

alice has no tokens left, so she schedules a message with a reservation:
  reserved: OK=true, RetryAfter=20s; the message is stored to be sent at 12:00:20
  alice now has -1 tokens: the reservation is a debt that refills first

Final state:
  alice: -1 tokens, 4 messages
  bob:   2 tokens, 1 message
  the messages table holds 5 rows

One minute later (12:01:00), with 3 tokens refilled per minute:
  alice: 2 tokens, 4 messages
  bob:   3 tokens, 1 message
  the messages table holds 5 rows
`

func TestRun(t *testing.T) {
	// os.MkdirTemp honours TMPDIR: point it at a directory of the test's
	// own to see that run removes what it created.
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)

	var out strings.Builder
	require.NoError(t, run(context.Background(), &out))
	require.Equal(t, want, out.String())

	left, err := os.ReadDir(tmp)
	require.NoError(t, err)
	require.Empty(t, left, "run must remove its temporary database")
}
