package retention_test

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/cas/castest"
	"forgeyard.dev/transport/semantics/objstore"
	"forgeyard.dev/transport/semantics/retention"
	"forgeyard.dev/transport/wire"
)

// TestPagerPagesThroughTheStore (issue 27 item 4): over a real directory
// (a BucketStore on objstore.Dir, and an FSStore) holding 1000 objects, a
// Pager with a page of 64 lists at most 64 objects per run, and within
// one cycle (at most ceil(1000/64)+1 runs) every expired object is
// deleted while the live ones and those younger than max_age are all
// still there; the next cycle lists only what is left and deletes nothing.
func TestPagerPagesThroughTheStore(t *testing.T) {
	for _, kind := range []string{"bucket-on-dir", "fsstore"} {
		t.Run(kind, func(t *testing.T) {
			root := t.TempDir()
			var c store
			var objPath func(ref wire.CasObjectRef) string
			switch kind {
			case "bucket-on-dir":
				b, err := objstore.NewDir(root)
				if err != nil {
					t.Fatal(err)
				}
				b.NoFsync = true
				bs, err := cas.NewBucketStore(cas.BucketStoreConfig{Bucket: b, Prefix: "cas/"})
				if err != nil {
					t.Fatal(err)
				}
				c = bs
				objPath = func(ref wire.CasObjectRef) string {
					h := ref.Digest.String()
					return filepath.Join(root, "cas", "objects", "sha256", h[:2], h+"-"+itoa(ref.Size))
				}
			case "fsstore":
				fs, err := cas.NewFSStore(cas.FSStoreConfig{Dir: root})
				if err != nil {
					t.Fatal(err)
				}
				c = fs
				objPath = func(ref wire.CasObjectRef) string {
					h := ref.Digest.String()
					return filepath.Join(root, "objects", "sha256", h[:2], h)
				}
			}
			const n, page = 1000, 64
			now := time.Now()
			live := map[wire.CasObjectRef]bool{}
			young := map[wire.CasObjectRef]bool{}
			var all []wire.CasObjectRef
			for i := range n {
				data := make([]byte, 16)
				binary.BigEndian.PutUint64(data, uint64(i))
				ref := castest.Put(t, c, data)
				all = append(all, ref)
				switch i % 4 {
				case 0:
					live[ref] = true
				case 1:
					young[ref] = true
					// Stored after the collection's "now" minus max_age.
					if err := os.Chtimes(objPath(ref), now.Add(2*time.Hour), now.Add(2*time.Hour)); err != nil {
						t.Fatal(err)
					}
				}
			}
			liveSet := func(context.Context) (retention.Live, error) {
				return retention.Live{Objects: live}, nil
			}
			pol := retention.Policy{MaxAge: 30 * time.Minute}
			pg := &retention.Pager{PageSize: page}
			runs, deleted := 0, 0
			maxRuns := (n+page-1)/page + 1
			for pg.Cycles() == 0 {
				if runs++; runs > maxRuns {
					t.Fatalf("no full cycle within %d runs", maxRuns)
				}
				res, err := pg.Collect(context.Background(), nil, c, pol, liveSet, now.Add(time.Hour))
				if err != nil {
					t.Fatal(err)
				}
				if res.ListedObjects > page {
					t.Fatalf("run %d listed %d objects, page is %d", runs, res.ListedObjects, page)
				}
				deleted += res.DeletedObjs
			}
			t.Logf("%d runs for one cycle over %d objects", runs, n)
			for _, ref := range all {
				keep := live[ref] || young[ref]
				if hasObj(c, ref) != keep {
					t.Fatalf("after one cycle object %v present %v, want %v (live %v, young %v)", ref, hasObj(c, ref), keep, live[ref], young[ref])
				}
			}
			if want := n / 2; deleted != want {
				t.Fatalf("deleted %d objects, want %d", deleted, want)
			}
			// The next cycle lists the 500 kept objects and deletes none.
			listed := 0
			for pg.Cycles() == 1 {
				res, err := pg.Collect(context.Background(), nil, c, pol, liveSet, now.Add(time.Hour))
				if err != nil {
					t.Fatal(err)
				}
				if res.ListedObjects > page || res.DeletedObjs != 0 {
					t.Fatalf("second cycle: %+v", res)
				}
				listed += res.ListedObjects
				if pg.Cycles() == 2 && res.CASBytes != int64(16*n/2) {
					t.Fatalf("held bytes after the second cycle %d, want %d", res.CASBytes, 16*n/2)
				}
			}
			if listed != n/2 {
				t.Fatalf("second cycle listed %d objects, want %d", listed, n/2)
			}
		})
	}
}

func itoa(v uint64) string { return strconv.FormatUint(v, 10) }
