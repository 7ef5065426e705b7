package cas_test

import (
	"bytes"
	"compress/flate"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/memory"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/objstore"
	"forgeyard.dev/transport/wire"
	wcas "forgeyard.dev/transport/wire/cas"
)

func wantOutcome(t testing.TB, err error, want wcas.CasOutcome) {
	t.Helper()
	got, ok := cas.Outcome(err)
	if !ok || got != want {
		t.Fatalf("error %v: want outcome %s", err, want)
	}
}

// TestUploadDownloadIntegrity moves objects of several sizes, 0 and > 8 MiB
// included, up and back down, with and without transport compression.
func TestUploadDownloadIntegrity(t *testing.T) {
	sizes := []int{0, 1, 4095, 64 << 10, 64<<10 + 7, 1 << 20, 9<<20 + 3}
	for _, comp := range []wcas.CasCompression{wcas.CasCompressionNone, wcas.CasCompressionFlate} {
		t.Run(comp.String(), func(t *testing.T) {
			ctx := ctxT(t)
			lease := wire.NewLeaseId()
			local, remote, back := newStore(t, 0), newStore(t, 0), newStore(t, 0)
			a := newAuth()
			var objs []object
			var refs []wire.CasObjectRef
			for i, n := range sizes {
				o := newObject(n, uint64(i+1)*7+uint64(comp))
				put(t, local, o)
				a.allow(lease, cas.AccessWrite|cas.AccessRead, o)
				objs = append(objs, o)
				refs = append(refs, o.ref)
			}
			srv := newServer(t, remote, a, func(c *cas.ServerConfig) { c.Compression = comp })
			l := newMemLink(t, srv, memory.Options{})
			up := newUploader(t, local, func(c *cas.UploaderConfig) { c.Compression = comp })
			if err := up.UploadAll(ctx, l.agent, srv, lease, refs); err != nil {
				t.Fatal(err)
			}
			for _, o := range objs {
				wantContent(t, remote, o)
			}
			if st := up.Stats(); st.Verified != int64(len(objs)) {
				t.Fatalf("uploader stats %+v", st)
			}
			// A second UploadAll finds nothing missing and sends nothing.
			before := up.Stats().BytesSent
			if err := up.UploadAll(ctx, l.agent, srv, lease, refs); err != nil {
				t.Fatal(err)
			}
			if up.Stats().BytesSent != before {
				t.Fatalf("re-upload of stored objects sent %d bytes", up.Stats().BytesSent-before)
			}
			dl := newDownloader(t, back)
			if err := dl.FetchAll(ctx, l.agent, lease, refs); err != nil {
				t.Fatal(err)
			}
			for _, o := range objs {
				wantContent(t, back, o)
			}
			st := srv.Stats()
			if st.UploadsVerified != int64(len(objs)) || st.DownloadsServed != int64(len(objs)) {
				t.Fatalf("server stats %+v", st)
			}
		})
	}
}

// lyingSource serves wrong bytes for every object.
type lyingSource struct{}

func (s lyingSource) Open(ref wire.CasObjectRef, off uint64) (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(make([]byte, ref.Size-off))), nil
}

func TestDigestMismatchCommitsNothing(t *testing.T) {
	ctx := ctxT(t)
	lease := wire.NewLeaseId()
	o := newObject(300<<10, 42)
	remote := newStore(t, 0)
	a := newAuth()
	a.allow(lease, cas.AccessWrite, o)
	srv := newServer(t, remote, a, nil)
	l := newMemLink(t, srv, memory.Options{})
	up := newUploader(t, lyingSource{}, nil)
	err := up.Upload(ctx, l.agent, lease, o.ref)
	wantOutcome(t, err, wcas.CasDigestMismatch)
	if st, err := remote.Stat(o.ref); err != nil || st.Complete || st.Partial != 0 {
		t.Fatalf("after mismatch: stat %+v %v (want nothing stored)", st, err)
	}
	// Downloading a corrupt object held by the daemon: the agent's verdict.
	bad := newObject(100<<10, 43)
	corrupt := bad
	corrupt.data = slices.Clone(bad.data)
	corrupt.data[5000] ^= 1
	p, _ := remote.Create(bad.ref)
	_ = p.Append(corrupt.data)
	if err := p.Commit(); err != nil { // the store trusts its caller's verification
		t.Fatal(err)
	}
	a.allow(lease, cas.AccessRead, bad)
	back := newStore(t, 0)
	err = newDownloader(t, back).Fetch(ctx, l.agent, lease, bad.ref)
	wantOutcome(t, err, wcas.CasDigestMismatch)
	if st, _ := back.Stat(bad.ref); st.Complete || st.Partial != 0 {
		t.Fatalf("downloaded corrupt object kept: %+v", st)
	}
}

// TestResumeAfterCut cuts the connection at about half of an upload, then
// resumes on a new connection: the daemon keeps its prefix and the
// uploader sends only the rest.
func TestResumeAfterCut(t *testing.T) {
	const size = 8 << 20
	for _, comp := range []wcas.CasCompression{wcas.CasCompressionNone, wcas.CasCompressionFlate} {
		t.Run(comp.String(), func(t *testing.T) {
			ctx := ctxT(t)
			lease := wire.NewLeaseId()
			o := newObject(size, 99)
			local, remote := newStore(t, 0), newStore(t, 0)
			put(t, local, o)
			a := newAuth()
			a.allow(lease, cas.AccessWrite|cas.AccessRead, o)
			srv := newServer(t, remote, a, nil)
			up := newUploader(t, local, func(c *cas.UploaderConfig) { c.Compression = comp })

			l1 := newMemLink(t, srv, memory.Options{CutAfterBytes: size / 2})
			err := up.Upload(ctx, l1.agent, lease, o.ref)
			var ce *semantics.ConnError
			if !errors.As(err, &ce) {
				t.Fatalf("cut upload: %v, want a *semantics.ConnError", err)
			}
			l1.close() // every daemon handler has returned: the prefix is kept
			st, err := remote.Stat(o.ref)
			if err != nil || st.Complete || st.Partial == 0 {
				t.Fatalf("after cut: stat %+v %v, want a partial prefix", st, err)
			}
			first := up.Stats().BytesSent

			l2 := newMemLink(t, srv, memory.Options{})
			if err := up.Upload(ctx, l2.agent, lease, o.ref); err != nil {
				t.Fatal(err)
			}
			wantContent(t, remote, o)
			resent := up.Stats().BytesSent - first
			if resent > int64(size-st.Partial)+cas.DefaultBufferSize {
				t.Fatalf("resent %d bytes with a %d-byte verified prefix of %d", resent, st.Partial, size)
			}
			if up.Stats().Probes != 1 || srv.Stats().ResumedUploads != 1 {
				t.Fatalf("uploader %+v server %+v", up.Stats(), srv.Stats())
			}
			t.Logf("%s: cut after %d of %d bytes sent; daemon kept %d (%.0f%%); resume re-sent %d bytes (total - prefix = %d)",
				comp, first, size, st.Partial, 100*float64(st.Partial)/size, resent, size-int(st.Partial))

			// Download side: cut half-way, then the kept prefix is continued.
			back := newStore(t, 0)
			dl := newDownloader(t, back)
			l3 := newMemLink(t, srv, memory.Options{CutAfterBytes: size / 2})
			if err := dl.Fetch(ctx, l3.agent, lease, o.ref); !errors.As(err, &ce) {
				t.Fatalf("cut download: %v", err)
			}
			l3.close()
			bst, _ := back.Stat(o.ref)
			if bst.Partial == 0 {
				t.Fatalf("download prefix not kept: %+v", bst)
			}
			r0 := dl.Stats().BytesReceived
			l4 := newMemLink(t, srv, memory.Options{})
			if err := dl.Fetch(ctx, l4.agent, lease, o.ref); err != nil {
				t.Fatal(err)
			}
			wantContent(t, back, o)
			if got := dl.Stats().BytesReceived - r0; got != int64(size-bst.Partial) {
				t.Fatalf("resumed download received %d bytes, want %d", got, size-bst.Partial)
			}
		})
	}
}

// TestUploadWithoutProbeContinuesAtDaemonOffset: an uploader that does not
// know about the daemon's prefix (a fresh agent process) is told the
// offset by an Aborted ack and continues there.
func TestUploadWithoutProbeContinuesAtDaemonOffset(t *testing.T) {
	ctx := ctxT(t)
	lease := wire.NewLeaseId()
	o := newObject(1<<20, 5)
	local, remote := newStore(t, 0), newStore(t, 0)
	put(t, local, o)
	p, err := remote.Create(o.ref)
	if err != nil {
		t.Fatal(err)
	}
	_ = p.Append(o.data[:300<<10])
	_ = p.Close()
	a := newAuth()
	a.allow(lease, cas.AccessWrite, o)
	srv := newServer(t, remote, a, nil)
	l := newMemLink(t, srv, memory.Options{})
	up := newUploader(t, local, nil)
	if err := up.Upload(ctx, l.agent, lease, o.ref); err != nil {
		t.Fatal(err)
	}
	wantContent(t, remote, o)
	if srv.Stats().ResumedPrefixBytes != 300<<10 {
		t.Fatalf("server %+v", srv.Stats())
	}
}

func TestForbiddenBothDirections(t *testing.T) {
	ctx := ctxT(t)
	lease, other := wire.NewLeaseId(), wire.NewLeaseId()
	o := newObject(200<<10, 11)
	local, remote := newStore(t, 0), newStore(t, 0)
	put(t, local, o)
	a := newAuth()
	a.allow(other, cas.AccessWrite|cas.AccessRead, o)
	a.allow(lease, cas.AccessRead, o) // read, not write
	srv := newServer(t, remote, a, nil)
	l := newMemLink(t, srv, memory.Options{})
	up := newUploader(t, local, nil)
	wantOutcome(t, up.Upload(ctx, l.agent, lease, o.ref), wcas.CasForbidden)
	if content(t, remote, o.ref) != nil {
		t.Fatal("forbidden upload stored")
	}
	// Stored by the lease that may write it; a lease without read access
	// may not download it.
	if err := up.Upload(ctx, l.agent, other, o.ref); err != nil {
		t.Fatal(err)
	}
	third := wire.NewLeaseId()
	back := newStore(t, 0)
	wantOutcome(t, newDownloader(t, back).Fetch(ctx, l.agent, third, o.ref), wcas.CasForbidden)
	if st, _ := back.Stat(o.ref); st.Complete {
		t.Fatal("forbidden download stored")
	}
	if err := newDownloader(t, back).Fetch(ctx, l.agent, lease, o.ref); err != nil {
		t.Fatalf("authorized download: %v", err)
	}
	if got := srv.Stats().Forbidden; got != 2 {
		t.Fatalf("server counted %d forbidden, want 2", got)
	}
}

// TestAuthorizerUnavailableIsRetryable: when the Authorizer cannot tell
// (the authority timed out), an upload and a download are answered
// CasAborted at the offset asked for — never CasForbidden, which an agent
// does not retry — and NeedObjects fails with ErrAuthUnavailable; the same
// requests succeed once the authority answers again.
func TestAuthorizerUnavailableIsRetryable(t *testing.T) {
	ctx := ctxT(t)
	lease := wire.NewLeaseId()
	o := newObject(300<<10, 12)
	local, remote := newStore(t, 0), newStore(t, 0)
	put(t, local, o)
	a := newAuth()
	a.allow(lease, cas.AccessWrite|cas.AccessRead, o)
	srv := newServer(t, remote, a, nil)
	l := newMemLink(t, srv, memory.Options{})
	up := newUploader(t, local, nil)

	a.failNext(1)
	wantOutcome(t, up.Upload(ctx, l.agent, lease, o.ref), wcas.CasAborted)
	if content(t, remote, o.ref) != nil {
		t.Fatal("stored although the authority could not be asked")
	}
	if err := up.Upload(ctx, l.agent, lease, o.ref); err != nil {
		t.Fatalf("upload after the authority recovered: %v", err)
	}

	back := newStore(t, 0)
	a.failNext(1)
	wantOutcome(t, newDownloader(t, back).Fetch(ctx, l.agent, lease, o.ref), wcas.CasAborted)
	if err := newDownloader(t, back).Fetch(ctx, l.agent, lease, o.ref); err != nil {
		t.Fatalf("download after the authority recovered: %v", err)
	}

	a.failNext(1)
	need := &wcas.NeedObjectsV1{Lease: lease, Objects: []wire.CasObjectRef{o.ref}}
	if _, err := srv.NeedObjects(ctx, need); !errors.Is(err, cas.ErrAuthUnavailable) {
		t.Fatalf("NeedObjects with the authority down: %v, want ErrAuthUnavailable", err)
	}
	if m, err := srv.NeedObjects(ctx, need); err != nil || len(m.Objects) != 0 {
		t.Fatalf("NeedObjects after recovery: %v %v, want nothing missing", m, err)
	}
	st := srv.Stats()
	if st.Forbidden != 0 || st.AuthorizerUnavailable != 3 {
		t.Fatalf("stats: forbidden %d, authorizer unavailable %d; want 0 and 3", st.Forbidden, st.AuthorizerUnavailable)
	}
}

// TestNoEnumeration: a lease learns nothing about objects it may not touch,
// from NeedObjects, downloads or resume probes.
func TestNoEnumeration(t *testing.T) {
	ctx := ctxT(t)
	owner, attacker := wire.NewLeaseId(), wire.NewLeaseId()
	stored, absent := newObject(10<<10, 1), newObject(10<<10, 2)
	remote := newStore(t, 0)
	put(t, remote, stored)
	a := newAuth()
	a.allow(owner, cas.AccessRead|cas.AccessWrite, stored, absent)
	srv := newServer(t, remote, a, nil)

	need := &wcas.NeedObjectsV1{Lease: attacker, Objects: []wire.CasObjectRef{stored.ref, absent.ref}}
	m, err := srv.NeedObjects(ctx, need)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(m.Objects, need.Objects) {
		t.Fatalf("attacker's NeedObjects answer %v, want both missing", m.Objects)
	}
	need.Lease = owner
	if m, _ = srv.NeedObjects(ctx, need); !slices.Equal(m.Objects, []wire.CasObjectRef{absent.ref}) {
		t.Fatalf("owner's NeedObjects answer %v, want only the absent one", m.Objects)
	}
	if _, err := srv.NeedObjects(ctx, &wcas.NeedObjectsV1{Lease: owner}); !errors.Is(err, cas.ErrProtocol) {
		t.Fatalf("empty batch: %v", err)
	}

	l := newMemLink(t, srv, memory.Options{})
	var answers []string
	for _, o := range []object{stored, absent} {
		err := newDownloader(t, newStore(t, 0)).Fetch(ctx, l.agent, attacker, o.ref)
		var oe *cas.OutcomeError
		if !errors.As(err, &oe) {
			t.Fatalf("download: %v", err)
		}
		answers = append(answers, fmt.Sprint(oe.Outcome, oe.VerifiedOffset, oe.Remote))
	}
	if answers[0] != answers[1] || answers[0] != fmt.Sprint(wcas.CasForbidden, 0, true) {
		t.Fatalf("download answers differ or are not Forbidden: %q", answers)
	}
	// The owner sees the difference (NotFound for the absent object).
	wantOutcome(t, newDownloader(t, newStore(t, 0)).Fetch(ctx, l.agent, owner, absent.ref), wcas.CasNotFound)

	// Resume probes: same answer for stored and absent.
	answers = answers[:0]
	for _, o := range []object{stored, absent} {
		st, err := l.agent.OpenStream(ctx, wire.StreamCasUpload)
		if err != nil {
			t.Fatal(err)
		}
		writeMsg(t, &st.SendStream, &wcas.CasRangeResumeRequestV1{Lease: attacker, Object: o.ref})
		ack := readAck(t, st)
		answers = append(answers, fmt.Sprint(ack.Outcome, ack.VerifiedOffset))
		st.CancelRead(semantics.StreamCancelled)
		st.CancelWrite(semantics.StreamCancelled)
	}
	if answers[0] != answers[1] || answers[0] != fmt.Sprint(wcas.CasForbidden, 0) {
		t.Fatalf("probe answers %q", answers)
	}
}

func writeMsg(t testing.TB, s *semantics.SendStream, m wire.Message) {
	t.Helper()
	e := wire.Envelope{Protocol: wire.Current, MessageID: wire.NewMessageId(), Payload: m}
	if err := s.WriteEnvelope(&e); err != nil {
		t.Fatal(err)
	}
}

var registry = wire.MustRegistry(wcas.Messages)

func readAck(t testing.TB, st *semantics.Stream) *wcas.CasObjectAckV1 {
	t.Helper()
	_ = st.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, err := st.ReadFrame()
	if err != nil {
		t.Fatalf("reading ack: %v", err)
	}
	e, err := wire.DecodeEnvelope(b, registry)
	if err != nil {
		t.Fatal(err)
	}
	a, ok := e.Payload.(*wcas.CasObjectAckV1)
	if !ok {
		t.Fatalf("got %T, want an ack", e.Payload)
	}
	return a
}

// rawUpload opens an upload stream, writes hdr then body (a writer
// callback so bodies can be streamed), and returns the daemon's ack.
func rawUpload(t *testing.T, l *link, hdr *wcas.CasObjectStreamHeaderV1, body func(w io.Writer) error) *wcas.CasObjectAckV1 {
	t.Helper()
	st, err := l.agent.OpenStream(ctxT(t), wire.StreamCasUpload)
	if err != nil {
		t.Fatal(err)
	}
	writeMsg(t, &st.SendStream, hdr)
	werr := body(&st.SendStream)
	if werr == nil {
		werr = st.SendStream.Close()
	} else {
		st.CancelWrite(semantics.StreamCancelled)
	}
	var se *semantics.StreamError
	if werr != nil && !errors.As(werr, &se) {
		t.Fatalf("writing body: %v", werr)
	}
	a := readAck(t, st)
	st.CancelRead(semantics.StreamCancelled)
	st.CancelWrite(semantics.StreamCancelled)
	return a
}

func TestSizeViolations(t *testing.T) {
	lease := wire.NewLeaseId()
	o := newObject(256<<10, 3)
	huge := newObject(64<<10, 4) // stored under a ref claiming a bigger size
	huge.ref.Size = 2 << 20
	remote := newStore(t, 1<<20)
	a := newAuth()
	a.allow(lease, cas.AccessWrite, o, huge)
	srv := newServer(t, remote, a, nil)
	l := newMemLink(t, srv, memory.Options{})
	send := func(b []byte) func(io.Writer) error {
		return func(w io.Writer) error { _, err := w.Write(b); return err }
	}
	hdr := func(ref wire.CasObjectRef, off, n uint64) *wcas.CasObjectStreamHeaderV1 {
		return &wcas.CasObjectStreamHeaderV1{Lease: lease, Object: ref, Offset: off, Length: n}
	}
	cases := []struct {
		name string
		hdr  *wcas.CasObjectStreamHeaderV1
		body []byte
	}{
		{"range short of the end", hdr(o.ref, 0, o.ref.Size-1), o.data[:len(o.data)-1]},
		{"more bytes than length", hdr(o.ref, 0, o.ref.Size), append(slices.Clone(o.data), 1, 2, 3)},
		{"fewer bytes than length", hdr(o.ref, 0, o.ref.Size), o.data[:len(o.data)-10]},
		{"object above the store limit", hdr(huge.ref, 0, huge.ref.Size), huge.data},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ack := rawUpload(t, l, c.hdr, send(c.body))
			if ack.Outcome != wcas.CasSizeMismatch {
				t.Fatalf("outcome %s, want SizeMismatch", ack.Outcome)
			}
			if st, _ := remote.Stat(c.hdr.Object); st.Complete || st.Partial != 0 {
				t.Fatalf("stored after size violation: %+v", st)
			}
		})
	}
	t.Run("garbage header resets the stream", func(t *testing.T) {
		st, err := l.agent.OpenStream(ctxT(t), wire.StreamCasUpload)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.WriteFrame(func(p []byte) []byte { return append(p, 0xff, 0xff, 0x01) }); err != nil {
			t.Fatal(err)
		}
		_ = st.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = st.ReadFrame()
		var se *semantics.StreamError
		if !errors.As(err, &se) || se.Code != semantics.StreamProtocolError || !se.Remote {
			t.Fatalf("read after garbage header: %v, want a remote StreamProtocolError reset", err)
		}
		st.CancelWrite(semantics.StreamCancelled)
	})
}

// TestCompressionBombBounded: a small Flate body inflating far beyond the
// declared length is cut off at length+1 bytes.
func TestCompressionBombBounded(t *testing.T) {
	lease := wire.NewLeaseId()
	o := newObject(1<<20, 8)
	remote := newStore(t, 0)
	a := newAuth()
	a.allow(lease, cas.AccessWrite, o)
	srv := newServer(t, remote, a, nil)
	l := newMemLink(t, srv, memory.Options{})
	hdr := &wcas.CasObjectStreamHeaderV1{Lease: lease, Object: o.ref, Length: o.ref.Size, Compression: wcas.CasCompressionFlate}
	var compressed countWriter
	ack := rawUpload(t, l, hdr, func(w io.Writer) error {
		compressed.w = w
		fw, _ := flate.NewWriter(&compressed, flate.BestCompression)
		zero := make([]byte, 1<<20)
		for i := 0; i < 256; i++ { // 256 MiB of zeros
			if _, err := fw.Write(zero); err != nil {
				return err
			}
		}
		return fw.Close()
	})
	if ack.Outcome != wcas.CasSizeMismatch {
		t.Fatalf("bomb outcome %s", ack.Outcome)
	}
	if got := srv.Stats().BytesIn; got > int64(o.ref.Size) {
		t.Fatalf("daemon inflated %d bytes for a %d-byte object", got, o.ref.Size)
	}
	if st, _ := remote.Stat(o.ref); st.Complete || st.Partial != 0 {
		t.Fatalf("bomb stored: %+v", st)
	}
	t.Logf("bomb: %d compressed bytes written before the reset; daemon inflated %d", compressed.n, srv.Stats().BytesIn)
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

func TestConcurrencyLimits(t *testing.T) {
	for _, tc := range []struct{ global, perConn, want int }{{2, 0, 2}, {0, 1, 1}} {
		t.Run(fmt.Sprintf("global=%d/perConn=%d", tc.global, tc.perConn), func(t *testing.T) {
			ctx := ctxT(t)
			lease := wire.NewLeaseId()
			local, remote := newStore(t, 0), newStore(t, 0)
			a := newAuth()
			var refs []wire.CasObjectRef
			for i := 0; i < 8; i++ {
				o := newObject(512<<10, uint64(100+i))
				put(t, local, o)
				a.allow(lease, cas.AccessWrite, o)
				refs = append(refs, o.ref)
			}
			srv := newServer(t, remote, a, func(c *cas.ServerConfig) { c.MaxConcurrent, c.MaxPerConn = tc.global, tc.perConn })
			l := newMemLink(t, srv, memory.Options{})
			up := newUploader(t, local, func(c *cas.UploaderConfig) { c.Concurrency = 8 })
			if err := up.UploadAll(ctx, l.agent, srv, lease, refs); err != nil {
				t.Fatal(err)
			}
			st := srv.Stats()
			if st.UploadsVerified != 8 || st.MaxActive > int64(tc.want) || st.MaxActive < 1 {
				t.Fatalf("server stats %+v, want at most %d at once", st, tc.want)
			}
			t.Logf("max concurrent transfers observed: %d (limit %d)", st.MaxActive, tc.want)
		})
	}
}

// TestHeartbeatResponsiveDuringCAS (§181): pings on a heartbeat stream of
// the same Conn keep a bounded p99 while a large upload saturates a
// bandwidth-limited link.
func TestHeartbeatResponsiveDuringCAS(t *testing.T) {
	ctx := ctxT(t)
	lease := wire.NewLeaseId()
	o := newObject(24<<20, 77)
	local, remote := newStore(t, 0), newStore(t, 0)
	put(t, local, o)
	a := newAuth()
	a.allow(lease, cas.AccessWrite, o)
	srv := newServer(t, remote, a, nil)
	l := newMemLink(t, srv, memory.Options{Bandwidth: 64 << 20, SendBuffer: 512 << 10})
	hb, err := l.agent.OpenStream(ctx, wire.StreamHeartbeat)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		hb.CancelWrite(semantics.StreamCancelled)
		hb.CancelRead(semantics.StreamCancelled)
	}()
	up := newUploader(t, local, nil)
	done := make(chan error, 1)
	go func() { done <- up.Upload(ctx, l.agent, lease, o.ref) }()
	ping := make([]byte, 48)
	var rtts []time.Duration
	var uploadErr error
	uploading := true
	for i := 0; i < 200000 && uploading; i++ {
		start := time.Now()
		if err := hb.WriteFrame(func(p []byte) []byte { return append(p, ping...) }); err != nil {
			t.Fatal(err)
		}
		if _, err := hb.ReadFrame(); err != nil {
			t.Fatal(err)
		}
		rtts = append(rtts, time.Since(start))
		select {
		case uploadErr = <-done:
			uploading = false
		default:
		}
	}
	if uploading {
		uploadErr = <-done
	}
	if uploadErr != nil {
		t.Fatal(uploadErr)
	}
	wantContent(t, remote, o)
	if len(rtts) < 10 {
		t.Fatalf("only %d pings during the upload", len(rtts))
	}
	slices.Sort(rtts)
	p50, p99 := rtts[len(rtts)/2], rtts[(len(rtts)*99)/100]
	t.Logf("heartbeat RTT during a %d MiB upload at 64 MiB/s: n=%d p50=%v p99=%v max=%v", len(o.data)>>20, len(rtts), p50, p99, rtts[len(rtts)-1])
	if p99 > 250*time.Millisecond {
		t.Fatalf("heartbeat p99 %v during CAS upload (bound 250ms)", p99)
	}
}

func TestUnsupportedAlgorithm(t *testing.T) {
	ctx := ctxT(t)
	lease := wire.NewLeaseId()
	o := newObject(10, 1)
	ref := o.ref
	ref.Algorithm = wire.DigestBLAKE3
	store := newStore(t, 0)
	if _, err := store.Create(ref); !errors.Is(err, cas.ErrUnsupportedAlgorithm) {
		t.Fatalf("store Create: %v", err)
	}
	a := newAuth()
	srv := newServer(t, store, a, nil)
	l := newMemLink(t, srv, memory.Options{})
	if err := newUploader(t, store, nil).Upload(ctx, l.agent, lease, ref); !errors.Is(err, cas.ErrUnsupportedAlgorithm) {
		t.Fatalf("Upload: %v", err)
	}
	if err := newDownloader(t, store).Fetch(ctx, l.agent, lease, ref); !errors.Is(err, cas.ErrUnsupportedAlgorithm) {
		t.Fatalf("Fetch: %v", err)
	}
	m, err := srv.NeedObjects(ctx, &wcas.NeedObjectsV1{Lease: lease, Objects: []wire.CasObjectRef{ref}})
	if err != nil || len(m.Objects) != 1 {
		t.Fatalf("NeedObjects: %v %v", m, err)
	}
	// A peer that sends one anyway: Aborted when authorized.
	a.allow(lease, cas.AccessWrite, object{ref: ref})
	ack := rawUpload(t, l, &wcas.CasObjectStreamHeaderV1{Lease: lease, Object: ref, Length: ref.Size}, func(w io.Writer) error {
		_, err := w.Write(o.data)
		return err
	})
	if ack.Outcome != wcas.CasAborted || srv.Stats().UnsupportedAlgorithms != 1 {
		t.Fatalf("ack %+v stats %+v", ack, srv.Stats())
	}
}

func TestStoreContract(t *testing.T) {
	s := newStore(t, 1<<20)
	o := newObject(1000, 9)
	p, err := s.Create(o.ref)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(o.ref); !errors.Is(err, cas.ErrBusy) {
		t.Fatalf("second Create: %v", err)
	}
	if err := p.Append(o.data[:400]); err != nil {
		t.Fatal(err)
	}
	if err := p.Commit(); err == nil {
		t.Fatal("Commit of a partial object succeeded")
	}
	// A refused Commit leaves the partial open; Close keeps the prefix.
	_ = p.Close()
	if st, _ := s.Stat(o.ref); st.Partial != 400 {
		t.Fatalf("partial kept: %+v", st)
	}
	p, _ = s.Create(o.ref)
	if p.Len() != 400 {
		t.Fatalf("reopened partial len %d", p.Len())
	}
	if err := p.Append(make([]byte, 601)); !errors.Is(err, cas.ErrTooLarge) {
		t.Fatalf("append beyond size: %v", err)
	}
	_ = p.Append(o.data[400:])
	if err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := p.Append([]byte{1}); !errors.Is(err, cas.ErrClosed) {
		t.Fatalf("append after commit: %v", err)
	}
	wantContent(t, s, o)
	if _, err := s.Create(o.ref); !errors.Is(err, cas.ErrExists) {
		t.Fatalf("Create of stored object: %v", err)
	}
	r, err := s.Open(o.ref, 990)
	if err != nil {
		t.Fatal(err)
	}
	tail, _ := io.ReadAll(r)
	r.Close()
	if !bytes.Equal(tail, o.data[990:]) {
		t.Fatal("Open at offset")
	}
	q := newObject(100, 10)
	p, _ = s.Create(q.ref)
	_ = p.Append(q.data[:50])
	if n, err := s.PrunePartials(0); err != nil || n != 0 {
		t.Fatalf("pruned a held partial: %d %v", n, err)
	}
	_ = p.Close()
	if n, err := s.PrunePartials(time.Hour); err != nil || n != 0 {
		t.Fatalf("pruned a fresh partial: %d %v", n, err)
	}
	if n, err := s.PrunePartials(-time.Second); err != nil || n != 1 {
		t.Fatalf("prune: %d %v", n, err)
	}
	if st, _ := s.Stat(q.ref); st.Partial != 0 {
		t.Fatalf("pruned partial still there: %+v", st)
	}
	big := o.ref
	big.Size = 2 << 20
	if _, err := s.Create(big); !errors.Is(err, cas.ErrTooLarge) {
		t.Fatalf("Create above limit: %v", err)
	}
	if _, err := s.Open(newObject(5, 5).ref, 0); !errors.Is(err, cas.ErrNotFound) {
		t.Fatalf("Open absent: %v", err)
	}
}

func TestBandwidthPaces(t *testing.T) {
	bw := cas.NewBandwidth(8<<20, 64<<10)
	start := time.Now()
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 16; j++ {
				_ = bw.Wait(context.Background(), 16<<10)
			}
		}()
	}
	wg.Wait()
	// 1 MiB at 8 MiB/s with a 64 KiB burst takes at least ~117 ms.
	if el := time.Since(start); el < 100*time.Millisecond {
		t.Fatalf("1 MiB through an 8 MiB/s bucket took %v", el)
	}
	if cas.NewBandwidth(0, 0) != nil {
		t.Fatal("rate 0 is not unlimited")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := cas.NewBandwidth(1, 1).Wait(ctx, 100); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait with a cancelled ctx: %v", err)
	}
}

// answerAnyway answers NeedObjectsV1 from the server even when the
// caller's context already ended (a reply that raced a link change).
type answerAnyway struct{ srv *cas.Server }

func (a answerAnyway) NeedObjects(_ context.Context, m *wcas.NeedObjectsV1) (*wcas.MissingObjectsV1, error) {
	return a.srv.NeedObjects(context.Background(), m)
}

// TestUploadAllFailsWhenCtxEndsBeforeUpload: when ctx ends between the
// MissingObjectsV1 answer and the start of an upload, UploadAll reports
// the error instead of success (regression: it returned nil with the
// object never sent, and the agent then claimed it in the completion).
// The slot-or-ctx choice is random, so it is tried 32 times.
func TestUploadAllFailsWhenCtxEndsBeforeUpload(t *testing.T) {
	lease := wire.NewLeaseId()
	local, remote := newStore(t, 0), newStore(t, 0)
	a := newAuth()
	o := newObject(1000, 42)
	put(t, local, o)
	a.allow(lease, cas.AccessWrite|cas.AccessRead, o)
	srv := newServer(t, remote, a, nil)
	l := newMemLink(t, srv, memory.Options{})
	up := newUploader(t, local, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i := 0; i < 32; i++ {
		if err := up.UploadAll(ctx, l.agent, answerAnyway{srv}, lease, []wire.CasObjectRef{o.ref}); err == nil {
			t.Fatalf("try %d: UploadAll with an ended context reported success", i)
		}
	}
	if st, err := remote.Stat(o.ref); err != nil || st.Complete {
		t.Fatalf("object stored (%+v, %v) though no upload ran", st, err)
	}
}

// failingOpen is a content store whose Open fails, while failing is set,
// as an object store outage does (objstore.ErrUnavailable).
type failingOpen struct {
	cas.ContentStore
	failing atomic.Bool
}

func (f *failingOpen) Open(ref wire.CasObjectRef, off uint64) (io.ReadCloser, error) {
	if f.failing.Load() {
		return nil, fmt.Errorf("%w: s3store: connection refused", objstore.ErrUnavailable)
	}
	return f.ContentStore.Open(ref, off)
}

// TestDownloadStoreOutageIsRetryable (issue 27 item 4): a download while
// the content store fails is answered CasAborted (the agent retries it),
// not CasNotFound (on which it gives the payload up); an object that is
// not there is still NotFound, and the download works once the store is
// back.
func TestDownloadStoreOutageIsRetryable(t *testing.T) {
	ctx := ctxT(t)
	lease := wire.NewLeaseId()
	o, absent := newObject(64<<10, 21), newObject(1<<10, 22)
	remote := newStore(t, 0)
	put(t, remote, o)
	store := &failingOpen{ContentStore: remote}
	a := newAuth()
	a.allow(lease, cas.AccessRead, o, absent)
	srv := newServer(t, store, a, nil)
	l := newMemLink(t, srv, memory.Options{})

	store.failing.Store(true)
	wantOutcome(t, newDownloader(t, newStore(t, 0)).Fetch(ctx, l.agent, lease, o.ref), wcas.CasAborted)
	store.failing.Store(false)
	wantOutcome(t, newDownloader(t, newStore(t, 0)).Fetch(ctx, l.agent, lease, absent.ref), wcas.CasNotFound)
	if err := newDownloader(t, newStore(t, 0)).Fetch(ctx, l.agent, lease, o.ref); err != nil {
		t.Fatalf("download after the store recovered: %v", err)
	}
}
