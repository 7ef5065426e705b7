package semantics

import (
	"testing"
	"time"
)

// TestUrgentSet: writes in progress beyond the inline slots go to the map,
// which is dropped once empty; youngerThan sees every one of them.
func TestUrgentSet(t *testing.T) {
	var u urgentSet
	now := time.Now()
	old := now.Add(-time.Hour)
	for tok := uint64(1); tok <= 6; tok++ {
		u.add(tok, old)
	}
	if u.youngerThan(time.Minute) {
		t.Fatal("only hour-old writes, yet one is younger than a minute")
	}
	u.add(7, now) // the young one lands in the map
	if !u.youngerThan(time.Minute) {
		t.Fatal("the young write in the overflow map is not seen")
	}
	u.remove(7)
	if u.youngerThan(time.Minute) {
		t.Fatal("removed write still seen")
	}
	u.remove(2) // frees an inline slot
	u.add(8, now)
	if !u.youngerThan(time.Minute) {
		t.Fatal("the young write in a freed inline slot is not seen")
	}
	for _, tok := range []uint64{1, 3, 4, 5, 6, 8} {
		u.remove(tok)
	}
	if u.more != nil || u.inline != ([4]urgentWrite{}) {
		t.Fatalf("empty set still holds %v / %v", u.inline, u.more)
	}
}
