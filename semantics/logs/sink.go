package logs

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"forgeyard.dev/transport/semantics/internal/atomicfile"
	"forgeyard.dev/transport/semantics/internal/probe"
	"forgeyard.dev/transport/wire"
	wlogs "forgeyard.dev/transport/wire/logs"
)

// LogSink stores the log frames a Receiver accepted. The Receiver
// serializes every call for one attempt (Append, Durable and, when the sink
// implements Syncer, Sync); calls for different attempts may run
// concurrently.
//
// Append is called with consecutive sequence numbers per attempt, starting
// at Durable(attempt)+1 the first time the Receiver sees the attempt; data
// is valid only during the call. After a restart the sink must report as
// durable only what it can return, and forget every append after that
// point, so that the agent's resend from Durable+1 neither duplicates nor
// skips a frame.
type LogSink interface {
	Append(attempt wire.JobAttemptId, seq uint64, kind wlogs.LogStreamKind, tsMs uint64, data []byte) error
	// Durable returns the highest sequence number stored durably for the
	// attempt (0: none). The Receiver acknowledges it to the agent, which
	// then deletes everything up to it from its spool.
	Durable(attempt wire.JobAttemptId) uint64
}

// Syncer is implemented by sinks that make appended frames durable on
// request. The Receiver calls Sync before it reads Durable to acknowledge:
// every AckBytes, every AckInterval while data is unacknowledged, at the
// end of a stream and for a LogsFinalizedV1. A sink without Syncer decides
// itself when Durable advances.
type Syncer interface {
	Sync(attempt wire.JobAttemptId) error
}

// Forgetter is implemented by sinks that hold per-attempt resources (open
// files, buffers). The Receiver calls Forget from Receiver.Forget, once the
// attempt ended, so a sink retains nothing per finished attempt; a later
// Append or Durable for the attempt starts again from what is durable.
type Forgetter interface {
	Forget(attempt wire.JobAttemptId) error
}

// Record is one stored log frame.
type Record struct {
	Seq         uint64
	Kind        wlogs.LogStreamKind
	TimestampMs uint64
	Data        []byte
}

// recHeadSize is the size of a record header in sink and spool files:
// seq u64 | kind u8 | timestamp_ms u64 | len u32, little endian.
const recHeadSize = 8 + 1 + 8 + 4

func putRecHead(b []byte, seq uint64, kind wlogs.LogStreamKind, ts uint64, n int) {
	binary.LittleEndian.PutUint64(b[0:], seq)
	b[8] = byte(kind)
	binary.LittleEndian.PutUint64(b[9:], ts)
	binary.LittleEndian.PutUint32(b[17:], uint32(n))
}

// ErrCorruptSink reports a sink file that does not parse.
var ErrCorruptSink = errors.New("logs: corrupt sink file")

// ---- MemorySink ----

// MemorySink is a LogSink in memory, for tests, demos and benchmarks. Sync
// makes everything appended durable; without Sync calls nothing is. It is
// safe for concurrent use. Its memory grows with the logs it stores.
type MemorySink struct {
	mu sync.Mutex
	m  map[wire.JobAttemptId]*memAttempt
	// Discard, when set before use, keeps no data (only sequence numbers
	// and byte counts), for throughput benchmarks.
	Discard bool
}

type memAttempt struct {
	recs     []Record
	appended uint64
	durable  uint64
	bytes    int64
}

func (s *MemorySink) get(a wire.JobAttemptId) *memAttempt {
	if s.m == nil {
		s.m = map[wire.JobAttemptId]*memAttempt{}
	}
	m := s.m[a]
	if m == nil {
		m = &memAttempt{}
		s.m[a] = m
	}
	return m
}

// Append implements LogSink. It fails when seq is not the next one.
func (s *MemorySink) Append(a wire.JobAttemptId, seq uint64, kind wlogs.LogStreamKind, ts uint64, data []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.get(a)
	if seq != m.appended+1 {
		return fmt.Errorf("logs: MemorySink: append seq %d after %d", seq, m.appended)
	}
	m.appended = seq
	m.bytes += int64(len(data))
	if !s.Discard {
		m.recs = append(m.recs, Record{Seq: seq, Kind: kind, TimestampMs: ts, Data: append([]byte(nil), data...)})
	}
	return nil
}

// Durable implements LogSink.
func (s *MemorySink) Durable(a wire.JobAttemptId) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.get(a).durable
}

// Sync implements Syncer: everything appended becomes durable.
func (s *MemorySink) Sync(a wire.JobAttemptId) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.get(a)
	m.durable = m.appended
	return nil
}

// Records returns copies of the attempt's stored records in order.
func (s *MemorySink) Records(a wire.JobAttemptId) []Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Record(nil), s.get(a).recs...)
}

// Bytes returns how many log bytes the attempt has appended.
func (s *MemorySink) Bytes(a wire.JobAttemptId) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.get(a).bytes
}

// ---- FileSink ----

// FileSinkOptions configures a FileSink.
type FileSinkOptions struct {
	// NoFsync skips fsync in Sync (the index is still replaced atomically).
	// Durability then only covers a process restart, not a host crash.
	NoFsync bool
}

// FileSink is the default LogSink: one data file per attempt,
// "<attempt>.log", a sequence of records `seq u64 | kind u8 |
// timestamp_ms u64 | len u32 | data` (little endian), and a small index
// "<attempt>.idx" holding the durable sequence number and the data file
// length it covers (plus a CRC-32). Sync flushes the data file, fsyncs it,
// then replaces the index atomically (write, fsync, rename). When an
// attempt is first used after a restart the data file is truncated to the
// indexed length, so appends that were never made durable are forgotten
// and the agent's resend fills them in exactly once.
//
// FileSink is safe for concurrent use; it keeps one open file per attempt
// until Forget or Close, and a 64 KiB write buffer (pooled) only while the
// attempt has appends not yet synced. It implements Forgetter:
// a Receiver forgets a finished attempt's file (the daemon does so at the
// attempt's completion or revocation), so open files and buffers are
// bounded by the attempts being logged, not by the attempts ever seen.
type FileSink struct {
	dir  string
	opts FileSinkOptions
	mu   sync.Mutex
	m    map[wire.JobAttemptId]*sinkFile
}

type sinkFile struct {
	attemptSeq // sticky err: an I/O error
	f          *os.File
	w          *bufio.Writer
	size       int64 // bytes written (including buffered)
	durOff     int64
}

// NewFileSink returns a sink storing files in dir, creating it if needed.
func NewFileSink(dir string, opts FileSinkOptions) (*FileSink, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("logs: file sink: %w", err)
	}
	return &FileSink{dir: dir, opts: opts, m: map[wire.JobAttemptId]*sinkFile{}}, nil
}

func (s *FileSink) paths(a wire.JobAttemptId) (data, idx string) {
	name := a.String()
	return filepath.Join(s.dir, name+".log"), filepath.Join(s.dir, name+".idx")
}

const idxSize = 8 + 8 + 4

func readIndex(path string) (seq uint64, off int64, err error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, err
	}
	if len(b) != idxSize || crc32.ChecksumIEEE(b[:16]) != binary.LittleEndian.Uint32(b[16:]) {
		return 0, 0, fmt.Errorf("%w: index %s", ErrCorruptSink, path)
	}
	return binary.LittleEndian.Uint64(b), int64(binary.LittleEndian.Uint64(b[8:])), nil
}

func (s *FileSink) open(a wire.JobAttemptId) (*sinkFile, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sf := s.m[a]; sf != nil {
		return sf, nil
	}
	data, idx := s.paths(a)
	seq, off, err := readIndex(idx)
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(data, os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, fmt.Errorf("logs: file sink: %w", err)
	}
	if err := f.Truncate(off); err != nil {
		f.Close()
		return nil, fmt.Errorf("logs: file sink: %w", err)
	}
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		f.Close()
		return nil, fmt.Errorf("logs: file sink: %w", err)
	}
	sf := &sinkFile{attemptSeq: attemptSeq{appended: seq, durable: seq}, f: f, size: off, durOff: off}
	s.m[a] = sf
	return sf, nil
}

// Append implements LogSink. It fails when seq is not the next one.
func (s *FileSink) Append(a wire.JobAttemptId, seq uint64, kind wlogs.LogStreamKind, ts uint64, data []byte) error {
	return appendNext(s.open, a, "file sink", seq, func(sf *sinkFile) error {
		if sf.w == nil {
			sf.w = sinkWriters.Get().(*bufio.Writer)
			sf.w.Reset(sf.f)
		}
		var h [recHeadSize]byte
		putRecHead(h[:], seq, kind, ts, len(data))
		if _, err := sf.w.Write(h[:]); err != nil {
			sf.err = err
			return err
		}
		if _, err := sf.w.Write(data); err != nil {
			sf.err = err
			return err
		}
		sf.size += int64(recHeadSize + len(data))
		return nil
	})
}

// Durable implements LogSink; it returns 0 when the attempt's files cannot
// be opened.
func (s *FileSink) Durable(a wire.JobAttemptId) uint64 {
	return durableOf(s.open, a)
}

// Sync implements Syncer (see the type's comment).
func (s *FileSink) Sync(a wire.JobAttemptId) error {
	return syncPending(s.open, a, func(sf *sinkFile) error {
		if err := sf.w.Flush(); err != nil {
			sf.err = err
			return err
		}
		sf.releaseWriter()
		if !s.opts.NoFsync {
			if err := sf.f.Sync(); err != nil {
				sf.err = err
				return err
			}
		}
		var b [idxSize]byte
		binary.LittleEndian.PutUint64(b[0:], sf.appended)
		binary.LittleEndian.PutUint64(b[8:], uint64(sf.size))
		binary.LittleEndian.PutUint32(b[16:], crc32.ChecksumIEEE(b[:16]))
		_, idx := s.paths(a)
		if err := writeFileAtomic(idx, b[:], !s.opts.NoFsync); err != nil {
			sf.err = err
			return err
		}
		sf.durable, sf.durOff = sf.appended, sf.size
		return nil
	})
}

func writeFileAtomic(path string, b []byte, fsync bool) error {
	if fsync {
		// File and directory fsynced around the rename (semantics/internal/atomicfile).
		return atomicfile.WriteFile(path, b, 0o640)
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil && fsync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Forget closes the attempt's files (they stay on disk). Appends that were
// not synced are lost, as after a restart.
func (s *FileSink) Forget(a wire.JobAttemptId) error {
	s.mu.Lock()
	sf := s.m[a]
	delete(s.m, a)
	s.mu.Unlock()
	if sf == nil {
		return nil
	}
	sf.mu.Lock()
	defer sf.mu.Unlock()
	if sf.err == nil {
		sf.err = os.ErrClosed // a caller still holding sf fails instead of writing to a closed file
	}
	sf.releaseWriter()
	return sf.f.Close()
}

// sinkWriters pools the FileSink's 64 KiB write buffers: an attempt holds
// one only from its first unsynced Append to the next Sync, so idle and
// finished attempts hold none.
var sinkWriters = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 64<<10) }}

// releaseWriter returns sf's (flushed or abandoned) write buffer to the
// pool; under sf.mu.
func (sf *sinkFile) releaseWriter() {
	if sf.w != nil {
		sf.w.Reset(nil)
		sinkWriters.Put(sf.w)
		sf.w = nil
	}
}

// Close closes every open file, as Forget for each attempt.
func (s *FileSink) Close() error {
	s.mu.Lock()
	var as []wire.JobAttemptId
	for a := range s.m {
		as = append(as, a)
	}
	s.mu.Unlock()
	var first error
	for _, a := range as {
		if err := s.Forget(a); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// ReadDurable calls fn for every durable record of the attempt, in order,
// reading the files (not the unsynced buffer). rec.Data is valid only
// during the call. A record longer than MaxLogChunk or a truncated record
// inside the durable length fails with ErrCorruptSink.
func (s *FileSink) ReadDurable(a wire.JobAttemptId, fn func(rec Record) error) error {
	data, idx := s.paths(a)
	_, off, err := readIndex(idx)
	if err != nil {
		return err
	}
	f, err := os.Open(data)
	if errors.Is(err, os.ErrNotExist) && off == 0 {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	r := bufio.NewReaderSize(io.LimitReader(f, off), 64<<10)
	return readRecords(r, make([]byte, wlogs.MaxLogChunk), fn)
}

// Logs implements Collector: one AttemptLog per "<attempt>.log" file (its
// index counted in Bytes).
func (s *FileSink) Logs(fn func(AttemptLog) error) error {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".log")
		if !ok || e.IsDir() {
			continue
		}
		var a wire.JobAttemptId
		if a.UnmarshalText([]byte(name)) != nil {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue // removed meanwhile
		}
		al := AttemptLog{Attempt: a, Bytes: fi.Size(), Modified: fi.ModTime()}
		if ii, err := os.Stat(filepath.Join(s.dir, name+".idx")); err == nil {
			al.Bytes += ii.Size()
			if ii.ModTime().After(al.Modified) {
				al.Modified = ii.ModTime()
			}
		}
		if err := fn(al); err != nil {
			return err
		}
	}
	return nil
}

// DeleteLog implements Collector: it forgets the attempt and removes its
// files.
func (s *FileSink) DeleteLog(a wire.JobAttemptId) error {
	_ = s.Forget(a)
	data, idx := s.paths(a)
	for _, p := range []string{idx, data} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// Probe tests that the sink's directory takes a small synced file (a
// daemon probes a sink that failed, to notice its recovery).
func (s *FileSink) Probe() error { return probe.Dir(s.dir) }
