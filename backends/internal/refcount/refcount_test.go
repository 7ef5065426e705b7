package refcount

import "testing"

func TestLastReleaseCloses(t *testing.T) {
	u := New()
	if !u.Acquire() {
		t.Fatal("Acquire on a live count failed")
	}
	if u.Release() || u.Closed() {
		t.Fatal("first of two releases reported last")
	}
	if !u.Release() || !u.Closed() {
		t.Fatal("last release did not report last")
	}
	if u.Acquire() || u.AcquireOwned() {
		t.Fatal("Acquire after close succeeded")
	}
}

func TestDisown(t *testing.T) {
	u := New()
	if !u.AcquireOwned() {
		t.Fatal("AcquireOwned with the owner there failed")
	}
	if !u.Disown() || u.Disown() {
		t.Fatal("Disown must report true once")
	}
	if u.AcquireOwned() {
		t.Fatal("AcquireOwned after Disown succeeded")
	}
	if !u.Acquire() {
		t.Fatal("Acquire after Disown (not closed) failed")
	}
}
