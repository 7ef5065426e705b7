package rawkit

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
)

func TestDialNRetriesThenReportsFirstFailure(t *testing.T) {
	var calls atomic.Int64
	err := DialN(context.Background(), 4, 2, "connection", func(i int) error {
		calls.Add(1)
		if i == 2 {
			return errors.New("refused")
		}
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "rawbench: connection 2: refused") {
		t.Fatalf("err = %v", err)
	}
	if got := calls.Load(); got < MaxTries+2 {
		t.Errorf("%d dials, want at least %d (connection 2 tried %d times)", got, MaxTries+2, MaxTries)
	}
}

func TestHeld(t *testing.T) {
	var h Held[int]
	h.Add(1)
	h.Add(2)
	var closed []int
	err := h.CloseAll(func(c int) error {
		closed = append(closed, c)
		return nil
	})
	if err != nil || len(closed) != 2 || h.Len() != 0 {
		t.Fatalf("CloseAll: %v, closed %v, %d left", err, closed, h.Len())
	}
}
