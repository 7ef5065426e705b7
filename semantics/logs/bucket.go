package logs

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"forgeyard.dev/transport/semantics/internal/pairkey"
	"forgeyard.dev/transport/semantics/internal/probe"
	"forgeyard.dev/transport/semantics/objstore"
	"forgeyard.dev/transport/wire"
	wlogs "forgeyard.dev/transport/wire/logs"
)

// BucketSink is the LogSink over an objstore.Bucket, for daemons that
// share their logs (HA on S3, docs/protocols/internal/logs.md "Shared
// sinks"). Every Sync writes the frames appended since the last one as one
// segment object
//
//	<Prefix><attempt>/<first seq, 20 digits>-<last seq, 20 digits>
//
// holding the same records as a FileSink data file. A segment is written
// whole or not at all, so the durable sequence is the end of the
// contiguous run of segments from seq 1, which every daemon sharing the
// bucket reads alike: an agent that moves to another daemon resumes its
// log there from Durable+1. Segments that overlap (a late Sync of the old
// daemon) are read once: readers skip records at or below the sequence
// already returned.
//
// Appends not yet synced live in memory (bounded by the Receiver's
// AckBytes between Syncs) and are forgotten by Forget or a restart, as the
// LogSink contract requires. Safe for concurrent use.
type BucketSink struct {
	b       objstore.Bucket
	prefix  string
	timeout time.Duration
	mu      sync.Mutex
	m       map[wire.JobAttemptId]*bucketLog
}

type bucketLog struct {
	attemptSeq        // sticky err: the attempt is re-read after Forget
	first      uint64 // seq of buf's first record
	buf        bytes.Buffer
}

// BucketSinkConfig configures a BucketSink.
type BucketSinkConfig struct {
	Bucket objstore.Bucket // required
	// Prefix is prepended to every key (e.g. "logs/"); "" for none.
	Prefix string
	// Timeout bounds one store operation; 0 means a minute.
	Timeout time.Duration
}

// NewBucketSink returns the sink of cfg.
func NewBucketSink(cfg BucketSinkConfig) (*BucketSink, error) {
	if cfg.Bucket == nil {
		return nil, fmt.Errorf("logs: BucketSinkConfig.Bucket is required")
	}
	s := &BucketSink{b: cfg.Bucket, prefix: cfg.Prefix, timeout: cfg.Timeout, m: map[wire.JobAttemptId]*bucketLog{}}
	positiveOr(&s.timeout, time.Minute)
	return s, nil
}

var (
	_ LogSink   = (*BucketSink)(nil)
	_ Syncer    = (*BucketSink)(nil)
	_ Forgetter = (*BucketSink)(nil)
)

func (s *BucketSink) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), s.timeout)
}

func (s *BucketSink) dir(a wire.JobAttemptId) string { return s.prefix + a.String() + "/" }

type logSegment struct {
	key         string
	first, last uint64
	size        int64
	modified    time.Time
}

// segments lists the attempt's segments in order.
func (s *BucketSink) segments(ctx context.Context, a wire.JobAttemptId) ([]logSegment, error) {
	dir := s.dir(a)
	var out []logSegment
	err := s.b.List(ctx, dir, func(in objstore.Info) error {
		first, last, ok := pairkey.Split(in.Key, dir)
		if !ok || first == 0 || last < first {
			return nil
		}
		out = append(out, logSegment{key: in.Key, first: first, last: last, size: in.Size, modified: in.Modified})
		return nil
	})
	return out, err
}

// contiguous returns the segments that make up the durable log from seq 1
// (keys sort by first seq) and its last sequence number.
func contiguous(segs []logSegment) ([]logSegment, uint64) {
	var use []logSegment
	var cur uint64
	for _, sg := range segs {
		if sg.first > cur+1 {
			break
		}
		if sg.last > cur {
			use = append(use, sg)
			cur = sg.last
		}
	}
	return use, cur
}

func (s *BucketSink) open(a wire.JobAttemptId) (*bucketLog, error) {
	s.mu.Lock()
	if l := s.m[a]; l != nil {
		s.mu.Unlock()
		return l, nil
	}
	s.mu.Unlock()
	ctx, cancel := s.ctx()
	defer cancel()
	segs, err := s.segments(ctx, a)
	if err != nil {
		return nil, fmt.Errorf("logs: bucket sink: %w", err)
	}
	_, dur := contiguous(segs)
	s.mu.Lock()
	defer s.mu.Unlock()
	if l := s.m[a]; l != nil { // opened concurrently
		return l, nil
	}
	l := &bucketLog{attemptSeq: attemptSeq{appended: dur, durable: dur}}
	s.m[a] = l
	return l, nil
}

// Append implements LogSink. It fails when seq is not the next one.
func (s *BucketSink) Append(a wire.JobAttemptId, seq uint64, kind wlogs.LogStreamKind, ts uint64, data []byte) error {
	return appendNext(s.open, a, "bucket sink", seq, func(l *bucketLog) error {
		if l.buf.Len() == 0 {
			l.first = seq
		}
		var h [recHeadSize]byte
		putRecHead(h[:], seq, kind, ts, len(data))
		l.buf.Write(h[:])
		l.buf.Write(data)
		return nil
	})
}

// Durable implements LogSink; 0 when the bucket cannot be listed.
func (s *BucketSink) Durable(a wire.JobAttemptId) uint64 {
	return durableOf(s.open, a)
}

// Sync implements Syncer: one segment object for the frames appended
// since the last Sync. A failed write keeps them buffered for the next.
func (s *BucketSink) Sync(a wire.JobAttemptId) error {
	return syncPending(s.open, a, func(l *bucketLog) error {
		key := fmt.Sprintf("%s%020d-%020d", s.dir(a), l.first, l.appended)
		ctx, cancel := s.ctx()
		defer cancel()
		if err := s.b.Put(ctx, key, bytes.NewReader(l.buf.Bytes()), int64(l.buf.Len())); err != nil {
			return fmt.Errorf("logs: bucket sink: %w", err)
		}
		l.durable = l.appended
		l.buf.Reset()
		return nil
	})
}

// Forget drops the attempt's unsynced appends and state (the segments
// stay).
func (s *BucketSink) Forget(a wire.JobAttemptId) error {
	s.mu.Lock()
	l := s.m[a]
	delete(s.m, a)
	s.mu.Unlock()
	if l != nil {
		l.mu.Lock()
		l.err = fmt.Errorf("logs: bucket sink: attempt %s forgotten", a)
		l.buf = bytes.Buffer{}
		l.mu.Unlock()
	}
	return nil
}

// ReadDurable calls fn for every durable record of the attempt, in order
// and once each, reading the segments. rec.Data is valid only during the
// call.
func (s *BucketSink) ReadDurable(a wire.JobAttemptId, fn func(rec Record) error) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	segs, err := s.segments(ctx, a)
	if err != nil {
		return err
	}
	use, _ := contiguous(segs)
	var cur uint64
	buf := make([]byte, wlogs.MaxLogChunk)
	for _, sg := range use {
		r, err := s.b.Get(ctx, sg.key, 0, -1)
		if err != nil {
			return err
		}
		err = readRecords(bufio.NewReaderSize(r, 64<<10), buf, func(rec Record) error {
			if rec.Seq <= cur {
				return nil // overlap with the previous segment
			}
			if rec.Seq != cur+1 {
				return fmt.Errorf("%w: logSegment %s: seq %d after %d", ErrCorruptSink, sg.key, rec.Seq, cur)
			}
			cur = rec.Seq
			return fn(rec)
		})
		r.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// readRecords parses records until EOF, for FileSink's data files and
// BucketSink's segments alike; buf holds MaxLogChunk bytes.
func readRecords(r io.Reader, buf []byte, fn func(Record) error) error {
	var h [recHeadSize]byte
	for {
		if _, err := io.ReadFull(r, h[:]); err == io.EOF {
			return nil
		} else if err != nil {
			return fmt.Errorf("%w: %v", ErrCorruptSink, err)
		}
		n := binary.LittleEndian.Uint32(h[17:])
		if n > wlogs.MaxLogChunk {
			return fmt.Errorf("%w: record of %d bytes", ErrCorruptSink, n)
		}
		if _, err := io.ReadFull(r, buf[:n]); err != nil {
			return fmt.Errorf("%w: %v", ErrCorruptSink, err)
		}
		rec := Record{Seq: binary.LittleEndian.Uint64(h[:]), Kind: wlogs.LogStreamKind(h[8]),
			TimestampMs: binary.LittleEndian.Uint64(h[9:]), Data: buf[:n]}
		if err := fn(rec); err != nil {
			return err
		}
	}
}

// AttemptLog describes one attempt's stored log, for retention.
type AttemptLog struct {
	Attempt wire.JobAttemptId
	// Bytes stored (all files or segments of the attempt).
	Bytes int64
	// Modified is the last write.
	Modified time.Time
}

// Collector is implemented by sinks whose logs retention may delete
// (FileSink and BucketSink).
type Collector interface {
	// Logs calls fn for every attempt with a stored log.
	Logs(fn func(AttemptLog) error) error
	// DeleteLog removes the attempt's stored log (and forgets its state).
	DeleteLog(a wire.JobAttemptId) error
}

var (
	_ Collector = (*BucketSink)(nil)
	_ Collector = (*FileSink)(nil)
)

// Logs implements Collector.
func (s *BucketSink) Logs(fn func(AttemptLog) error) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var cur *AttemptLog
	var stop error
	err := s.b.List(ctx, s.prefix, func(in objstore.Info) error {
		name, _, ok := strings.Cut(strings.TrimPrefix(in.Key, s.prefix), "/")
		if !ok {
			return nil
		}
		var a wire.JobAttemptId
		if a.UnmarshalText([]byte(name)) != nil {
			return nil
		}
		if cur != nil && cur.Attempt != a {
			if err := fn(*cur); err != nil {
				stop = err
				return err
			}
			cur = nil
		}
		if cur == nil {
			cur = &AttemptLog{Attempt: a}
		}
		cur.Bytes += in.Size
		if in.Modified.After(cur.Modified) {
			cur.Modified = in.Modified
		}
		return nil
	})
	if err != nil {
		return err
	}
	if cur != nil && stop == nil {
		return fn(*cur)
	}
	return nil
}

// DeleteLog implements Collector.
func (s *BucketSink) DeleteLog(a wire.JobAttemptId) error {
	_ = s.Forget(a)
	ctx, cancel := s.ctx()
	defer cancel()
	segs, err := s.segments(ctx, a)
	if err != nil {
		return err
	}
	for _, sg := range segs {
		if err := s.b.Delete(ctx, sg.key); err != nil {
			return err
		}
	}
	return nil
}

// Probe tests that the bucket takes a small object.
func (s *BucketSink) Probe() error {
	ctx, cancel := s.ctx()
	defer cancel()
	return probe.Bucket(ctx, s.b, s.prefix)
}
