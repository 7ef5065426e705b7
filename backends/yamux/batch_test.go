package yamux

import (
	"bytes"
	"encoding/binary"
	"net"
	"testing"
	"time"
)

// recConn records every Write that reaches "the socket".
type recConn struct {
	net.Conn
	writes [][]byte
}

func (r *recConn) Write(p []byte) (int, error) {
	r.writes = append(r.writes, bytes.Clone(p))
	return len(p), nil
}

func (r *recConn) SetWriteDeadline(time.Time) error { return nil }

func yamuxHeader(typ byte, length uint32) []byte {
	h := make([]byte, yamuxHeaderSize)
	h[1] = typ
	binary.BigEndian.PutUint32(h[4:8], 3) // stream id
	binary.BigEndian.PutUint32(h[8:12], length)
	return h
}

// TestBatchFrameOneWrite: a data frame's header and body reach the socket
// in one write; a header without a body (window update, or data with no
// length: a bare FIN) goes out alone at once; a body of batchMax or more
// is not copied into the batch (the header goes first), in order.
func TestBatchFrameOneWrite(t *testing.T) {
	rc := &recConn{}
	bc := &batchConn{Conn: rc}
	sc := &sockConn{Conn: bc, bc: bc, idle: time.Minute, wto: time.Minute}

	hdr, body := yamuxHeader(yamuxTypeData, 5), []byte("hello")
	if n, err := sc.Write(hdr); n != len(hdr) || err != nil {
		t.Fatalf("header write: %d, %v", n, err)
	}
	if len(rc.writes) != 0 {
		t.Fatalf("header reached the socket before its body: %d writes", len(rc.writes))
	}
	if n, err := sc.Write(body); n != len(body) || err != nil {
		t.Fatalf("body write: %d, %v", n, err)
	}
	if len(rc.writes) != 1 || !bytes.Equal(rc.writes[0], append(bytes.Clone(hdr), body...)) {
		t.Fatalf("socket writes %q, want header‖body in one write", rc.writes)
	}

	for _, h := range [][]byte{yamuxHeader(1, 1<<20), yamuxHeader(yamuxTypeData, 0)} {
		rc.writes = nil
		if _, err := sc.Write(h); err != nil {
			t.Fatal(err)
		}
		if len(rc.writes) != 1 || !bytes.Equal(rc.writes[0], h) {
			t.Fatalf("header %x: socket writes %q, want it alone at once", h, rc.writes)
		}
	}

	rc.writes = nil
	big := make([]byte, 2*batchMax+100)
	for i := range big {
		big[i] = byte(i)
	}
	if _, err := sc.Write(yamuxHeader(yamuxTypeData, uint32(len(big)))); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Write(big); err != nil {
		t.Fatal(err)
	}
	var got []byte
	for _, w := range rc.writes {
		got = append(got, w...)
	}
	if len(rc.writes) < 2 || !bytes.Equal(got[yamuxHeaderSize:], big) {
		t.Fatalf("%d socket writes, %d bytes: want the body in order, not copied into one batch", len(rc.writes), len(got))
	}

	// Outside a batch (crypto/tls's handshake, alerts) writes go through.
	rc.writes = nil
	if _, err := bc.Write([]byte("alert")); err != nil || len(rc.writes) != 1 {
		t.Fatalf("direct write: %v, %d socket writes", err, len(rc.writes))
	}
}

// TestCutCtrlFrame: control frames are split off a buffer whole, an
// incomplete one asks for more bytes, and a prefix announcing more than
// maxCtrlFrame (or a third prefix byte) is malformed.
func TestCutCtrlFrame(t *testing.T) {
	big := append([]byte{0x80, 0x04}, make([]byte, maxCtrlFrame)...) // 512 in two bytes
	cases := []struct {
		in   []byte
		body []byte
		n    int
		ok   bool
	}{
		{nil, nil, 0, true},
		{[]byte{3, 1, 2}, nil, 0, true},
		{[]byte{3, 1, 2, 3, 9}, []byte{1, 2, 3}, 4, true},
		{[]byte{0}, []byte{}, 1, true},
		{[]byte{0x80}, nil, 0, true},
		{big, big[2:], len(big), true},
		{[]byte{0x81, 0x04}, nil, 0, false},       // 513
		{[]byte{0x80, 0x80, 0x01}, nil, 0, false}, // third prefix byte
	}
	for _, c := range cases {
		body, n, ok := cutCtrlFrame(c.in)
		if ok != c.ok || n != c.n || !bytes.Equal(body, c.body) {
			t.Errorf("cutCtrlFrame(% x): %x, %d, %v; want %x, %d, %v", c.in[:min(len(c.in), 4)], body[:min(len(body), 4)], n, ok, c.body[:min(len(c.body), 4)], c.n, c.ok)
		}
	}
}
