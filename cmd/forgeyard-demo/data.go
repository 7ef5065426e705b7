package main

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"strings"
	"sync"

	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/logs"
	"forgeyard.dev/transport/wire"
	wlogs "forgeyard.dev/transport/wire/logs"
)

// The demo's data plane: every lease carries one shared payload (a "source
// bundle" the agents download through CAS and verify), every attempt
// streams its log and uploads its output before completing, one attempt's
// log is tailed live, and one big output upload is cut halfway and resumed.

// bigSpec marks the attempt whose output is large enough to be cut
// mid-upload.
var bigSpec = wire.JobSpecId{Digest: sha256.Sum256([]byte("forgeyard-demo: the attempt with a big output"))}

const (
	bigOutputSize = 8 << 20
	payloadSize   = 256 << 10
	tailMaxLines  = 12
)

// demoPayload is the payload bundle every lease names.
func demoPayload() []byte {
	var b bytes.Buffer
	for i := 0; b.Len() < payloadSize; i++ {
		fmt.Fprintf(&b, "src/module%04d.go: package module%04d // forgeyard demo payload\n", i, i)
	}
	return b.Bytes()[:payloadSize]
}

func refOf(data []byte) wire.CasObjectRef {
	return wire.CasObjectRef{Algorithm: wire.DigestSHA256, Digest: sha256.Sum256(data), Size: uint64(len(data))}
}

// putObject stores data in s (a no-op when it is there already).
func putObject(s cas.ContentStore, data []byte) (wire.CasObjectRef, error) {
	ref := refOf(data)
	if st, err := s.Stat(ref); err == nil && st.Complete {
		return ref, nil
	}
	p, err := s.Create(ref)
	if err != nil {
		return ref, err
	}
	if err := p.Append(data[p.Len():]); err != nil {
		_ = p.Abort()
		return ref, err
	}
	return ref, p.Commit()
}

// tailSink is the daemon's FileSink that also prints the frames of one
// attempt as they become durable at the daemon: a live log tail.
type tailSink struct {
	*logs.FileSink
	mu      sync.Mutex
	attempt wire.JobAttemptId
	out     io.Writer
	lines   int
	elided  bool   // "…" printed for lines not shown
	notify  func() // called (without t.mu) after lines of the followed attempt arrived
}

func (t *tailSink) follow(a wire.JobAttemptId, agentName string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.attempt = a
	if t.out != nil {
		fmt.Fprintf(t.out, "• live log of attempt %s on agent %s (each line printed when it is durable at the daemon):\n", a, agentName)
	}
}

func (t *tailSink) Append(a wire.JobAttemptId, seq uint64, kind wlogs.LogStreamKind, tsMs uint64, data []byte) error {
	if err := t.FileSink.Append(a, seq, kind, tsMs, data); err != nil {
		return err
	}
	t.mu.Lock()
	if a != t.attempt {
		t.mu.Unlock()
		return nil
	}
	t.printLocked(seq, kind, data)
	t.mu.Unlock()
	if t.notify != nil {
		t.notify()
	}
	return nil
}

func (t *tailSink) printLocked(seq uint64, kind wlogs.LogStreamKind, data []byte) {
	for _, line := range strings.SplitAfter(string(data), "\n") {
		if line == "" {
			continue
		}
		t.lines++
		// The first lines, and every stderr line (the executor's answer
		// to the cancel comes whenever the cancel arrives).
		if t.out != nil && (t.lines <= tailMaxLines || kind == wlogs.LogStderr) {
			if t.lines > tailMaxLines && !t.elided {
				t.elided = true
				fmt.Fprintln(t.out, "    │ …")
			}
			fmt.Fprintf(t.out, "    │ #%d %-6s %s", seq, kind, line)
			if !strings.HasSuffix(line, "\n") {
				fmt.Fprintln(t.out)
			}
		}
	}
}

// Lines reports how many lines of the followed attempt were received.
func (t *tailSink) Lines() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.lines
}

// cutStore is the daemon's content store; when the big output's upload has
// stored half of the object it calls cut once (the agent's path is severed
// mid-transfer, the daemon keeps the verified prefix for the resume).
type cutStore struct {
	cas.ContentStore
	big  wire.CasObjectRef
	cut  func()
	once sync.Once
	mu   sync.Mutex
	at   uint64 // prefix length when the cut fired
}

func (s *cutStore) Create(ref wire.CasObjectRef) (cas.PartialObject, error) {
	p, err := s.ContentStore.Create(ref)
	if err != nil || ref != s.big {
		return p, err
	}
	return &cutPartial{PartialObject: p, s: s}, nil
}

func (s *cutStore) cutAt() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.at
}

type cutPartial struct {
	cas.PartialObject
	s *cutStore
}

func (p *cutPartial) Append(b []byte) error {
	if err := p.PartialObject.Append(b); err != nil {
		return err
	}
	if n := p.Len(); n >= p.s.big.Size/2 {
		p.s.once.Do(func() {
			p.s.mu.Lock()
			p.s.at = n
			p.s.mu.Unlock()
			p.s.cut()
		})
	}
	return nil
}

// bigOutput is the big attempt's output.
func bigOutput() []byte { return agent.SyntheticOutput(bigSpec, bigOutputSize) }

// dataReport is the data plane's part of the summary.
type dataReport struct {
	LogFrames, LogBytes int64 // appended by the daemon's log receiver
	TailLines           int   // lines of the tailed attempt received live
	Uploads             int64 // outputs uploaded and verified by the daemon
	Deduplicated        int64 // outputs the daemon already held (no bytes sent)
	Claimed, Stored     int   // outputs claimed in OutputsFinalized / present in the store
	Downloads           int64 // payload downloads served by the daemon
	PayloadsVerified    int64 // attempts that started with a verified payload
	PayloadsFailed      int64
	CutAt               uint64 // prefix of the big output when its path was cut
	Resumed             int64  // uploads that continued a kept prefix
	ResumedPrefix       int64  // bytes not re-sent thanks to it
	BigStored           bool   // the big output is in the store, verified
	Failure             string
}

func collectData(d interface {
	LogReceiver() *logs.Receiver
	CASServer() *cas.Server
	FinalizedOutputs(wire.JobAttemptId) ([]wire.CasObjectRef, bool)
}, store *cutStore, tail *tailSink, agents []*demoAgent, st *state) dataReport {
	var r dataReport
	ls := d.LogReceiver().Stats()
	r.LogFrames, r.LogBytes = ls.FramesAppended, ls.BytesAppended
	r.TailLines = tail.Lines()
	cs := d.CASServer().Stats()
	r.Uploads, r.Deduplicated, r.Downloads = cs.UploadsVerified, cs.DeduplicatedUploads, cs.DownloadsServed
	r.Resumed, r.ResumedPrefix = cs.ResumedUploads, cs.ResumedPrefixBytes
	r.CutAt = store.cutAt()
	for _, da := range agents {
		s := da.a.Stats()
		r.PayloadsVerified += s.PayloadsFetched
		r.PayloadsFailed += s.PayloadsFailed
	}
	st.mu.Lock()
	attempts := make([]wire.JobAttemptId, 0, len(st.accepted))
	for a := range st.accepted {
		attempts = append(attempts, a)
	}
	st.mu.Unlock()
	for _, a := range attempts {
		outs, _ := d.FinalizedOutputs(a)
		for _, ref := range outs {
			r.Claimed++
			if s, err := store.Stat(ref); err == nil && s.Complete {
				r.Stored++
			}
		}
	}
	if s, err := store.Stat(store.big); err == nil && s.Complete {
		r.BigStored = true
	}
	switch {
	case r.LogFrames == 0:
		r.Failure = "no log frame reached the daemon"
	case r.TailLines < 5:
		r.Failure = fmt.Sprintf("the tailed attempt showed %d lines", r.TailLines)
	case r.Claimed == 0 || r.Stored != r.Claimed:
		r.Failure = fmt.Sprintf("%d of %d claimed outputs are in the daemon's store", r.Stored, r.Claimed)
	case r.PayloadsFailed > 0 || r.PayloadsVerified == 0 || r.Downloads == 0:
		r.Failure = fmt.Sprintf("payloads: %d verified, %d failed, %d downloads", r.PayloadsVerified, r.PayloadsFailed, r.Downloads)
	case r.CutAt == 0 || r.Resumed == 0 || !r.BigStored:
		r.Failure = fmt.Sprintf("the big output's cut upload did not resume (cut at %d, %d resumed, stored %v)", r.CutAt, r.Resumed, r.BigStored)
	}
	return r
}
