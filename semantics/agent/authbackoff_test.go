package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"forgeyard.dev/transport/semantics"
)

// authErr stands for a proxy's 407 (backends/yamux/proxy's
// *AuthRequiredError has the same method).
type authErr struct{}

func (authErr) Error() string {
	return "proxy authentication required by proxy.corp:3128: the credentials in the proxy URL were refused"
}
func (authErr) AuthFailure() bool { return true }

// clockDialer records the (bubble) time of every dial and fails it with
// the error fail returns for that dial's index.
type clockDialer struct {
	mu     sync.Mutex
	times  []time.Time
	fail   func(i int) error
	want   int
	enough chan struct{} // closed at the want-th dial
}

func (d *clockDialer) Dial(ctx context.Context, addr string) (semantics.BackendConn, error) {
	d.mu.Lock()
	i := len(d.times)
	d.times = append(d.times, time.Now())
	if len(d.times) == d.want {
		close(d.enough)
	}
	d.mu.Unlock()
	return nil, d.fail(i)
}

func (d *clockDialer) gaps() []time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []time.Duration
	for i := 1; i < len(d.times); i++ {
		out = append(out, d.times[i].Sub(d.times[i-1]))
	}
	return out
}

func TestIsAuthFailure(t *testing.T) {
	if !IsAuthFailure(fmt.Errorf("tcp: %w", authErr{})) || IsAuthFailure(errors.New("proxy: 403")) || IsAuthFailure(nil) {
		t.Fatal("IsAuthFailure misclassifies")
	}
}

// TestAuthBackoffSchedule: the ceilings double from one minute to the
// one-hour ceiling.
func TestAuthBackoffSchedule(t *testing.T) {
	got := fmt.Sprint(AuthSchedule(Backoff{}, 9))
	if want := "[1m0s 2m0s 4m0s 8m0s 16m0s 32m0s 1h0m0s 1h0m0s 1h0m0s]"; got != want {
		t.Fatalf("schedule %s, want %s", got, want)
	}
	if AuthSchedule(Backoff{AuthMax: -1}, 3) != nil {
		t.Fatal("AuthMax < 0 must turn the schedule off")
	}
	if got := fmt.Sprint(AuthSchedule(Backoff{AuthMax: 3 * time.Minute}, 4)); got != "[1m0s 2m0s 3m0s 3m0s]" {
		t.Fatalf("clipped schedule %s", got)
	}
}

// TestAuthFailuresBackOffToLongCeiling runs the agent's reconnect loop on
// a fake clock (testing/synctest: the bubble's time advances only when
// every goroutine waits) against an endpoint whose every dial is refused
// for its credentials: the first AuthAfter rounds follow the ordinary
// schedule, then the waits double from 30–60 s to 30–60 min, so an hour
// holds a handful of failed logins instead of one per 30 s. A round that
// fails for another reason ends the run of authentication rounds.
func TestAuthFailuresBackOffToLongCeiling(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &clockDialer{want: 15, enough: make(chan struct{}), fail: func(i int) error {
			if i == 12 {
				return errors.New("tcp: dial tcp 10.0.0.1:443: connection refused") // not an auth failure
			}
			return fmt.Errorf("proxy: %w", authErr{})
		}}
		c := testConfig(t)
		c.SpoolDir = t.TempDir()
		c.Endpoints = []Endpoint{{Address: "relay.example:443", Dialer: d, Backend: "relay+yamux", Class: ClassRelay}}
		a, err := New(c)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- a.Run(ctx) }()
		// 15 dials: 3 on the ordinary schedule, then the long one. While
		// this goroutine waits, the bubble's clock jumps to the agent's
		// next timer.
		<-d.enough
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		_ = a.Close()

		g := d.gaps()
		ord := DefaultBackoffMax // the longest ordinary wait
		for i := 0; i < DefaultAuthBackoffAfter; i++ {
			if g[i] > ord {
				t.Fatalf("wait %d is %v: the first %d authentication rounds follow the ordinary backoff", i, g[i], DefaultAuthBackoffAfter)
			}
		}
		sched := AuthSchedule(Backoff{}, 12)
		for k := 0; DefaultAuthBackoffAfter+k < 12; k++ {
			w := g[DefaultAuthBackoffAfter+k]
			if w < sched[k]/2 || w > sched[k] {
				t.Fatalf("wait %d (authentication backoff %d) is %v, want %v–%v; all waits %v", DefaultAuthBackoffAfter+k, k+1, w, sched[k]/2, sched[k], g)
			}
		}
		// Dial 12 failed otherwise: the next wait is ordinary again, and
		// dial 13's auth failure starts a new count from one.
		if g[12] > ord || g[13] > ord {
			t.Fatalf("after a round without an authentication failure: waits %v, %v, want the ordinary backoff", g[12], g[13])
		}
		// The figure the issue asks about: logins in the first hour.
		start, n := d.times[0], 0
		for _, at := range d.times {
			if at.Sub(start) < time.Hour {
				n++
			}
		}
		// At most 10 (4 before the first long wait, the halves of 1+2+4+8+16
		// min put the 10th at ≥ 31.5 min and the 11th at ≥ 61.5 min).
		if n > 10 {
			t.Fatalf("%d failed logins in the first hour, want at most 10 (one per 30 s would be 120)", n)
		}
		st := a.Status()
		if st.LastDialError == "" || st.LastDialErrorAt.IsZero() || len(st.DialErrors) != 1 || st.DialErrors[0].Endpoint != "relay.example:443" ||
			!strings.Contains(st.LastDialError, "relay+yamux relay.example:443: proxy: proxy authentication required") {
			t.Fatalf("status without the last dial error: %+v", st)
		}
		t.Logf("waits: %v; %d dials in the first hour", g, n)
	})
}
