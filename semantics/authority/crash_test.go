package authority_test

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/pgtest"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/wire"
)

// Crash durability (issue 15 item 3): a child process (this test binary,
// re-executed) runs a lease workload — create, accept, renew, complete — with
// many concurrent callers against one store and prints every completion the
// authority acknowledged. The parent SIGKILLs it at a random point, many
// times against the same database, and after every kill checks:
//
//   - every acknowledged completion is present, with its message id, and
//     a retry of it is answered DuplicateAccepted (exactly once);
//   - the epochs of the agent session, re-registered by every run, only grow.
//
// FORGEYARD_CRASH_SEED repeats a run's kill delays; FORGEYARD_CRASH_KILLS sets how many
// kills (default 20 per store). SIGKILL tests the process dying at any
// instruction; a power loss (what synchronous=FULL is for) cannot be
// produced here.

const crashEnv = "FORGEYARD_CRASH_CHILD"

// crashChild is the child's workload; TestMain runs it instead of the tests
// when crashEnv is set. Output lines: "epoch N", then "ack ATTEMPT MSG LEASE".
func crashChild() {
	ctx := context.Background()
	var a authority.Authority
	var err error
	target := os.Getenv(crashEnv)
	if path, ok := strings.CutPrefix(target, "sqlite:"); ok {
		a, err = authority.OpenSQLite(ctx, path)
	} else {
		a, err = authority.OpenPostgres(ctx, strings.TrimPrefix(target, "postgres:"))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		os.Exit(2)
	}
	runner, session := parseIDs(os.Getenv("FORGEYARD_CRASH_IDS"))
	now := time.Now()
	g, err := a.RegisterSession(ctx, authority.Registration{Runner: runner, Session: session, Transport: wire.NewTransportSessionId(), Now: now})
	if err != nil {
		fmt.Fprintln(os.Stderr, "register:", err)
		os.Exit(2)
	}
	fmt.Fprintf(os.Stdout, "epoch %d\n", g.Epoch)
	ref := authority.SessionRef{Session: session, Epoch: g.Epoch}
	var mu sync.Mutex // one line per write
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				l := authority.Lease{ID: wire.NewLeaseId(), Attempt: wire.NewJobAttemptId(), Job: wire.NewJobId(), Runner: runner,
					Session: session, TTL: time.Hour, ExpiresAt: now.Add(time.Hour), CreatedAt: now}
				if err := a.CreateLease(ctx, l); err != nil {
					fail(err)
				}
				if _, err := a.AcceptLease(ctx, l.ID, l.Attempt, ref, now); err != nil {
					fail(err)
				}
				if _, err := a.RenewLease(ctx, wire.NewMessageId(), l.ID, l.Attempt, ref, now); err != nil {
					fail(err)
				}
				msg := wire.NewMessageId()
				ack, err := a.CompleteAttempt(ctx, authority.Completion{MessageID: msg, Attempt: l.Attempt, Lease: l.ID, Session: ref,
					Result: []byte("ok"), Now: now})
				if err != nil || ack != authority.AckAccepted {
					fail(fmt.Errorf("complete: %v, %v", ack, err))
				}
				mu.Lock()
				fmt.Fprintf(os.Stdout, "ack %x %x %x\n", l.Attempt.ULID[:], msg.ULID[:], l.ID.ULID[:])
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "workload:", err)
	os.Exit(2)
}

func parseIDs(s string) (wire.RunnerId, wire.AgentSessionId) {
	var r wire.RunnerId
	var sess wire.AgentSessionId
	b, _ := hex.DecodeString(s)
	copy(r.ULID[:], b[:16])
	copy(sess.ULID[:], b[16:])
	return r, sess
}

type acked struct {
	attempt wire.JobAttemptId
	msg     wire.MessageId
	lease   wire.LeaseId
}

func parseAck(line string) (acked, bool) {
	f := strings.Fields(line)
	if len(f) != 4 || f[0] != "ack" {
		return acked{}, false
	}
	var a acked
	for i, dst := range [][]byte{a.attempt.ULID[:], a.msg.ULID[:], a.lease.ULID[:]} {
		b, err := hex.DecodeString(f[i+1])
		if err != nil || len(b) != 16 {
			return acked{}, false
		}
		copy(dst, b)
	}
	return a, true
}

// crashRun starts a child, lets it work for d (after its first
// acknowledged completion), SIGKILLs it, and returns its epoch and the
// completions it printed.
func crashRun(t *testing.T, target, ids string, d time.Duration) (uint64, []acked) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), crashEnv+"="+target, "FORGEYARD_CRASH_IDS="+ids)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var epoch uint64
	var acks []acked
	first := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		once := sync.Once{}
		for sc.Scan() {
			line := sc.Text()
			if e, ok := strings.CutPrefix(line, "epoch "); ok {
				epoch, _ = strconv.ParseUint(e, 10, 64)
				continue
			}
			if a, ok := parseAck(line); ok {
				acks = append(acks, a)
				once.Do(func() { close(first) })
			}
		}
	}()
	select {
	case <-first:
	case <-done:
		_ = cmd.Wait()
		t.Fatalf("child ended before any completion: %s", stderr.String())
	case <-time.After(2 * time.Minute):
		_ = cmd.Process.Kill()
		t.Fatalf("child made no completion in 2 minutes: %s", stderr.String())
	}
	time.Sleep(d) // the random point of the kill, not synchronisation
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-done
	err = cmd.Wait()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child did not die of SIGKILL: %v; stderr: %s", err, stderr.String())
	}
	return epoch, acks
}

func TestCrashDurability(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("FORGEYARD_CRASH_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	kills := 20
	if s := os.Getenv("FORGEYARD_CRASH_KILLS"); s != "" {
		kills, _ = strconv.Atoi(s)
	}
	t.Logf("seed %d (FORGEYARD_CRASH_SEED=%d go test ./semantics/authority -run TestCrashDurability repeats the kill delays)", seed, seed)
	for _, st := range []string{"sqlite", "postgres"} {
		t.Run(st, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 1))
			var target string
			var open func() authority.Authority
			if st == "sqlite" {
				path := filepath.Join(t.TempDir(), "authority.db")
				target = "sqlite:" + path
				open = func() authority.Authority { return openSQLite(t, path) }
			} else {
				dsn := pgtest.Shared(t).NewDatabase(t)
				target = "postgres:" + dsn
				open = func() authority.Authority {
					a, err := authority.OpenPostgres(context.Background(), dsn)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { a.Close() })
					return a
				}
			}
			runner, session := wire.NewRunnerId(), wire.NewAgentSessionId()
			ids := hex.EncodeToString(append(runner.ULID[:], session.ULID[:]...))
			var all []acked
			var lastEpoch uint64
			for k := 0; k < kills; k++ {
				d := time.Duration(rng.IntN(300)) * time.Millisecond
				epoch, acks := crashRun(t, target, ids, d)
				if epoch <= lastEpoch {
					t.Fatalf("kill %d: epoch %d after %d: not monotonic", k, epoch, lastEpoch)
				}
				lastEpoch = epoch
				all = append(all, acks...)
				// After the restart: every acknowledged completion is there,
				// once, under its message id.
				a := open()
				ctx := context.Background()
				g, err := a.RegisterSession(ctx, authority.Registration{Runner: runner, Session: session, Transport: wire.NewTransportSessionId(), Now: time.Now()})
				if err != nil || g.Epoch <= lastEpoch {
					t.Fatalf("kill %d: re-register = %d, %v; want an epoch above %d", k, g.Epoch, err, lastEpoch)
				}
				lastEpoch = g.Epoch
				ref := authority.SessionRef{Session: session, Epoch: g.Epoch}
				for _, c := range all {
					if n, err := a.Completions(ctx, c.attempt); err != nil || n != 1 {
						t.Fatalf("kill %d: acknowledged completion of %s: %d recorded, %v", k, c.attempt, n, err)
					}
				}
				for _, c := range acks {
					ack, err := a.CompleteAttempt(ctx, authority.Completion{MessageID: c.msg, Attempt: c.attempt, Lease: c.lease, Session: ref, Now: time.Now()})
					if err != nil || ack != authority.AckDuplicateAccepted {
						t.Fatalf("kill %d: retry of the acknowledged completion of %s = %v, %v; want DuplicateAccepted", k, c.attempt, ack, err)
					}
				}
				if err := a.Close(); err != nil {
					t.Fatal(err)
				}
			}
			if len(all) == 0 {
				t.Fatal("no completion acknowledged in any run")
			}
			t.Logf("%d kills, %d acknowledged completions checked, last epoch %d", kills, len(all), lastEpoch)
		})
	}
}
