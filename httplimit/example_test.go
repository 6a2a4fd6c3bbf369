package httplimit_test

import (
	"fmt"
	"log"
	"net/http/httptest"
	"net/netip"

	"github.com/txlimit/txlimit/httplimit"
)

// A server behind a load balancer in 10.0.0.0/8 keys each request by the
// client the load balancer saw, and IPv6 clients by their /64.
func ExampleClientIPKey() {
	key, err := httplimit.ClientIPKey(httplimit.ClientIP{
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, c := range []struct{ peer, xff string }{
		// Through the load balancer, which appended the client's address.
		{"10.0.0.5:41000", "192.0.2.7"},
		// The client wrote an address of its own first: never read.
		{"10.0.0.5:41000", "203.0.113.99, 192.0.2.7"},
		// An IPv6 client: keyed by its /64.
		{"10.0.0.5:41000", "2001:db8:1:2:aaaa::1"},
		// A client that reaches the server directly: its header is ignored.
		{"198.51.100.20:5000", "203.0.113.99"},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = c.peer
		r.Header.Set("X-Forwarded-For", c.xff)
		k, err := key(r)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("from %-18s X-Forwarded-For: %-26s key %s\n", c.peer, c.xff, k)
	}
	// Output:
	// from 10.0.0.5:41000     X-Forwarded-For: 192.0.2.7                  key 192.0.2.7
	// from 10.0.0.5:41000     X-Forwarded-For: 203.0.113.99, 192.0.2.7    key 192.0.2.7
	// from 10.0.0.5:41000     X-Forwarded-For: 2001:db8:1:2:aaaa::1       key 2001:db8:1:2::/64
	// from 198.51.100.20:5000 X-Forwarded-For: 203.0.113.99               key 198.51.100.20
}
