package logs

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	wlogs "forgeyard.dev/transport/wire/logs"
)

// spool is the on-disk part of a Writer: append-only segment files
// "seg-<n>" in the attempt's directory, each a sequence of records in the
// sink format (header + data). A segment is deleted once every frame in it
// is acknowledged as durable and a newer segment exists. Guarded by the
// Writer's mutex.
//
// fsync policy: a segment is fsynced when it is sealed (rotated); records
// are otherwise left to the page cache. The spool bridges a slow or
// unreachable daemon, not a crash of the agent host (the attempt does not
// survive that either), so a per-record fsync would buy nothing.
type spool struct {
	dir     string
	segSize int64
	segs    []*segment
	nextID  int
	disk    int64 // bytes in segment files on disk
}

type segment struct {
	id   int
	f    *os.File
	size int64
	last uint64 // highest seq stored; 0 none
}

func newSpool(dir string, segSize int64) (*spool, error) {
	// A fresh directory: the writer does not recover an earlier process's
	// spool, so stale segments would only waste the cap.
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("logs: spool: %w", err)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("logs: spool: %w", err)
	}
	return &spool{dir: dir, segSize: segSize}, nil
}

// append stores one record and returns its segment and the offset of its
// data.
func (s *spool) append(seq uint64, kind wlogs.LogStreamKind, ts uint64, data []byte) (*segment, int64, error) {
	var cur *segment
	if n := len(s.segs); n > 0 && s.segs[n-1].size < s.segSize {
		cur = s.segs[n-1]
	} else {
		if n > 0 {
			// Sealed: flush it to disk (see the fsync policy).
			_ = s.segs[n-1].f.Sync()
		}
		f, err := os.OpenFile(filepath.Join(s.dir, "seg-"+strconv.Itoa(s.nextID)), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o640)
		if err != nil {
			return nil, 0, fmt.Errorf("logs: spool: %w", err)
		}
		cur = &segment{id: s.nextID, f: f}
		s.nextID++
		s.segs = append(s.segs, cur)
	}
	var h [recHeadSize]byte
	putRecHead(h[:], seq, kind, ts, len(data))
	if _, err := cur.f.WriteAt(h[:], cur.size); err != nil {
		return nil, 0, fmt.Errorf("logs: spool: %w", err)
	}
	off := cur.size + recHeadSize
	if _, err := cur.f.WriteAt(data, off); err != nil {
		return nil, 0, fmt.Errorf("logs: spool: %w", err)
	}
	n := int64(recHeadSize + len(data))
	cur.size += n
	s.disk += n
	cur.last = seq
	return cur, off, nil
}

// read returns n bytes of data at off in seg, into buf if it is large enough.
func (s *spool) read(seg *segment, off int64, n int, buf []byte) ([]byte, error) {
	if cap(buf) < n {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := seg.f.ReadAt(buf, off); err != nil {
		return nil, fmt.Errorf("logs: spool: %w", err)
	}
	return buf, nil
}

// release deletes the segments whose frames are all durable, except the
// newest (still being appended to).
func (s *spool) release(acked uint64) {
	i := 0
	for i < len(s.segs)-1 && s.segs[i].last <= acked {
		s.drop(s.segs[i])
		s.segs[i] = nil
		i++
	}
	s.segs = s.segs[i:]
}

func (s *spool) drop(seg *segment) {
	_ = seg.f.Close()
	_ = os.Remove(seg.f.Name())
	s.disk -= seg.size
}

// close deletes every segment and the directory.
func (s *spool) close() {
	for _, seg := range s.segs {
		s.drop(seg)
	}
	s.segs = nil
	_ = os.RemoveAll(s.dir)
}
