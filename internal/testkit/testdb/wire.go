package testdb

import (
	"encoding/binary"
	"net"
	"sync"
)

// ReadyCounter counts the round trips of PostgreSQL connections from what
// the server sends: every simple query, and every extended-protocol Sync,
// ends with one ReadyForQuery message ('Z'). Wrap each connection a driver
// dials with Conn; the messages must not be encrypted (sslmode=disable).
type ReadyCounter struct {
	mu    sync.Mutex
	ready int
}

// Conn returns conn, counting the ReadyForQuery messages read from it.
func (c *ReadyCounter) Conn(conn net.Conn) net.Conn {
	return &readyConn{Conn: conn, c: c}
}

// Take returns the count since the last Take and starts again from zero.
func (c *ReadyCounter) Take() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.ready
	c.ready = 0
	return n
}

// readyConn follows the server's messages (a type byte, then a big-endian
// length that counts itself) across reads.
type readyConn struct {
	net.Conn
	c      *ReadyCounter
	header [5]byte
	inHdr  int
	body   int
}

func (rc *readyConn) Read(p []byte) (int, error) {
	n, err := rc.Conn.Read(p)
	for b := p[:n]; len(b) > 0; {
		if rc.body > 0 {
			k := min(rc.body, len(b))
			rc.body -= k
			b = b[k:]
			continue
		}
		k := copy(rc.header[rc.inHdr:], b)
		rc.inHdr += k
		b = b[k:]
		if rc.inHdr == len(rc.header) {
			if rc.header[0] == 'Z' {
				rc.c.mu.Lock()
				rc.c.ready++
				rc.c.mu.Unlock()
			}
			rc.body = int(binary.BigEndian.Uint32(rc.header[1:])) - 4
			rc.inHdr = 0
		}
	}
	return n, err
}
