package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSummarize(t *testing.T) {
	stream := `{"Action":"start","Package":"example.com/a"}
{"Action":"run","Package":"example.com/a","Test":"TestDB"}
{"Action":"output","Package":"example.com/a","Test":"TestDB","Output":"=== RUN   TestDB\n"}
{"Action":"output","Package":"example.com/a","Test":"TestDB","Output":"    testdb.go:80: txlimit-test: PostgreSQL postgres://u@h/db (TEST_DATABASE_URL)\n"}
{"Action":"pass","Package":"example.com/a","Test":"TestDB"}
{"Action":"run","Package":"example.com/a","Test":"TestIPv6/half"}
{"Action":"output","Package":"example.com/a","Test":"TestIPv6/half","Output":"    keys_test.go:75: SKIPPING the IPv6 half: no ::1\n"}
{"Action":"output","Package":"example.com/a","Test":"TestIPv6/half","Output":"--- SKIP: TestIPv6/half (0.00s)\n"}
{"Action":"skip","Package":"example.com/a","Test":"TestIPv6/half"}
{"Action":"pass","Package":"example.com/a","Elapsed":1.25}
{"Action":"skip","Package":"example.com/empty","Elapsed":0}
{"Action":"run","Package":"example.com/b","Test":"TestX"}
{"Action":"fail","Package":"example.com/b","Test":"TestX"}
{"Action":"fail","Package":"example.com/b","Elapsed":0.5}
`
	var out strings.Builder
	failed, err := summarize(strings.NewReader(stream), &out)
	require.NoError(t, err)
	require.True(t, failed)
	require.Equal(t, `ok   example.com/a (1.2s)
       uses PostgreSQL postgres://u@h/db (TEST_DATABASE_URL)
       SKIP TestIPv6/half: SKIPPING the IPv6 half: no ::1
FAIL example.com/b (0.5s)
       FAIL TestX

1 skipped test(s); FAIL: run go test -v on the failed packages for their output
`, out.String())

	_, err = summarize(strings.NewReader("ok  \texample.com/a\t0.1s\n"), &out)
	require.ErrorContains(t, err, "not go test -json output")
}
