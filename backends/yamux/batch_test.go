package yamux

import (
	"bytes"
	"encoding/binary"
	"io"
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

// TestBatchHeadWritev: over a TCP socket a data frame's held header leaves
// with its body's first record in one writev(2); the peer reads header,
// body and a large frame's further records in order, and written counts
// every byte.
func TestBatchHeadWritev(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(c)
		got <- b
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	bc := &batchConn{Conn: nc}
	sc := &sockConn{Conn: bc, bc: bc, idle: time.Minute, wto: time.Minute}
	var want []byte
	for _, size := range []int{5, 16 << 10, 2*batchMax + 100} {
		hdr := yamuxHeader(yamuxTypeData, uint32(size))
		body := make([]byte, size)
		for i := range body {
			body[i] = byte(i * size)
		}
		if _, err := sc.Write(hdr); err != nil {
			t.Fatal(err)
		}
		if bc.headN != len(hdr) {
			t.Fatalf("header not held: headN %d", bc.headN)
		}
		if _, err := sc.Write(body); err != nil {
			t.Fatal(err)
		}
		want = append(append(want, hdr...), body...)
	}
	if n := bc.written.Load(); n != int64(len(want)) {
		t.Errorf("written %d, sent %d", n, len(want))
	}
	nc.Close()
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("peer read %d bytes, want %d in order", len(b), len(want))
	}
}
