package pairkey

import "testing"

func TestSplit(t *testing.T) {
	for _, c := range []struct {
		key  string
		a, b uint64
		ok   bool
	}{
		{"d/00000000000000000012-34", 12, 34, true},
		{"d/1-2", 1, 2, true},
		{"d/12", 0, 0, false},
		{"d/x-2", 0, 2, false},
		{"d/1-", 1, 0, false},
		{"d/1-2-3", 1, 0, false},
		{"d/-1-2", 0, 0, false},
	} {
		a, b, ok := Split(c.key, "d/")
		if ok != c.ok || ok && (a != c.a || b != c.b) {
			t.Errorf("Split(%q) = %d, %d, %v", c.key, a, b, ok)
		}
	}
}
