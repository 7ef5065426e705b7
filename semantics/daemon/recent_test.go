package daemon

import "testing"

// TestRecentBounded: recent keeps exactly the last capacity keys, forgets
// the oldest first, keeps a re-put key's place, and never grows its ring.
func TestRecentBounded(t *testing.T) {
	r := newRecent[int, string](4)
	for i := 0; i < 4; i++ {
		r.put(i, "v")
	}
	r.put(1, "w") // already there: value replaced, order kept
	if v, ok := r.get(1); !ok || v != "w" || r.len() != 4 {
		t.Fatalf("get(1) = %q %v, len %d", v, ok, r.len())
	}
	for i := 4; i < 10; i++ {
		r.put(i, "v")
		if r.len() != 4 || cap(r.ring) != 4 {
			t.Fatalf("after %d puts: len %d, ring cap %d", i+1, r.len(), cap(r.ring))
		}
	}
	for i := 0; i < 10; i++ {
		if _, ok := r.get(i); ok != (i >= 6) {
			t.Fatalf("key %d remembered %v after 10 puts into 4 slots", i, ok)
		}
	}
}
