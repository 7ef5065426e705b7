package daemon

// recent remembers the values of the last capacity keys put, for state
// kept about finished attempts: a ring buffer of keys in insertion order
// (allocated once, capacity entries) and a map for lookups; putting a new
// key when full forgets the oldest. Its memory is fixed once full — per
// entry one key in the ring plus one map slot (key and value) — and does
// not churn (no re-sliced queue that re-allocates as it moves). Not safe
// for concurrent use: the daemon guards it with d.mu.
type recent[K comparable, V any] struct {
	m    map[K]V
	ring []K
	next int // the ring slot overwritten next once the ring is full
}

func newRecent[K comparable, V any](capacity int) *recent[K, V] {
	return &recent[K, V]{m: make(map[K]V), ring: make([]K, 0, capacity)}
}

// get returns the value remembered for k.
func (r *recent[K, V]) get(k K) (V, bool) {
	v, ok := r.m[k]
	return v, ok
}

// put remembers v for k; a key already remembered keeps its place in the
// order (its value is replaced).
func (r *recent[K, V]) put(k K, v V) {
	if _, ok := r.m[k]; !ok {
		if len(r.ring) < cap(r.ring) {
			r.ring = append(r.ring, k)
		} else {
			delete(r.m, r.ring[r.next])
			r.ring[r.next] = k
			r.next = (r.next + 1) % len(r.ring)
		}
	}
	r.m[k] = v
}

// len returns the number of keys remembered (at most the capacity).
func (r *recent[K, V]) len() int { return len(r.m) }
