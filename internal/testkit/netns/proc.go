//go:build linux

package netns

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// maxLines bounds the output lines a Proc keeps (later lines are counted
// and dropped).
const maxLines = 200000

// Proc is a process started in a namespace with Start. Its combined
// stdout and stderr are kept line by line for WaitLine and Lines.
type Proc struct {
	// Name labels the process in test logs.
	Name string

	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited and its output is read
	err  error         // Wait's result, after done

	mu      sync.Mutex
	lines   []string
	dropped int
	notify  chan struct{} // closed and replaced on every new line
}

// Start runs bin with args inside the namespace (through `ip netns exec`,
// which execs bin, so the pid is bin's) with env added to the test
// process's environment. The process is stopped (SIGTERM, then SIGKILL)
// when the namespace is destroyed, if it still runs; a test that fails
// logs the last lines of its output.
func (n *NS) Start(name, bin string, args []string, env ...string) *Proc {
	n.t.Helper()
	return n.StartIn("", name, bin, args, env...)
}

// StartIn is Start with dir as the working directory ("" for the test's),
// for commands whose relative paths are part of what is tested (a
// documented command line run as written).
func (n *NS) StartIn(dir, name, bin string, args []string, env ...string) *Proc {
	n.t.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", n.Name, bin}, args...)...)
	cmd.Dir = dir
	p, err := start(n.t, name, cmd, env)
	if err != nil {
		n.t.Fatalf("netns %s: starting %s: %v", n.Role, name, err)
	}
	n.mu.Lock()
	n.procs = append(n.procs, p)
	n.mu.Unlock()
	return p
}

// StartHost runs bin with args in the test's own network namespace (for
// scenarios on loopback that need no namespace of their own, e.g. with
// servers such as internal/testkit/pgtest and internal/testkit/s3test that listen on the
// host's loopback), otherwise like NS.Start: env is added to the
// environment, output is kept line by line, and the process is stopped
// (SIGTERM, then SIGKILL) when the test ends, if it still runs.
func StartHost(t testing.TB, name, bin string, args []string, env ...string) *Proc {
	t.Helper()
	p, err := start(t, name, exec.Command(bin, args...), env)
	if err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	t.Cleanup(func() { _ = p.Stop(5 * time.Second) })
	return p
}

func start(t testing.TB, name string, cmd *exec.Cmd, env []string) (*Proc, error) {
	cmd.Env = append(os.Environ(), env...)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	p := &Proc{Name: name, cmd: cmd, done: make(chan struct{}), notify: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			p.add(sc.Text())
		}
		_, _ = io.Copy(io.Discard, pr) // an over-long line: keep draining
	}()
	go func() {
		err := cmd.Wait()
		_ = pw.Close()
		<-read
		p.err = err
		close(p.done)
	}()
	t.Cleanup(func() {
		if t.Failed() {
			lines := p.Lines()
			t.Logf("--- last output of %s (%d lines) ---\n%s", name, len(lines), strings.Join(lines[max(0, len(lines)-60):], "\n"))
		}
	})
	return p, nil
}

func (p *Proc) add(line string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.lines) >= maxLines {
		p.dropped++
		return
	}
	p.lines = append(p.lines, line)
	close(p.notify)
	p.notify = make(chan struct{})
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Lines returns a copy of the output lines so far.
func (p *Proc) Lines() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.lines...)
}

// WaitLine waits until an output line satisfies match (lines already
// printed count) and returns it. It fails when ctx ends or the process
// exits first.
func (p *Proc) WaitLine(ctx context.Context, match func(line string) bool) (string, error) {
	seen := 0
	for {
		p.mu.Lock()
		lines, notify := p.lines[seen:], p.notify
		seen = len(p.lines)
		p.mu.Unlock()
		for _, l := range lines {
			if match(l) {
				return l, nil
			}
		}
		select {
		case <-notify:
		case <-p.done:
			// Output is fully read once done: one last look.
			p.mu.Lock()
			lines = p.lines[seen:]
			p.mu.Unlock()
			for _, l := range lines {
				if match(l) {
					return l, nil
				}
			}
			return "", fmt.Errorf("%s exited (%v) before the awaited line", p.Name, p.err)
		case <-ctx.Done():
			return "", fmt.Errorf("%s: awaited line not printed: %w", p.Name, ctx.Err())
		}
	}
}

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Signal sends sig to the process.
func (p *Proc) Signal(sig syscall.Signal) error {
	select {
	case <-p.done:
		return os.ErrProcessDone
	default:
	}
	return p.cmd.Process.Signal(sig)
}

// Kill sends SIGKILL and waits for the exit.
func (p *Proc) Kill() {
	_ = p.Signal(syscall.SIGKILL)
	<-p.done
}

// Stop sends SIGTERM, waits up to grace for the exit, then SIGKILLs.
// It returns the process's exit error (nil for status 0).
func (p *Proc) Stop(grace time.Duration) error {
	_ = p.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		p.Kill()
	}
	return p.err
}
